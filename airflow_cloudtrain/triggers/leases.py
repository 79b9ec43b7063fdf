"""The triggerer renews the lease (``contract.lease``) of every run it waits on, batched per bucket.

A trigger waiting on a run registers it in ``LEASES`` (instance -> run folder, ``orphan_timeout``)
for as long as it waits, as it does in ``run_index.LOG_EVERY``. Each poll of a bucket's live index
(``run_index.LiveIndex``, one per bucket and triggerer) hands the runs it watches to its
``LeaseBook``, which writes the leases that are due (each run at most every
``renew_interval_s(orphan_timeout)``: one small PUT per run per 5 minutes at the default 30 minutes)
on ``WRITERS`` threads of its own (a run's write is never queued twice), through the index's storage
client: never on the event loop, never delaying the poll that notices ends. At 1,000 deferred runs
that is about 3.3 writes a second, plus one write per run when a triggerer (re)starts and picks the
runs up (``benchmarks/triggerer_scale.py``, docs/benchmarks.md).

A triggerer that restarts renews every run it picks up in its first round; one that stays down
longer than ``orphan_timeout`` lets the runs end themselves, which is the point. A failed write is
retried at the next poll (renewals come three times per timeout).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from airflow_cloudtrain.contract.lease import LEASE_KEY, Lease, renew_interval_s
from airflow_cloudtrain.contract.runs import join, split_uri

log = logging.getLogger(__name__)

BY = "triggerer"
WRITERS = 4  # a triggerer picking up 1,000 runs renews them all at once: a few PUTs side by side
FAILURE_LOG_S = 60.0  # a failing store is logged at most this often
# instance -> (run folder URI, orphan_timeout_s): set by a trigger while it waits on that run
LEASES: dict[str, tuple[str, float]] = {}


class LeaseBook:
    """One live index's renewals: when this group last wrote each run's lease, and the writer thread.

    :param scheme: the index's scheme (``s3``/``gs``); :param bucket: its bucket: a run folder
        elsewhere cannot be written through this client (its trigger renews it itself).
    :param put: ``(key, bytes)`` writer of the index's bucket (the index's storage client).
    """

    def __init__(self, scheme: str, bucket: str, put: Callable[[str, bytes], None]) -> None:
        self.scheme, self.bucket, self.put = scheme, bucket, put
        self.renewed: dict[str, float] = {}  # instance -> when this group last wrote its lease
        self.writes = 0  # lease writes made (the benchmark counts them)
        self._lock = threading.Lock()
        self._inflight: dict[str, Future[None]] = {}  # instance -> its queued or running write
        self._failed_logged = 0.0
        self._executor = ThreadPoolExecutor(WRITERS, thread_name_prefix="cloudtrain-leases")

    def due(self, ids: Iterable[str], now: float) -> list[tuple[str, str, float]]:
        """(instance, lease key in this bucket, timeout) of the watched runs whose renewal is due."""
        out = []
        with self._lock:
            for iid in ids:
                entry = LEASES.get(iid)
                if entry is None or iid in self._inflight:
                    continue
                run_uri, timeout = entry
                last = self.renewed.get(iid)
                if last is not None and now - last < renew_interval_s(timeout):
                    continue
                try:
                    scheme, bucket, key = split_uri(join(run_uri, LEASE_KEY))
                except ValueError:
                    continue
                if (scheme, bucket) == (self.scheme, self.bucket):
                    out.append((iid, key, timeout))
        return out

    def start_round(self, ids: Iterable[str], now: float | None = None) -> None:
        """Queue the due leases' writes for the writer threads (a run whose write is still queued
        is not queued again). Never blocks, never raises."""
        for iid, key, timeout in self.due(ids, time.time() if now is None else now):
            with self._lock, contextlib.suppress(RuntimeError):  # shut down: the group is closing
                self._inflight[iid] = self._executor.submit(self._write, iid, key, timeout)

    def _write(self, iid: str, key: str, timeout: float) -> None:
        now = time.time()
        try:
            self.put(key, Lease(renewed_at=now, orphan_timeout_s=timeout, by=BY).to_json().encode())
        except Exception as err:  # retried at the next poll
            if now - self._failed_logged >= FAILURE_LOG_S:
                self._failed_logged = now
                log.warning("Could not renew runs' leases (retrying at the next poll): %s", err)
            with self._lock:
                self._inflight.pop(iid, None)
            return
        with self._lock:
            self.renewed[iid] = now
            self.writes += 1
            self._inflight.pop(iid, None)

    def forget(self, instance_id: str) -> None:
        with self._lock:
            self.renewed.pop(instance_id, None)

    def wait_round(self, timeout: float = 60.0) -> None:
        """Tests: until the writes queued so far are done."""
        with self._lock:
            pending = list(self._inflight.values())
        for future in pending:
            future.result(timeout)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)  # queued renewals: the next group
