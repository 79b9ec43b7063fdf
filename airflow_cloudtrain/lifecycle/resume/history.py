"""The history of a checkpoint-resume run: one row per attempt, the budgets, and the cost ledger.

It is what makes the loop crash-safe and what the user reads afterwards, so it lives in two places:
``task_state_store`` (the loop's memory across deferrals, killed workers and retries) and the run
folder (``ledger/<run_id>.json``, which ``cloudtrain runs show`` prints with no Airflow, and which a
retry falls back on when the store is gone). ``index/<run_id>.json`` under the bucket maps a run id
to its run folder, for ``resume_from="ct-..."`` and ``runs show RUN_ID``.

Stdlib only: the CLI reads it without Airflow.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_cloudtrain.contract.records import load_known

LOOP_KEY = "cloudtrain_loop"  # task_state_store: the RunHistory of a CheckpointResumeOperator task
LEDGER_PREFIX = "ledger"

# How an attempt ended (the ledger's "ended" column).
FINISHED = "finished"
INTERRUPTED = "interrupted"  # a spot reclaim / preemption the agent had notice of
INTERRUPTED_NO_NOTICE = "interrupted_no_notice"  # the instance vanished without a notice
CAPACITY_ERROR = "capacity_error"  # no offer had capacity: nothing was launched
JOB_ERROR = "job_error"  # the job itself failed (non-zero exit not caused by an interruption)
IDLE = "idle"  # the hung-job watchdog stopped it
LOST = "lost"  # the agent went silent or the instance ended for another reason
TIMED_OUT = "timed_out"  # max_runtime
ABANDONED = "abandoned"  # the task was killed or its wait failed: released, not reported by the agent
OVER_BUDGET = "over_budget"  # max_cost: stopped before the run's cost would pass it (core.budget)
# the deadline policy left this on-demand attempt for spot: a spot instance was launched beside it,
# then this one was stopped with its checkpoint synced (``lifecycle.resume.switch``); no budget spent
LEFT_FOR_SPOT = "left_for_spot"
# Spot interruptions (the XCom's ``interruptions``); with a capacity loss they spend ``max_restarts``.
# A silent agent (a broken bootstrap, no bucket access) is not the cloud's doing: it spends the
# error budget, so a bad image is not relaunched ten times.
SPOT_ENDINGS = frozenset({INTERRUPTED, INTERRUPTED_NO_NOTICE})
INTERRUPTION_ENDINGS = SPOT_ENDINGS | {CAPACITY_ERROR}
ERROR_ENDINGS = frozenset({JOB_ERROR, IDLE, LOST})


def ledger_key(run_id: str) -> str:
    """The ledger of one task's loop, inside the run folder it wrote to."""
    return f"{LEDGER_PREFIX}/{run_id}.json"


def index_key(run_id: str) -> str:
    """Under the bucket: which run folder a run id wrote to."""
    return f"index/{run_id}.json"


_load = load_known  # rows written by another release load: unknown keys are ignored


@dataclass
class AttemptRow:
    """One attempt in the ledger, or one node of a gang's attempt (``num_nodes`` > 1: a row per node,
    all with the attempt's number and ``ended``, each with its ``rank``, instance and share of the
    cost). Times are unix seconds; ``work_lost_s`` is the compute done after the last complete
    checkpoint (what the next attempt redoes); ``progress_s`` the compute this attempt added to the
    checkpointed work (what the deadline policy counts as done): a gang's are on its head's row
    (rank 0) only, the gang's work being one job's, so the totals add up over the rows."""

    attempt: int
    try_number: int
    ended: str
    cloud: str | None = None
    instance_id: str | None = None
    instance_type: str | None = None
    spot: bool = False
    zone: str | None = None
    region: str | None = None
    requested_at: float | None = None  # the first create call was sent
    launched_at: float | None = None  # the cloud answered with the instance
    job_started_at: float | None = None
    ended_at: float | None = None
    hourly_usd: float | None = None
    cost_usd: float = 0.0
    exit_code: int | None = None
    restored_step: int | None = None
    checkpoint_step: int | None = None
    checkpoint_saved_at: float | None = None
    work_lost_s: float | None = None
    progress_s: float = 0.0
    message: str = ""
    # why a relaunch restored nothing although an earlier attempt made progress (the agent's words)
    restore_note: str | None = None
    # when the job wrote the checkpoint this attempt restored (what the earlier attempt's work lost
    # is measured from when it is not the checkpoint that attempt uploaded last)
    restored_saved_at: float | None = None
    # a gang's node (None: a single-instance attempt, or a ledger from before gangs)
    rank: int | None = None
    num_nodes: int = 1
    private_ip: str | None = None
    node_state: str | None = None  # the node's own end when the gang's was decided (GangWatch)
    # zones whose spot or on-demand launch answered "no capacity" while this attempt was launched (the
    # launcher's failover; every zone tried for a ``capacity_error`` row): the resume loop's zone
    # ranking counts them (``lifecycle.resume.zones``)
    no_capacity_in: list[str] = field(default_factory=list)
    # a relaunch in another zone than the attempt before ran in: that zone, and why the loop moved
    moved_from: str | None = None
    move_reason: str | None = None

    @property
    def is_head(self) -> bool:
        """The attempt's own row: the only one of a single run, rank 0 of a gang."""
        return not self.rank

    @property
    def duration_s(self) -> float:
        if self.launched_at is None or self.ended_at is None:
            return 0.0
        return max(0.0, self.ended_at - self.launched_at)

    @property
    def startup_s(self) -> float | None:
        """Launch issued to job started: boot, agent, code, setup and checkpoint restore."""
        if self.launched_at is None or self.job_started_at is None:
            return None
        return max(0.0, self.job_started_at - self.launched_at)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RunHistory:
    """Everything the loop knows about its run; see the module docstring for where it is kept."""

    run_id: str
    run_uri: str
    policy: str
    started_at: float
    resumed_from: str | None = None
    attempts: list[AttemptRow] = field(default_factory=list)
    waits: list[dict[str, Any]] = field(default_factory=list)  # {"from", "to", "reason"}
    pending: dict[str, Any] | None = None  # {"launch", "outcome"}: an attempt being finished
    launch_seq: int = 0  # launches begun so far: part of each launch's client tokens, never reused
    state: str = "running"  # running | succeeded | failed
    message: str = ""
    updated_at: float | None = None
    version: int = 1
    # the deadline policy's deadline (unix time; None: none), saved with the history's next write so
    # the Cloud training page can draw it on the run's timeline
    deadline_at: float | None = None
    # looks at spot while an on-demand attempt ran (``lifecycle.resume.switch``): {"at", "ok", "zones",
    # "message"} for each spot launch tried beside it; ``asked_at``: the policy's last look, launch or not
    probes: list[dict[str, Any]] = field(default_factory=list)
    asked_at: float | None = None
    # a switch in flight (write-ahead): {"from": the on-demand instance, "at"}; a loop that finds one on
    # reload releases that switch's spot launch (``RecoveryLoop.resolve_switch``)
    switch: dict[str, Any] | None = None

    # -- budgets ---------------------------------------------------------------------------------
    # Counted per attempt, not per row: a gang's attempt (a row per node) that lost one node is one
    # interruption, and the budgets apply to the gang as they do to one instance.
    @property
    def heads(self) -> list[AttemptRow]:
        """One row per attempt: the attempt's own (a gang's rank 0)."""
        return [r for r in self.attempts if r.is_head]

    @property
    def next_attempt(self) -> int:
        """The number the next attempt's row(s) get."""
        return max((r.attempt for r in self.attempts), default=0) + 1

    def interruptions(self) -> int:
        """Spot interruptions (reclaims, preemptions), with or without notice; a gang's counts once."""
        return sum(1 for r in self.heads if r.ended in SPOT_ENDINGS)

    def capacity_losses(self, try_number: int | None = None) -> int:
        """What ``max_restarts`` counts: interruptions and launches with no capacity anywhere."""
        return sum(
            1
            for r in self.heads
            if r.ended in INTERRUPTION_ENDINGS and (try_number is None or r.try_number == try_number)
        )

    def error_restarts(self, try_number: int | None = None) -> int:
        return sum(
            1
            for r in self.heads
            if r.ended in ERROR_ENDINGS and (try_number is None or r.try_number == try_number)
        )

    @property
    def launches(self) -> int:
        return sum(1 for r in self.heads if r.instance_id)

    @property
    def restarts(self) -> int:
        """Relaunches so far (what the next job sees as ``CLOUDTRAIN_RESTARTS``)."""
        return sum(1 for r in self.heads if r.instance_id and r.ended != FINISHED)

    def has(self, instance_id: str) -> bool:
        return any(r.instance_id == instance_id for r in self.attempts)

    # -- what the policy needs -------------------------------------------------------------------
    @property
    def work_done_s(self) -> float:
        return sum(r.progress_s for r in self.attempts)

    def changeover_s(self, default_s: float) -> float:
        """The measured cost of one (re)launch of this run: startup plus the work lost per attempt."""
        startups = [s for r in self.heads if (s := r.startup_s) is not None]
        lost = [r.work_lost_s for r in self.heads if r.work_lost_s is not None]
        if not startups:
            return default_s
        return sum(startups) / len(startups) + (sum(lost) / len(lost) if lost else 0.0)

    # -- the ledger --------------------------------------------------------------------------------
    def totals(self) -> dict[str, Any]:
        rows = self.attempts
        cost = math.fsum(r.cost_usd for r in rows)
        lost = [r.work_lost_s for r in rows if r.work_lost_s is not None]
        end = max((r.ended_at for r in rows if r.ended_at), default=None) or time.time()
        return {
            "attempts": len(self.heads),
            "rows": len(rows),
            "launches": self.launches,
            "interruptions": self.interruptions(),
            "error_restarts": self.error_restarts(),
            "cost_usd": round(cost, 6),
            "spot_cost_usd": round(math.fsum(r.cost_usd for r in rows if r.spot), 6),
            "on_demand_cost_usd": round(math.fsum(r.cost_usd for r in rows if not r.spot), 6),
            "work_lost_s": round(sum(lost), 3),
            "waited_s": round(sum(max(0.0, w["to"] - w["from"]) for w in self.waits), 3),
            "duration_s": round(max(0.0, end - self.started_at), 3),
        }

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["totals"] = self.totals()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunHistory:
        history = _load(cls, data)
        history.attempts = [_load(AttemptRow, r) for r in data.get("attempts", [])]
        return history

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    def table(self) -> str:
        """The ledger as the task log and ``cloudtrain runs show`` print it."""
        return format_ledger(self.to_dict())


def _fmt(value: Any, pattern: str = "{}") -> str:
    return "-" if value is None else pattern.format(value)


def _clock(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%H:%M:%S", time.gmtime(ts))


def format_ledger(data: dict[str, Any]) -> str:
    """A plain-text table of a ledger dict (``RunHistory.to_dict()``, or the file's JSON)."""
    lines = [
        f"run {data.get('run_id')} ({data.get('state')}, policy {data.get('policy')}) in {data.get('run_uri')}"
    ]
    if data.get("resumed_from"):
        lines.append(f"resumed from {data['resumed_from']}")
    gang = any(r.get("rank") is not None for r in data.get("attempts", []))  # a node column
    width = 6 if gang else 0
    header = (
        f"{'#':>2} {'node' if gang else '':<{width}}{'ended':<22}{'instance type':<16}{'mode':<10}"
        f"{'zone':<16}{'start':>9}{'end':>9}{'$/h':>9}{'cost $':>10}{'restored':>9}{'ckpt':>6}{'lost s':>8}"
    )
    lines.append(header)
    for r in data.get("attempts", []):
        mode = "-" if not r.get("instance_id") else ("spot" if r.get("spot") else "on-demand")
        node = f"{r['rank']}/{r.get('num_nodes', 1)}" if r.get("rank") is not None else "-"
        lines.append(
            f"{r['attempt']:>2} {node if gang else '':<{width}}{r['ended']:<22}"
            f"{_fmt(r.get('instance_type')):<16}{mode:<10}"
            f"{_fmt(r.get('zone')):<16}{_clock(r.get('launched_at')):>9}{_clock(r.get('ended_at')):>9}"
            f"{_fmt(r.get('hourly_usd'), '{:.4f}'):>9}{r.get('cost_usd', 0.0):>10.6f}"
            f"{_fmt(r.get('restored_step')):>9}{_fmt(r.get('checkpoint_step')):>6}"
            f"{_fmt(r.get('work_lost_s'), '{:.1f}'):>8}"
            + (f"  {r['instance_id']} {r.get('node_state') or ''}".rstrip() if gang else "")
        )
        if r.get("moved_from") and not r.get("rank"):  # once per attempt: a gang moves as one
            lines.append(
                f"   moved from {r['moved_from']} to {_fmt(r.get('zone'))}: {r.get('move_reason') or '-'}"
            )
    t = data.get("totals") or {}
    lines.append(
        f"total: {t.get('attempts', 0)} attempt(s)"
        + (f" ({t.get('rows', 0)} node rows)" if gang else "")
        + f", {t.get('interruptions', 0)} interruption(s)"
        + (" (a gang's attempt counts once, whichever node was lost)" if gang else "")
        + ", "
        f"{t.get('error_restarts', 0)} error restart(s), ${t.get('cost_usd', 0.0):.6f} "
        f"(spot ${t.get('spot_cost_usd', 0.0):.6f}, on-demand ${t.get('on_demand_cost_usd', 0.0):.6f}), "
        f"{t.get('work_lost_s', 0.0):.1f} s of work lost, {t.get('waited_s', 0.0):.0f} s waited, "
        f"{t.get('duration_s', 0.0):.0f} s in all"
    )
    if data.get("message"):
        lines.append(str(data["message"]))
    return "\n".join(lines)
