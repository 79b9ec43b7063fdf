"""What the checkpoint-resume loop does next, and how an attempt's end goes into its ledger.

Pure decisions over a ``RunHistory`` (no cloud calls), so the operator's blocking and deferrable
paths, and the tests, share them:

- ``next_step``: done, fail (a budget is spent), wait (the deadline policy, or no capacity), or
  launch on spot / on-demand. ``spot_first`` relaunches on spot until ``on_demand_after``
  interruptions; ``deadline`` asks the policy engine's registered default policy with a
  ``PolicyState`` built from the history (``policy_state``), the very function the simulator runs.
- ``row_for``: one ledger row from the launch, the outcome, the agent's last status and the cost.

Budgets are per try: an Airflow retry of the task continues the loop (same run folder, checkpoints,
ledger and deadline) with fresh ``max_restarts`` / ``max_restarts_on_errors``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.lifecycle.resume.history import (
    CAPACITY_ERROR,
    FINISHED,
    IDLE,
    INTERRUPTED,
    INTERRUPTED_NO_NOTICE,
    JOB_ERROR,
    LEFT_FOR_SPOT,
    LOST,
    OVER_BUDGET,
    SPOT_ENDINGS,
    TIMED_OUT,
    AttemptRow,
    RunHistory,
)
from airflow_cloudtrain.lifecycle.resume.zones import no_capacity_zones

if TYPE_CHECKING:
    from airflow_cloudtrain.contract.runs import RunStatus
    from airflow_cloudtrain.core.records import Attempt, LaunchRecord
    from airflow_cloudtrain.policy import PolicyState

SPOT_FIRST, DEADLINE = "spot_first", "deadline"
POLICIES = (SPOT_FIRST, DEADLINE)
SPOT_OF = {"ec2": "ec2spot", "ec2spot": "ec2spot", "gcloud": "gcspot", "gcspot": "gcspot"}
ON_DEMAND_OF = {"ec2": "ec2", "ec2spot": "ec2", "gcloud": "gcloud", "gcspot": "gcloud"}
DEFAULT_CHANGEOVER_S = 300.0  # before this run has measured its own: boot, setup, restore
HEARTBEAT_S = 5.0  # the agent's heartbeat interval (RunSpec.heartbeat_interval_s)


@dataclass(frozen=True)
class RecoverySettings:
    """The operator's recovery arguments, parsed (see ``CheckpointResumeOperator``)."""

    cloud: str  # the cloud the user named: its provider, and spot or not for ``spot_first``
    max_restarts: int = 10
    max_restarts_on_errors: int = 0
    policy: str = SPOT_FIRST
    on_demand_after: int | None = None
    deadline_at: float | None = None  # unix time, once the first start is known
    expected_duration_s: float | None = None
    relaunch_wait_s: float = 60.0  # after no offer had capacity; the deadline policy's tick
    spot_price_ratio: float = 0.32  # spot / on-demand of the chosen offer, for the policy
    max_cost_usd: float | None = None  # ``max_cost``: no launch, and no on-demand, that would pass it
    spot_hourly_usd: float | None = None  # the next launch's price per hour, every node (catalog)
    on_demand_hourly_usd: float | None = None
    zones: tuple[str, ...] = ()  # ``zones``: the zones every launch may use (none: the offers' own)
    # ``probe_interval``: with ``deadline``, how often the policy is asked while an on-demand attempt
    # runs (``probe_step``); None: only between attempts
    probe_interval_s: float | None = None


@dataclass(frozen=True)
class Step:
    """``launch`` (on ``cloud``), ``wait`` (``seconds``), ``done`` or ``fail`` (``reason``)."""

    kind: str
    cloud: str | None = None
    seconds: float = 0.0
    reason: str = ""


def next_step(history: RunHistory, settings: RecoverySettings, try_number: int, now: float) -> Step:
    """What the loop does now; the reasons end up in the task log."""
    heads = history.heads  # one row per attempt (a gang's rank 0)
    last = heads[-1] if heads else None
    if last is not None and last.ended == FINISHED:
        return Step("done", reason="the job finished")
    if last is not None and last.ended == TIMED_OUT and last.try_number == try_number:
        return Step("fail", reason=f"attempt {last.attempt} ran past max_runtime: {last.message}")
    if last is not None and last.ended == OVER_BUDGET:
        return Step("fail", reason=f"attempt {last.attempt} was stopped at the budget: {last.message}")
    step = _next_step(history, settings, try_number, now, last)
    return within_budget(step, history, settings)


def _next_step(
    history: RunHistory, settings: RecoverySettings, try_number: int, now: float, last: AttemptRow | None
) -> Step:
    losses = history.capacity_losses(try_number)
    if losses > settings.max_restarts:
        return Step(
            "fail",
            reason=f"{losses} interruptions, more than max_restarts={settings.max_restarts}"
            + (f"; last: {last.message}" if last and last.message else ""),
        )
    errors = history.error_restarts(try_number)
    if errors > settings.max_restarts_on_errors:
        return Step(
            "fail",
            reason=f"the job failed {errors} time(s), more than max_restarts_on_errors="
            f"{settings.max_restarts_on_errors}"
            + (f"; last: {last.message}" if last and last.message else ""),
        )
    # no capacity at the last try, and no wait since: wait (spot_first) or tell the policy
    capacity_just_failed = (
        last is not None
        and last.ended == CAPACITY_ERROR
        and not (history.waits and history.waits[-1]["from"] >= (last.ended_at or 0.0))
    )
    if settings.policy == DEADLINE:
        return _deadline_step(history, settings, now, capacity_just_failed)
    cloud = settings.cloud
    if capacity_just_failed:
        return Step("wait", seconds=settings.relaunch_wait_s, reason="no offer had capacity")
    total = history.interruptions()
    if settings.on_demand_after is not None and total >= settings.on_demand_after:
        return Step("launch", ON_DEMAND_OF[cloud], reason=f"on-demand after {total} interruption(s)")
    return Step("launch", cloud, reason="relaunch" if history.launches else "first launch")


def _deadline_step(history: RunHistory, settings: RecoverySettings, now: float, spot_failed: bool) -> Step:
    from airflow_cloudtrain.policy import get_policy

    state = policy_state(history, settings, now, spot_available=not spot_failed)
    decision = get_policy(DEADLINE)(state)
    why = (
        f"deadline policy: {decision} (slack {state.slack * 3600:.0f} s, work left "
        f"{state.work_remaining * 3600:.0f} s, changeover {state.changeover * 3600:.0f} s)"
    )
    last = history.heads[-1] if history.heads else None
    if spot_failed and last is not None:  # why spot counts as unavailable: every zone tried said so
        where = ", ".join(last.no_capacity_in) or "the zone the cloud chose"
        why += f"; no spot capacity in any allowed zone tried ({where})"
    elif decision == "spot" and last is not None and last.ended in SPOT_ENDINGS and len(settings.zones) > 1:
        why += f"; spot again after a preemption in {last.zone}, in the zones least troubled first"
    if decision == "wait":
        return Step("wait", seconds=settings.relaunch_wait_s, reason=why)
    cloud = SPOT_OF[settings.cloud] if decision == "spot" else ON_DEMAND_OF[settings.cloud]
    return Step("launch", cloud, reason=why)


def policy_state(
    history: RunHistory,
    settings: RecoverySettings,
    now: float,
    spot_available: bool = True,
    on_demand_since: float | None = None,
) -> PolicyState:
    """The policy engine's state (hours) from what this run has seen.

    Work done is the compute behind the latest complete checkpoint; the changeover is this run's
    measured relaunch + restore (+ work lost), a default until it has one. Spot counts as seen
    available while spot attempts ran, unavailable while a spot launch found no capacity and the
    loop waited; each spot attempt is one spell. Nothing runs at a (re)launch; ``on_demand_since``
    (a probe, ``probe_step``): an on-demand attempt launched then runs, its work since its changeover
    counted done, and the spell is the time since spot was last seen unavailable.
    """
    from airflow_cloudtrain.policy import PolicyState

    hour = 3600.0
    expected = settings.expected_duration_s or 0.0
    deadline = (settings.deadline_at or now) - history.started_at
    changeover = history.changeover_s(DEFAULT_CHANGEOVER_S)
    running_s = max(0.0, now - on_demand_since) if on_demand_since is not None else 0.0
    done = history.work_done_s + max(0.0, running_s - changeover)
    spot_rows = [r for r in history.heads if r.spot and r.instance_id]  # a gang's attempt once
    tick = settings.relaunch_wait_s
    return PolicyState(
        elapsed=(now - history.started_at) / hour,
        deadline=deadline / hour,
        work_done=done / hour,
        work_remaining=max(expected - done, tick) / hour,
        changeover=changeover / hour,
        spot_available=spot_available,
        running="on_demand" if on_demand_since is not None else None,
        setup_remaining=max(0.0, changeover - running_s) / hour if on_demand_since is not None else 0.0,
        tick=tick / hour,
        price_ratio=settings.spot_price_ratio,
        interruptions=history.interruptions(),
        launches=history.launches,
        spot_hours=sum(r.duration_s for r in spot_rows) / hour,
        on_demand_hours=(sum(r.duration_s for r in history.heads if not r.spot) + running_s) / hour,
        seen_available_hours=sum(r.duration_s for r in spot_rows) / hour,
        seen_unavailable_hours=sum(max(0.0, w["to"] - w["from"]) for w in history.waits) / hour,
        spot_spells=len(spot_rows),
        spell_hours=max(0.0, now - last_unavailable(history)) / hour if on_demand_since is not None else 0.0,
        running_hours=running_s / hour,
    )


def last_unavailable(history: RunHistory) -> float:
    """When this run last saw spot unavailable (unix time): a spot launch with no capacity, a
    preemption, a probe that found none; the loop's start when it never did. A spell of spot seen
    at a probe is at most this old: the operator cannot see capacity between its looks."""
    seen = [history.started_at]
    seen += [r.ended_at for r in history.heads if r.ended_at and r.ended in (CAPACITY_ERROR, *SPOT_ENDINGS)]
    seen += [float(p["at"]) for p in history.probes if not p.get("ok")]
    return max(seen)


def next_probe_at(history: RunHistory, settings: RecoverySettings, launch: LaunchRecord) -> float | None:
    """When the wait on ``launch`` should next stop for ``probe_step`` (unix time), or None: only an
    on-demand attempt of one instance under ``policy="deadline"`` with a ``probe_interval`` is
    probed (a gang keeps the old behaviour: README), at most once per interval since its launch or
    the policy's last look, whichever came later."""
    interval = settings.probe_interval_s
    if settings.policy != DEADLINE or interval is None or launch.spot or launch.nodes:
        return None
    last = max(float(launch.launched_at or 0.0), history.asked_at or 0.0)
    return last + interval


def probe_step(history: RunHistory, settings: RecoverySettings, launch: LaunchRecord, now: float) -> Step:
    """While the on-demand ``launch`` runs: ``launch`` spot beside it (the policy would leave on-demand
    for spot if spot were there; the launch itself tells whether it is: make-before-break), or
    ``wait`` (stay on on-demand until the next probe). Pure: the policy over the history."""
    from airflow_cloudtrain.policy import get_policy

    state = policy_state(history, settings, now, spot_available=True, on_demand_since=launch.launched_at)
    decision = get_policy(DEADLINE)(state)
    why = (
        f"deadline policy on on-demand, if spot were available: {decision} (spot unseen for "
        f"{state.spell_hours * 3600:.0f} s at most, slack {state.slack * 3600:.0f} s, work left "
        f"{state.work_remaining * 3600:.0f} s, changeover {state.changeover * 3600:.0f} s)"
    )
    if decision == "spot":
        return Step("launch", SPOT_OF[settings.cloud], reason=why)
    return Step("wait", seconds=settings.probe_interval_s or 0.0, reason=why)


def ending_of(state: str, interrupted: bool, notice: bool) -> str:
    """The ledger's ``ended`` for an outcome state (the agent's or the operator's)."""
    if state == "succeeded":
        return FINISHED
    if interrupted or state == "interrupted":
        return INTERRUPTED if notice else INTERRUPTED_NO_NOTICE
    known = {"failed": JOB_ERROR, "idle": IDLE, "timed_out": TIMED_OUT, OVER_BUDGET: OVER_BUDGET}
    return {**known, LEFT_FOR_SPOT: LEFT_FOR_SPOT}.get(state, LOST)


def within_budget(step: Step, history: RunHistory, settings: RecoverySettings) -> Step:
    """``max_cost`` over a launch step: no launch that cannot run its first (billed) minute within what
    is left of the budget, and no on-demand launch whose price for the work left would pass it: the loop
    stays on spot then, saying why (README "What a run costs")."""
    budget, cloud = settings.max_cost_usd, step.cloud
    if budget is None or step.kind != "launch" or cloud is None:
        return step
    from airflow_cloudtrain.core.billing import INSTANCE_MINIMUM_S, billed_usd

    spent = float(history.totals()["cost_usd"])
    on_demand = cloud == ON_DEMAND_OF[cloud]
    if on_demand and settings.on_demand_hourly_usd is not None:
        left_s = max((settings.expected_duration_s or 0.0) - history.work_done_s, INSTANCE_MINIMUM_S)
        needed = billed_usd(settings.on_demand_hourly_usd, left_s)
        if spent + needed > budget:
            why = (
                f"on-demand would pass max_cost=${budget:g} (${spent:.4f} spent + ${needed:.4f} for "
                f"{left_s:.0f} s at ${settings.on_demand_hourly_usd:g}/h): staying on spot"
            )
            step = Step("launch", SPOT_OF[cloud], reason=f"{step.reason}; {why}")
            on_demand = False
    hourly = settings.on_demand_hourly_usd if on_demand else settings.spot_hourly_usd
    if hourly is not None and spent + billed_usd(hourly, INSTANCE_MINIMUM_S) > budget:
        return Step(
            "fail",
            reason=f"max_cost=${budget:g} is spent: ${spent:.4f} so far, and another launch bills at least "
            f"${billed_usd(hourly, INSTANCE_MINIMUM_S):.4f}",
        )
    return step


def row_for(
    attempt: Attempt,
    status: RunStatus | None,
    number: int,
    try_number: int,
    last_beat: float | None = None,
) -> AttemptRow:
    """One ledger row: the attempt's launch, outcome and cost, plus the agent's checkpoint facts.
    ``last_beat``: the agent's last heartbeat, when the job may have stopped without a word."""
    launch, outcome = attempt.launch, attempt.outcome
    notice = bool(status and status.interruption and status.interruption.get("notice_at"))
    ended = ending_of(outcome.state, outcome.interrupted, notice)
    checkpoint = (status.checkpoint if status else None) or {}
    saved_at = checkpoint.get("saved_at")
    job_started = status.job_started_at if status else None
    stopped = _stopped_at(status, attempt, last_beat)
    lost = None
    progress = 0.0
    if job_started is not None:
        if ended == FINISHED:
            progress = max(0.0, stopped - job_started)
            lost = 0.0
        else:
            base = saved_at if saved_at is not None else job_started
            lost = max(0.0, stopped - base)
            progress = max(0.0, saved_at - job_started) if saved_at is not None else 0.0
    return AttemptRow(
        attempt=number,
        try_number=try_number,
        ended=ended,
        **launch_fields(launch),
        job_started_at=job_started,
        ended_at=attempt.released_at,
        cost_usd=float(attempt.cost_usd or 0.0),
        exit_code=outcome.exit_code,
        restored_step=status.restored_step if status else None,
        restore_note=((status.restore or {}).get("note") if status else None),
        restored_saved_at=((status.restore or {}).get("saved_at") if status else None),
        checkpoint_step=checkpoint.get("step"),
        checkpoint_saved_at=saved_at,
        work_lost_s=None if lost is None else round(lost, 3),
        progress_s=round(progress, 3),
        message=outcome.message,
    )


def gang_rows(
    attempt: Attempt,
    statuses: list[RunStatus | None],
    number: int,
    try_number: int,
    last_beat: float | None = None,
) -> list[AttemptRow]:
    """A gang's attempt as one row per node (``statuses`` in rank order): every row has the attempt's
    number and the gang's ``ended`` (from the rank that ended it: interrupted with or without notice,
    the job's error, ...); each its node's rank, instance, zone, exit code, restored step and an equal
    share of the cost (the nodes were launched and released together, so the shares sum to the
    attempt's cost). The head's row carries the gang's progress and work lost (``AttemptRow``)."""
    launch, outcome = attempt.launch, attempt.outcome
    n = launch.num_nodes
    cause = outcome.rank if outcome.rank is not None and 0 <= outcome.rank < n else 0
    status = statuses[cause]
    notice = bool(status and status.interruption and status.interruption.get("notice_at"))
    ended = ending_of(outcome.state, outcome.interrupted, notice)
    head = row_for(attempt, statuses[0], number, try_number, last_beat)
    states = {int(e["rank"]): e for e in outcome.nodes or []}
    share = float(attempt.cost_usd or 0.0) / n
    rows = []
    for node in launch.nodes:
        rank = int(node["rank"])
        own = statuses[rank]
        checkpoint = (own.checkpoint if own else None) or {}
        base = head if rank == 0 else replace(head, work_lost_s=None, progress_s=0.0)
        rows.append(
            replace(
                base,
                ended=ended,
                rank=rank,
                num_nodes=n,
                instance_id=str(node["instance_id"]),
                zone=node.get("zone") or launch.zone,
                private_ip=node.get("private_ip"),
                node_state=(states.get(rank) or {}).get("state"),
                cost_usd=share,
                exit_code=(states.get(rank) or {}).get("exit_code"),
                job_started_at=own.job_started_at if own else None,
                restored_step=own.restored_step if own else None,
                restore_note=((own.restore or {}).get("note") if own else None),
                restored_saved_at=((own.restore or {}).get("saved_at") if own else None),
                checkpoint_step=checkpoint.get("step") if rank else head.checkpoint_step,
                checkpoint_saved_at=checkpoint.get("saved_at") if rank else head.checkpoint_saved_at,
                message=outcome.message,
            )
        )
    return rows


def node_rows(launch: LaunchRecord, row: AttemptRow) -> list[AttemptRow]:
    """``row`` (an attempt with no agent's word: abandoned) as one row per node of a gang's launch,
    the cost shared equally; a single launch's row as it is."""
    if not launch.nodes:
        return [row]
    n = launch.num_nodes
    return [
        replace(
            row,
            rank=int(node["rank"]),
            num_nodes=n,
            instance_id=str(node["instance_id"]),
            zone=node.get("zone") or launch.zone,
            private_ip=node.get("private_ip"),
            cost_usd=row.cost_usd / n,
        )
        for node in launch.nodes
    ]


def launch_fields(launch: LaunchRecord) -> dict[str, Any]:
    """The ledger row's columns that come from the launch: which offer, where, when."""
    return {
        "cloud": launch.cloud,
        "instance_id": launch.instance_id,
        "instance_type": launch.instance_type,
        "spot": bool(launch.spot),
        "zone": launch.zone,
        "region": launch.region,
        "requested_at": launch.requested_at,
        "launched_at": launch.launched_at,
        "hourly_usd": launch.hourly_usd,
        "no_capacity_in": no_capacity_zones(launch.failover, launch.region),
    }


def _stopped_at(status: RunStatus | None, attempt: Attempt, last_beat: float | None) -> float:
    """When the job stopped making progress: it exited after a notice, or the agent reported the
    end. Without a word from the agent (gone without notice) the end lies between its last sign of
    life and the next heartbeat it would have written, and before the wait saw the instance ended:
    the ledger takes that upper bound, so it never under-reports the work lost."""
    interruption: dict[str, Any] = (status.interruption if status else None) or {}
    for value in (interruption.get("job_stopped_at"), status.ended_at if status else None):
        if value:
            return float(value)
    bounds = [attempt.released_at, attempt.outcome.seen_ended_at or attempt.released_at]
    signs = [v for v in (status.updated_at if status else None, last_beat) if v]
    if signs:
        bounds.append(max(signs) + HEARTBEAT_S)
    return float(min(bounds))


def capacity_row(
    number: int, try_number: int, cloud: str, message: str, now: float, zones: list[str] | None = None
) -> AttemptRow:
    """A relaunch that found no capacity anywhere: nothing ran, nothing was paid. ``zones``: every
    zone it tried (the zone ranking counts a capacity error in each)."""
    return AttemptRow(
        attempt=number,
        try_number=try_number,
        ended=CAPACITY_ERROR,
        cloud=cloud,
        spot=cloud in ("ec2spot", "gcspot"),
        launched_at=now,
        ended_at=now,
        message=message,
        no_capacity_in=list(zones or []),
    )
