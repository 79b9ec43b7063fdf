"""The watchers' side of a run's lease (``contract.lease``): one renewer, used by every wait.

Every wait of the family (the blocking ``RunAttempt.wait`` and a gang's, the resume loop's pauses,
the fleet watch, the Vertex wait) holds a ``LeaseRenewer`` and calls ``renew()`` on each poll: it
writes ``lease.json`` at most every ``renew_interval_s(orphan_timeout_s)`` (a third of the timeout,
at most 5 minutes), so a wait that polls every 10 s costs one small write per 5 minutes. The
operator calls ``renew(force=True)`` right before a launch: a task killed before its first poll
still leaves a lease, whose lapse ends the run.

A failed write is logged and retried at the next poll (never raised): renewals come three times per
timeout, so one lost write does not orphan a run, and a storage outage must not fail a healthy run's
wait. The triggerer renews through its own batched path (``triggers.run_index``), with the same
record and the same interval.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from airflow_cloudtrain.contract.lease import LEASE_KEY, ORPHANED_KEY, Lease, Orphaned, renew_interval_s

if TYPE_CHECKING:
    from airflow_cloudtrain.storage import RunFolder

log = logging.getLogger(__name__)


class LeaseRenewer:
    """Rewrites one run folder's ``lease.json`` (``by`` names the watcher) when due.

    ``orphan_timeout_s`` None: the run has no lease, ``renew`` writes nothing. Safe to share between
    threads: one renewal at a time, so an older lease never lands over a newer one (two writes racing
    to the store end with whichever finishes last) and a renewal just made is not made again."""

    def __init__(
        self,
        folder: Callable[[], RunFolder] | RunFolder,
        orphan_timeout_s: float | None,
        by: str,
        logger: logging.Logger | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._folder = folder
        self.orphan_timeout_s = orphan_timeout_s
        self.by = by
        self.log = logger or log
        self.clock = clock
        self.renewed_at: float | None = None  # the last successful write
        self.writes = 0
        self._failing = False
        self._renewing = threading.Lock()

    def folder(self) -> RunFolder:
        return self._folder() if callable(self._folder) else self._folder

    def due(self, now: float | None = None) -> bool:
        if self.orphan_timeout_s is None:
            return False
        now = self.clock() if now is None else now
        return self.renewed_at is None or now - self.renewed_at >= renew_interval_s(self.orphan_timeout_s)

    def renew(self, force: bool = False) -> bool:
        """Write the lease when due (``force``: now); whether it was written. Never raises."""
        if self.orphan_timeout_s is None:
            return False
        with self._renewing:
            return self._renew(force)

    def _renew(self, force: bool) -> bool:
        if not (force or self.due()):
            return False
        now = self.clock()
        record = Lease(renewed_at=now, orphan_timeout_s=self.orphan_timeout_s, by=self.by)
        try:
            self.folder().put_text(LEASE_KEY, record.to_json())
        except Exception as err:
            if not self._failing:  # once per outage, not once per poll
                self.log.warning("Could not renew the run's lease (retrying at the next poll): %s", err)
            self._failing = True
            return False
        self._failing = False
        self.renewed_at = now
        self.writes += 1
        return True


def read_orphaned(folder: RunFolder) -> Orphaned | None:
    """The run folder's ``orphaned.json``: the run's agent (or ``cloudtrain gc``) ended it for a
    lapsed lease. None when there is none or it cannot be read (it only informs)."""
    try:
        text = folder.get_text(ORPHANED_KEY)
        return Orphaned.from_json(text) if text else None
    except Exception:
        return None


def say_orphaned(folder: RunFolder, logger: logging.Logger) -> Orphaned | None:
    """A retry or an adopting task finding an orphaned run says so in the task log."""
    found = read_orphaned(folder)
    if found is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(found.lapsed_at))
        logger.warning(
            "This run was orphaned: its lease lapsed at %s (no watcher renewed it within orphan_timeout) "
            "and the %s ended it",
            when,
            found.ended_by,
        )
    return found
