"""The lease between a run and whoever watches it: a run nobody wants any more ends itself.

Whoever waits for a run (the blocking loop on a worker, the triggerer's shared poll, a fleet's watch,
the Vertex wait) renews the run's lease in its run folder::

    lease.json      watcher: Lease (renewed_at, orphan_timeout_s, by), rewritten at most every
                    ``renew_interval_s(orphan_timeout_s)`` seconds
    orphaned.json   agent (or ``cloudtrain gc``): Orphaned, written once when it ends a run whose
                    lease lapsed: what ``cloudtrain runs`` shows

The agent (or, for groups, the group's workers; for Vertex jobs, ``cloudtrain gc``) reads the lease
and ends the run (job stopped, checkpoint and logs synced, instance released) once ``lapsed(now)``.
A run without a lease file was started by a release without leases, or its first renewal is still to
come: ``lapsed`` counts from the run's start then (``started_at``), so a watcher that never renewed at
all still ends the run.

Why one small object per run, rewritten every few minutes, rather than one per bucket per poll: the
agent reads only its own run's key (no listing, no parsing of 1,000 other runs' entries), and a
watcher's renewals stay cheap: at the default 30 minutes, one write per run per 5 minutes.

Stdlib only: the agent imports it on the instance.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

LEASE_KEY = "lease.json"
ORPHANED_KEY = "orphaned.json"
DEFAULT_ORPHAN_TIMEOUT_S = 30 * 60.0
MAX_RENEW_INTERVAL_S = 300.0  # one write per run per 5 minutes at most, whatever the timeout
RENEW_FRACTION = 3  # renewed at least 3 times per timeout: two lost writes in a row do not orphan a run
MIN_POLLS_PER_TIMEOUT = 3  # orphan_timeout must cover at least this many poll intervals


def renew_interval_s(orphan_timeout_s: float) -> float:
    """How often a watcher rewrites the lease: a third of the timeout, at most 5 minutes."""
    return min(MAX_RENEW_INTERVAL_S, float(orphan_timeout_s) / RENEW_FRACTION)


@dataclass(frozen=True)
class Lease:
    """The last renewal of a run's lease.

    ``orphan_timeout_s`` None: the run has no lease (``orphan_timeout=None``): it never lapses, and
    the run depends on ``max_runtime`` alone. ``by`` names the watcher (``worker``, ``triggerer``,
    ``fleet``, ``vertex``), for the logs and ``cloudtrain gc``."""

    renewed_at: float
    orphan_timeout_s: float | None
    by: str = ""

    def lapses_at(self) -> float | None:
        if self.orphan_timeout_s is None:
            return None
        return self.renewed_at + float(self.orphan_timeout_s)

    def lapsed(self, now: float) -> bool:
        at = self.lapses_at()
        return at is not None and now >= at

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Lease:
        """The lease, or ValueError on text that is not one (a torn or foreign write)."""
        try:
            data = json.loads(text)
            timeout = data.get("orphan_timeout_s")
            return cls(
                renewed_at=float(data["renewed_at"]),
                orphan_timeout_s=None if timeout is None else float(timeout),
                by=str(data.get("by") or ""),
            )
        except (TypeError, KeyError, AttributeError, json.JSONDecodeError) as err:
            raise ValueError(f"not a lease record: {err}") from err


def lapsed(lease: Lease | None, started_at: float, orphan_timeout_s: float | None, now: float) -> bool:
    """Whether a run is orphaned at ``now``: its lease lapsed, or (no lease written yet) its own
    ``orphan_timeout_s`` has passed since it started. None turns the rule off."""
    if lease is not None:
        return lease.lapsed(now)
    return orphan_timeout_s is not None and now >= started_at + float(orphan_timeout_s)


@dataclass(frozen=True)
class Orphaned:
    """Written once by whoever ended an orphaned run: when its lease lapsed, and who noticed."""

    lapsed_at: float
    ended_by: str  # "agent", "worker", "gc"
    noticed_at: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Orphaned:
        try:
            data = json.loads(text)
            return cls(float(data["lapsed_at"]), str(data["ended_by"]), float(data["noticed_at"]))
        except (TypeError, KeyError, AttributeError, json.JSONDecodeError) as err:
            raise ValueError(f"not an orphaned record: {err}") from err


MAX_CHECK_INTERVAL_S = 60.0  # the agent reads the lease at least once a minute
CHECK_FRACTION = 6  # ... and at least 6 times per timeout: it ends a run within 1/6 past the lapse


def check_interval_s(orphan_timeout_s: float) -> float:
    """How often the agent reads the lease: a sixth of the timeout, at most a minute (one GET)."""
    return min(MAX_CHECK_INTERVAL_S, float(orphan_timeout_s) / CHECK_FRACTION)


def lapsed_at(lease: Lease | None, started_at: float, orphan_timeout_s: float | None) -> float | None:
    """When the run's lease lapsed (or lapses): ``lapsed``'s rule as a time; None when it never does."""
    if lease is not None:
        return lease.lapses_at()
    return None if orphan_timeout_s is None else started_at + float(orphan_timeout_s)


def orphaned_message(last_renewed: float | None, orphan_timeout_s: float | None) -> str:
    """The final status message of a run its agent ended for a lapsed lease."""
    import time

    timeout = f"{float(orphan_timeout_s):g} s" if orphan_timeout_s is not None else "the orphan_timeout"
    if last_renewed is None:
        return f"orphaned: no watcher wrote the run's lease within orphan_timeout ({timeout}) of its start"
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(last_renewed))
    return f"orphaned: no watcher renewed the lease since {when} (orphan_timeout {timeout})"
