"""The agent's side of the run's lease (``contract.lease``): a run nobody watches ends itself.

Every ``check_interval_s`` (a sixth of ``orphan_timeout_s``, at most a minute) the agent reads the
run folder's ``lease.json`` (one GET). Only a lease that is there and lapsed, or one never written
for ``orphan_timeout_s`` since the agent started, ends the run: a read error (throttling, an outage
of the store) is not a lapse, and neither is a torn record (the next read decides). The agent then
writes ``orphaned.json`` once and stops the job as ``max_runtime`` does (grace, checkpoint synced,
logs uploaded, final status naming the lapsed lease, power-off).

A gang's nodes all read the same lease, so all of them stop; a fleet's workers read their fleet's
(``agent.worker``) and leave the group.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from airflow_cloudtrain.contract.lease import (
    LEASE_KEY,
    ORPHANED_KEY,
    Lease,
    Orphaned,
    check_interval_s,
    lapsed,
    lapsed_at,
    orphaned_message,
)
from airflow_cloudtrain.storage import RunFolder

log = logging.getLogger("cloudtrain.agent")


class LeaseWatch:
    """Decides, from the run folder's lease, whether the run is orphaned.

    :param folder: the run folder (a fleet's, for its workers).
    :param orphan_timeout_s: the spec's; None: never orphaned (``orphan_timeout=None``).
    :param started_at: when the agent started: the lapse of a lease never written counts from it.
    """

    def __init__(
        self,
        folder: RunFolder,
        orphan_timeout_s: float | None,
        started_at: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.folder = folder
        self.orphan_timeout_s = orphan_timeout_s
        self.started_at = started_at
        self.clock = clock
        self.lease: Lease | None = None  # the last one read
        self.read_error: str | None = None

    @property
    def interval_s(self) -> float | None:
        """How often to check; None: no lease to watch."""
        return None if self.orphan_timeout_s is None else check_interval_s(self.orphan_timeout_s)

    def check(self) -> str | None:
        """The final status message when the run is orphaned now, else None. One GET; never raises."""
        if self.orphan_timeout_s is None:
            return None
        try:
            text = self.folder.get_text(LEASE_KEY)
            lease = Lease.from_json(text) if text else None
        except Exception as err:  # unreadable now: not a lapse; the next check decides
            self.read_error = f"{type(err).__name__}: {err}"
            return None
        self.read_error = None
        self.lease = lease
        now = self.clock()
        if not lapsed(lease, self.started_at, self.orphan_timeout_s, now):
            return None
        return orphaned_message(
            lease.renewed_at if lease else None, lease_timeout(lease, self.orphan_timeout_s)
        )

    def record(self, ended_by: str = "agent") -> None:
        """Write ``orphaned.json`` (what ``cloudtrain runs`` shows); best effort, a few tries."""
        at = lapsed_at(self.lease, self.started_at, self.orphan_timeout_s) or self.clock()
        record = Orphaned(lapsed_at=at, ended_by=ended_by, noticed_at=self.clock())
        for attempt in range(3):
            try:
                self.folder.put_text(ORPHANED_KEY, record.to_json())
                return
            except Exception as err:
                log.warning("could not write %s (%s: %s)", ORPHANED_KEY, type(err).__name__, err)
                time.sleep(1.0 + attempt)


def lease_timeout(lease: Lease | None, spec_timeout_s: float | None) -> float | None:
    """The timeout that lapsed: the lease's own (a watcher may renew with another), else the spec's."""
    return lease.orphan_timeout_s if lease is not None else spec_timeout_s
