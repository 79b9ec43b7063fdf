"""The agent's entry in the bucket's live index (``runs.live_index_uri``): its ``runs.Beacon``.

With ``RunSpec.live_uri`` set, the agent writes ``<live_uri>/<instance-id>.json`` (``runs.beacon_name``)
on every status change and after every log flush that uploaded chunks, ``<instance-id>.beat``
(``runs.beat_name``, its unix time) on every heartbeat; then, once, after the final ``status.json``:
the final beacon and ``ended/<instance-id>.json`` (``runs.end_name``, the final ``RunStatus``), the
run's very last write, in a folder of its own that a triggerer lists every couple of seconds. One
triggerer watches a thousand runs by listing the live index each poll interval: the beat's
LastModified (S3) / ``updated`` (GCS) is the heartbeat, the beacon's ETag / md5 tells whether
anything changed. The heartbeat is its own object so that a beat is never taken for a change (an
SSE-KMS bucket gives every PUT a new ETag), never rewrites the 64 KiB beacon (a versioned bucket
keeps every overwrite) and never races a beacon write (GCS takes about one write per second per
object). The heartbeat file of the run folder is then not written.

Ordering: each beacon is built under one lock from the current status and log state, so the beacons
written never go back (an older status read by one thread cannot land after a newer one). Only the
final beacon carries a final status, and once it is being written no other beacon follows it (the
heartbeat thread may still beat).
A failed non-final write is only logged (or raised to the chore that logs it): the next change, or
the next beat, writes it again. The final beacon and the end marker are written by the runner through
``agent.retry.retry``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict

from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.storage import RunFolder

log = logging.getLogger("cloudtrain.agent")

# (log_seq, tail_from, tail) of the log so far: ``LogStreamer.snapshot``
LogState = Callable[[], tuple[int, int, str]]


def no_log() -> tuple[int, int, str]:
    return 0, 0, ""


class BeaconWriter:
    """Writes one instance's beacon (and, at the end, its end marker) to the live index ``index``.

    ``status`` and ``logs`` are read at each write, under the writer's lock: the current
    ``RunStatus`` (``StatusWriter.status``) and the log's ``(log_seq, tail_from, tail)``.
    """

    def __init__(
        self,
        index: RunFolder,
        instance_id: str,
        status: Callable[[], runs.RunStatus],
        logs: LogState = no_log,
    ) -> None:
        self.index = index
        self.instance_id = instance_id
        self.status = status
        self.logs = logs
        self.final = False  # the final beacon is being (or was) written: nothing else after it
        self.written = 0  # beacons written (tests, logs)
        self.stale = True  # the last publish failed (or none yet): the next beat publishes too
        self._lock = threading.Lock()

    @property
    def key(self) -> str:
        return runs.beacon_name(self.instance_id)

    @property
    def end_key(self) -> str:
        return runs.end_name(self.instance_id)

    def beacon(self, status: runs.RunStatus | None = None) -> runs.Beacon:
        """The beacon of now (of ``status`` instead of the current one, if given)."""
        log_seq, tail_from, tail = self.logs()
        current = status if status is not None else self.status()
        # without the checkpoint history: a beacon is rewritten on every log flush and read on every
        # poll, and only the timeline (which reads status.json) wants it
        fields = {k: v for k, v in asdict(current).items() if k != "checkpoint_history"}
        return runs.Beacon(self.instance_id, fields, log_seq, tail_from, tail)

    def publish(self, raise_errors: bool = False) -> bool:
        """Write the current beacon; whether it wrote. Nothing once the status is final: the final
        beacon is ``publish_final``'s (after the final status.json), and nothing follows it. A failure
        is logged, or raised with ``raise_errors`` (for a chore, which logs it once per kind)."""
        with self._lock:
            status = self.status()
            if self.final or status.final:
                return False
            try:
                self.index.put_bytes(self.key, self.beacon(status).to_bytes())
            except Exception as err:
                self.stale = True
                if raise_errors:
                    raise
                log.warning("beacon write failed (%s: %s); the next one carries it", type(err).__name__, err)
                return False
            self.written += 1
            self.stale = False
            return True

    def beat(self) -> None:
        """Heartbeat: ``<instance-id>.beat`` with the agent's time (its LastModified is what the
        triggerer lists). A beacon whose last write failed is written again first. Raises when a
        write fails (the heartbeat chore logs it). Nothing once the final beacon is under way."""
        if self.stale:
            self.publish(raise_errors=True)
        with self._lock:
            if self.final:
                return
            self.index.put_text(runs.beat_name(self.instance_id), f"{time.time():.3f}")

    def publish_final(self, status: runs.RunStatus) -> None:
        """Write the final beacon (``status`` final, the whole log); raises on failure, so the caller
        can retry it. No non-final beacon is written from the moment this is called."""
        if not status.final:
            raise ValueError(f"not a final status: {status.state}")
        with self._lock:
            self.final = True
            self.index.put_bytes(self.key, self.beacon(status).to_bytes())
            self.written += 1

    def write_end(self, status: runs.RunStatus) -> None:
        """The end marker, after the final beacon: the final status, the run's last write."""
        if not self.final:
            raise RuntimeError("the end marker goes after the final beacon")
        self.index.put_text(self.end_key, status.to_json())
