"""What ``cloudtrain gc`` found and what it does with it: the lease states, the decision table, and
the leftover record. Below ``lifecycle.gc`` (the sweep) and ``lifecycle.gc_running`` (the running
index's stale entries, one of the kinds it lists), which both decide with it."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_cloudtrain.core.backend import RunBackend
    from airflow_cloudtrain.core.ledger import LedgerBackend

LIVE, LAPSED, FINISHED, UNKNOWN = "live", "lapsed", "finished", "unknown"
DELETE, KEEP = "delete", "keep"


@dataclass
class RunView:
    """What the run folder says about a run: its lease state, why, and when its lease lapsed."""

    lease: str
    why: str
    lapsed_at: float | None = None  # set when ``gc`` may record ``orphaned.json`` for it


@dataclass
class Source:
    """One backend ``gc`` lists through: ``key`` names its listers (``aws``, ``gcp``, ``vertex``)."""

    key: str
    backend: LedgerBackend  # a RunBackend, or VertexJobs for "vertex" (each kind's deleter takes its own)
    folders: RunBackend  # whose clients read the run folders


@dataclass
class Leftover:
    """One resource of the provider, with the run's lease state and what ``gc`` does with it."""

    kind: str
    id: str
    location: str | None
    digest: str | None
    run_uri: str | None
    age_s: float | None
    state: str
    hourly_usd: float | None
    lease: str  # live | lapsed | finished | unknown
    action: str  # delete | keep
    why: str
    result: str = ""  # after a sweep: deleted | failed: <error>
    source: Source | None = field(default=None, repr=False, compare=False)  # what it is deleted through
    view: RunView | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("source", "view")}


def fmt_duration(seconds: float) -> str:
    """``90`` -> ``1m30s``, ``3600`` -> ``1h``: the listing's ages and reasons."""
    seconds = int(round(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{v}{u}" for v, u in ((days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")) if v]
    return "".join(parts) or "0s"


def decide(lease: str, age_s: float | None, older_than_s: float, has_run: bool = True) -> tuple[str, str]:
    """(action, why) for one resource: the decision table of ``cloudtrain gc``.

    A live run is never touched; nothing younger than ``older_than_s`` is touched (a run launching
    now may not have written its lease yet); a resource whose age the API does not give is kept
    unless its run folder says the run is over. Otherwise a finished or lapsed run's resources go,
    and a resource whose run has no lease (``unknown``) goes by age alone."""
    if lease == LIVE:
        return KEEP, "lease fresh: the run is watched"
    if age_s is not None and age_s < older_than_s:
        return KEEP, f"younger than {fmt_duration(older_than_s)}"
    if lease == FINISHED:
        return DELETE, "run finished"
    if lease == LAPSED:
        return DELETE, "lease lapsed"
    if age_s is None:
        return KEEP, "no lease and no age: delete it by hand if it is yours"
    by_age = f"older than {fmt_duration(older_than_s)}"
    return DELETE, (f"no lease, {by_age}" if has_run else f"no run folder known, by age: {by_age}")
