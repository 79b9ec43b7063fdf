"""The triggerer renews the lease (``contract.lease``) of every run it waits on, batched per bucket.

A trigger waiting on a run registers it in ``LEASES`` (instance -> run folder, ``orphan_timeout``)
for as long as it waits, as it does in ``run_index.LOG_EVERY``. Each poll of a bucket's live index
(``run_index.LiveIndex``, one per bucket and triggerer) hands the runs it watches to its
``LeaseBook``, which writes the leases that are due (each run at most every
``renew_interval_s(orphan_timeout)``: one small PUT per run per 5 minutes at the default 30 minutes)
in a thread of its own, one round at a time, through the index's storage client: never on the event
loop, never delaying the poll that notices ends. At 1,000 deferred runs that is about 3.3 writes a
second (``benchmarks/triggerer_scale.py``, docs/benchmarks.md).

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
        self._round: Future[None] | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="cloudtrain-leases")

    def due(self, ids: Iterable[str], now: float) -> list[tuple[str, str, float]]:
        """(instance, lease key in this bucket, timeout) of the watched runs whose renewal is due."""
        out = []
        with self._lock:
            for iid in ids:
                entry = LEASES.get(iid)
                if entry is None:
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
        """Write the due leases in the writer thread, unless the last round is still writing (its
        runs are due again at the next poll). Never blocks, never raises."""
        if self._round is not None and not self._round.done():
            return
        due = self.due(ids, time.time() if now is None else now)
        if due:
            with contextlib.suppress(RuntimeError):  # shut down: the group is closing
                self._round = self._executor.submit(self._write, due)

    def _write(self, due: list[tuple[str, str, float]]) -> None:
        failed: BaseException | None = None
        for iid, key, timeout in due:
            now = time.time()
            try:
                self.put(key, Lease(renewed_at=now, orphan_timeout_s=timeout, by=BY).to_json().encode())
            except Exception as err:  # retried at the next poll
                failed = err
                continue
            with self._lock:
                self.renewed[iid] = now
                self.writes += 1
        if failed is not None:
            log.warning("Could not renew some runs' leases (retrying at the next poll): %s", failed)

    def forget(self, instance_id: str) -> None:
        with self._lock:
            self.renewed.pop(instance_id, None)

    def wait_round(self, timeout: float = 60.0) -> None:
        """Tests and the benchmark: until the round under way wrote its leases."""
        round_ = self._round
        if round_ is not None:
            round_.result(timeout)

    def close(self) -> None:
        self._executor.shutdown(wait=False)
