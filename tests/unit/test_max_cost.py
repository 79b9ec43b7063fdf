"""``max_cost``: the poll's projection (``core.budget``), the resume loop's budget rule
(``recovery.within_budget``), the watches that end a run at the budget, and the argument's parsing."""

from __future__ import annotations

import pytest
from test_recovery import T0, history, row

from airflow_cloudtrain.core.budget import OVER_BUDGET, BudgetWatch, budget_watch
from airflow_cloudtrain.core.cloud import Instance
from airflow_cloudtrain.core.waiting import GangWatch, RunWatch
from airflow_cloudtrain.lifecycle.resume.recovery import RecoverySettings, ending_of, next_step
from airflow_cloudtrain.operators.budget_config import parse_max_cost

HOUR = 3600.0


def test_the_check_looks_one_poll_ahead() -> None:
    watch = BudgetWatch(max_usd=1.0, spent_usd=0.25, hourly_usd=3.6, launched_at=T0, lookahead_s=10.0)
    # 0.25 + 3.6 $/h: the budget is passed at 750 s; with a 10 s look-ahead the check fires from 740 s
    assert watch.check(T0 + 739.0) is None
    over = watch.check(T0 + 740.0)
    assert over is not None and over.state == OVER_BUDGET and not over.ok
    assert "max_cost=$1" in over.message and "$0.9900 spent" in over.message and "$0.2500" in over.message


def test_the_minute_minimum_counts_from_the_first_poll() -> None:
    watch = BudgetWatch(max_usd=0.05, spent_usd=0.0, hourly_usd=3.6, launched_at=T0, lookahead_s=1.0)
    assert watch.check(T0 + 1.0) is not None  # the first minute alone costs $0.06
    assert budget_watch(None, 0.0, 3.6, T0, 1.0) is None and budget_watch(1.0, 0.0, None, T0, 1.0) is None


def running(iid: str) -> Instance:
    return Instance(id=iid, state="running", instance_type="m5.large", zone="us-east-1a", spot=True)


def test_a_run_watch_and_a_gang_watch_end_at_the_budget() -> None:
    now = [T0]
    single = RunWatch(None, T0, wall=lambda: now[0])
    single.budget = BudgetWatch(0.1, 0.0, 3.6, T0, 1.0)
    gang = GangWatch(["a", "b"], None, T0, wall=lambda: now[0])
    gang.budget = BudgetWatch(0.2, 0.0, 3.6 * 2, T0, 1.0)  # two nodes: twice the price
    assert single.decide(None, running("a")) is None
    assert gang.decide([None, None], [running("a"), running("b")]) is None
    now[0] = T0 + 99.0  # 100 s of 3.6 $/h is the budget
    assert single.decide(None, running("a")).state == OVER_BUDGET  # type: ignore[union-attr]
    over = gang.decide([None, None], [running("a"), running("b")])
    assert over is not None and over.state == OVER_BUDGET and len(over.nodes or []) == 2


def settings(**kw: object) -> RecoverySettings:
    base: dict[str, object] = {
        "cloud": "ec2spot",
        "max_cost_usd": 0.1,
        "spot_hourly_usd": 0.36,
        "on_demand_hourly_usd": 3.6,
        "expected_duration_s": 600.0,
    }
    return RecoverySettings(**{**base, **kw})  # type: ignore[arg-type]


def test_the_loop_stays_on_spot_when_on_demand_would_pass_the_budget() -> None:
    two = history(row(1, "interrupted"), row(2, "interrupted"))  # $0.02 spent
    step = next_step(two, settings(on_demand_after=2), 1, T0 + 1000)
    assert (step.kind, step.cloud) == ("launch", "ec2spot")
    assert "on-demand would pass max_cost=$0.1" in step.reason
    rich = next_step(two, settings(on_demand_after=2, max_cost_usd=5.0), 1, T0 + 1000)
    assert (rich.kind, rich.cloud) == ("launch", "ec2")  # within the budget: on-demand as asked


def test_no_launch_once_the_budget_is_spent_and_an_over_budget_end_is_final() -> None:
    spent = history(row(1, "interrupted", cost_usd=0.0999))
    step = next_step(spent, settings(), 1, T0 + 1000)
    assert step.kind == "fail" and "max_cost=$0.1 is spent" in step.reason
    stopped = history(row(1, ending_of(OVER_BUDGET, False, False), message="max_cost=$0.1 reached"))
    final = next_step(stopped, settings(max_cost_usd=None), 1, T0 + 1000)
    assert final.kind == "fail" and "stopped at the budget" in final.reason


@pytest.mark.parametrize(
    ("value", "usd"), [(25, 25.0), ("12.50", 12.5), ("$3", 3.0), (0.5, 0.5), (None, None)]
)
def test_max_cost_forms(value: object, usd: float | None) -> None:
    assert parse_max_cost(value) == usd


def test_a_fleet_grows_only_by_the_workers_its_budget_covers_then_ends() -> None:
    from dataclasses import replace

    from test_fleet_core import LAUNCH, watch_of

    from airflow_cloudtrain.lifecycle.fleet.watch import FleetFailed

    alive = Instance("i-1", "running", "c5.large", "us-east-1a", True, launch_time=LAUNCH)
    watch = watch_of({"c5.large": 3.6}, [alive])  # $0.06 a worker-minute
    watch.handle = replace(watch.handle, max_cost_usd=0.2, poll_interval=10.0, max_workers=10)
    # at 30 s: $0.06 billed (the minimum) + 10 s ahead $0.01 = $0.07; $0.13 left buys 2 more workers
    assert watch.within_budget(target=10, desired=1, now=LAUNCH + 30) == 3
    assert watch.within_budget(target=1, desired=1, now=LAUNCH + 30) == 1
    with pytest.raises(FleetFailed, match=r"max_cost=\$0.2 reached"):
        watch.within_budget(target=1, desired=1, now=LAUNCH + 191)  # 0.191 + 0.01 by the next poll
    watch.handle = replace(watch.handle, max_cost_usd=None)
    assert watch.within_budget(target=10, desired=1, now=LAUNCH + 10_000) == 10


def test_a_vertex_job_has_no_minimum_and_its_message_says_cancelled() -> None:
    from airflow_cloudtrain.core.budget import replicas_over_budget

    assert replicas_over_budget(None, 3.6, T0, T0 + 1e6, 1.0) is None
    assert replicas_over_budget(0.1, 3.6, None, T0, 1.0) is None  # not started: nothing billed yet
    assert replicas_over_budget(0.1, 3.6, T0, T0 + 10.0, 1.0) is None  # no 60 s minimum on replicas
    message = replicas_over_budget(0.1, 3.6, T0, T0 + 99.0, 1.0)
    assert message is not None and "max_cost=$0.1 reached" in message and "the job was cancelled" in message
