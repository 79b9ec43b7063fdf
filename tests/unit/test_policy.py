"""Spot policies on hand-made traces whose right answer is known, plus the registry.

All times are hours; traces have 10-minute ticks like the NSDI'24 AWS traces.
"""

from __future__ import annotations

import dataclasses

import pytest

from airflow_cloudtrain.policy import (
    POLICIES,
    Decision,
    Policy,
    PolicyState,
    RunResult,
    available_policies,
    get_policy,
    must_run_on_demand,
    ours,
    simulate,
)
from airflow_cloudtrain.policy.deadline import slack_scarcity
from airflow_cloudtrain.policy.planner import plan

TICK = 1.0 / 6.0
JOB, CHANGEOVER, SPOT_PRICE, OD_PRICE = 48.0, 0.2, 0.3, 1.0
ON_DEMAND_COST = OD_PRICE * (JOB + CHANGEOVER)


def run(data: list[int], policy: str | Policy, deadline: float = 52.0) -> RunResult:
    return simulate(
        data,
        get_policy(policy) if isinstance(policy, str) else policy,
        job_hours=JOB,
        deadline_hours=deadline,
        changeover_hours=CHANGEOVER,
        spot_price=SPOT_PRICE,
        on_demand_price=OD_PRICE,
        gap_hours=TICK,
    )


def ticks(hours: float) -> int:
    return round(hours / TICK)


def test_registry_names_and_alias() -> None:
    assert set(POLICIES) == {"on_demand", "greedy", "uniform_progress", "ours"}
    assert available_policies() == ("deadline", "greedy", "on_demand", "ours", "uniform_progress")
    assert get_policy("deadline") is ours
    assert get_policy("ours") is ours


@pytest.mark.parametrize("bad", ["Deadline", "cheapest", "", None, 3])
def test_registry_rejects_unknown_names_listing_valid_ones(bad: object) -> None:
    with pytest.raises(ValueError) as err:
        get_policy(bad)  # type: ignore[arg-type]
    message = str(err.value)
    assert repr(bad) in message
    for name in available_policies():
        assert name in message


def test_state_is_frozen_and_slack_is_in_hours() -> None:
    state = PolicyState(
        elapsed=10, deadline=60, work_done=20, work_remaining=28, changeover=0.2, spot_available=True
    )
    assert state.slack == pytest.approx(22.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.elapsed = 11  # type: ignore[misc]


def test_safety_net_fires_exactly_when_one_more_tick_could_be_fatal() -> None:
    base = PolicyState(
        elapsed=0, deadline=0, work_done=0, work_remaining=10, changeover=0.2, spot_available=True
    )
    needed = base.tick + base.changeover
    safe = dataclasses.replace(base, deadline=10 + needed + 1e-3)
    tight = dataclasses.replace(base, deadline=10 + needed - 1e-3)
    assert not must_run_on_demand(safe)
    assert must_run_on_demand(tight)
    for name, decide in POLICIES.items():
        assert decide(tight) == "on_demand", name


@pytest.mark.parametrize("policy", ["greedy", "uniform_progress", "ours"])
def test_always_available_runs_on_spot_all_the_way(policy: str) -> None:
    res = run([1] * ticks(60), policy)
    assert res.met_deadline
    assert res.launches == 1 and res.interruptions == 0
    assert res.on_demand_hours == 0.0
    assert res.cost == pytest.approx(SPOT_PRICE * (JOB + CHANGEOVER))


def test_on_demand_policy_never_touches_spot() -> None:
    res = run([1] * ticks(60), "on_demand")
    assert res.spot_hours == 0.0 and res.launches == 1
    assert res.cost == pytest.approx(ON_DEMAND_COST)
    assert res.finish_hours == pytest.approx(JOB + CHANGEOVER)


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("deadline", [JOB + CHANGEOVER, 52.0, 72.0])
def test_never_available_uses_on_demand_and_meets_deadline(policy: str, deadline: float) -> None:
    res = run([0] * ticks(deadline), policy, deadline=deadline)
    assert res.met_deadline
    assert res.spot_hours == 0.0
    if policy in ("on_demand", "greedy"):
        assert res.launches == 1  # it waited (for free), then launched on-demand once
        assert res.cost == pytest.approx(ON_DEMAND_COST)
    elif policy == "ours":
        # May pause on-demand once, as its reserve for spot changeovers shrinks with no spot seen.
        assert res.launches <= 2
        assert res.cost <= ON_DEMAND_COST + OD_PRICE * CHANGEOVER + 1e-9
    # uniform_progress toggles on-demand around its line (its hysteresis), paying changeovers.


def test_uniform_progress_pays_for_toggling_on_demand_around_its_line() -> None:
    up, mine = run([0] * ticks(72), "uniform_progress", 72.0), run([0] * ticks(72), "ours", 72.0)
    assert up.launches > 10
    assert mine.cost < up.cost


@pytest.mark.parametrize("policy", ["greedy", "uniform_progress", "ours"])
@pytest.mark.parametrize("lost_at", [49.0, 50.5, 51.0, 51.5])
def test_preemption_just_before_deadline_is_survived(policy: str, lost_at: float) -> None:
    # Spot is gone for the first 3 h (greedy spends its slack waiting), then available until
    # ``lost_at``, then gone for good: whoever is still on spot must relaunch on-demand in time.
    data = [0] * ticks(3) + [1] * (ticks(lost_at) - ticks(3)) + [0] * ticks(10)
    res = run(data, policy)
    assert res.met_deadline, res
    assert res.cost < 0.5 * ON_DEMAND_COST  # and most of it still ran on spot


def test_ours_does_not_chase_one_tick_spot_blips() -> None:
    flapping = [1, 0] * ticks(30)
    results = {name: run(flapping, name) for name in POLICIES}
    assert all(r.met_deadline for r in results.values())
    # A 10-minute spell is shorter than a changeover: it only costs. Ours learns that quickly.
    assert results["ours"].launches <= 6
    assert results["ours"].cost < results["greedy"].cost
    assert results["ours"].cost < results["uniform_progress"].cost
    assert results["ours"].cost <= 1.01 * ON_DEMAND_COST


@pytest.mark.parametrize("policy", list(POLICIES))
def test_slow_flapping_still_meets_deadline_near_on_demand_cost(policy: str) -> None:
    # 30 min up / 30 min down: no spell repays the changeovers it causes, the worst case for any
    # policy that does not know the future. Deadline safety must hold; waste must stay small.
    res = run(([1] * 3 + [0] * 3) * ticks(30), policy)
    assert res.met_deadline
    assert res.cost <= 1.05 * ON_DEMAND_COST


def test_ours_beats_uniform_progress_when_spot_returns_after_an_outage() -> None:
    # 12 h outage, then spot for good. UP buys on-demand to stay on its line; ours spends slack.
    data = [0] * ticks(12) + [1] * ticks(80)
    up, mine = run(data, "uniform_progress", deadline=72.0), run(data, "ours", deadline=72.0)
    assert up.met_deadline and mine.met_deadline
    assert mine.cost < up.cost


def test_decisions_are_pure_functions_of_the_state() -> None:
    state = PolicyState(
        elapsed=5.0,
        deadline=60.0,
        work_done=3.0,
        work_remaining=45.0,
        changeover=0.2,
        spot_available=False,
        running="spot",
        seen_available_hours=3.0,
        seen_unavailable_hours=2.0,
        spot_spells=2,
    )
    for decide in POLICIES.values():
        first = decide(state)
        assert first in ("spot", "on_demand", "wait")
        assert all(decide(state) == first for _ in range(5))
        assert first != "spot"  # never ask for spot when none is available


def test_ours_leaves_on_demand_for_a_young_spell_only_while_slack_is_plentiful() -> None:
    # On on-demand, spot back for 0.4 h. Riding it costs two changeovers of slack (onto spot,
    # back after the preemption). With slack for every spell still expected, take it; with
    # slack for fewer, wait until the spell has proven longer (spells have a falling hazard).
    plenty = PolicyState(
        elapsed=10.0,
        deadline=60.0,
        work_done=10.0,
        work_remaining=39.0,  # slack 11 h: ~26 switches affordable, ~15 spells expected
        changeover=CHANGEOVER,
        spot_available=True,
        running="on_demand",
        seen_available_hours=6.0,
        seen_unavailable_hours=4.0,
        spot_spells=3,
        spell_hours=0.4,
    )
    scarce = dataclasses.replace(plenty, work_remaining=47.0)  # slack 3 h: ~6.6 switches
    assert slack_scarcity(plenty) == 1.0
    assert slack_scarcity(scarce) > 2.0
    assert ours(plenty) == "spot"
    assert ours(scarce) == "on_demand"
    assert ours(dataclasses.replace(scarce, spell_hours=1.0)) == "spot"


def spot_launch_ticks(data: list[int], policy: str | Policy, deadline: float) -> tuple[list[int], RunResult]:
    """The ticks at which ``policy`` launched spot on ``data``, and the run's result."""
    launched: list[int] = []
    decide = get_policy(policy) if isinstance(policy, str) else policy

    def record(state: PolicyState) -> Decision:
        choice = decide(state)
        if choice == "spot" and state.running != "spot":
            launched.append(round(state.elapsed / TICK))
        return choice

    res = run(data, record, deadline)
    return launched, res


def adversary_run(policy: str | Policy, deadline: float) -> RunResult:
    """An adaptive adversary: spot is there all the time, except the tick right after each spot
    launch, so every switch onto spot (from idle or from on-demand) loses its whole changeover.
    Policies are causal, so punishing the earliest unpunished launch leaves the decisions before
    it unchanged; repeat until every launch is punished."""
    data = [1] * ticks(2 * deadline)
    punished: set[int] = set()
    while True:
        launched, res = spot_launch_ticks(data, policy, deadline)
        fresh = [t for t in launched if t not in punished]
        if not fresh:
            break
        punished.add(fresh[0])
        data[fresh[0] + 1] = 0
    assert res.met_deadline, (policy, deadline, res)
    assert res.interruptions == len(punished) >= 1
    return res


@pytest.mark.parametrize("policy", ["ours", "greedy", "uniform_progress"])
@pytest.mark.parametrize("deadline", [52.0, 60.0, 72.0])
def test_spot_that_vanishes_right_after_every_switch_never_costs_the_deadline(
    policy: str, deadline: float
) -> None:
    res = adversary_run(policy, deadline)
    if policy == "ours":  # measured 1.04 / 1.06 / 1.09 x: its spell statistics see long spells (the
        # adversary ends each one only once it is joined) and not its own preemptions
        assert res.cost <= 1.10 * ON_DEMAND_COST


def test_the_planner_too_never_misses_the_deadline_against_the_adversary() -> None:
    # ours_plan (policy/planner.py) at the tightest deadline: the safety net holds it whatever the
    # model believes. Measured 1.05 / 1.11 / 1.15 x on-demand at 52 / 60 / 72 h (10 / 33 / 63
    # launches punished; 60 and 72 h take 5-10 s, so only 52 h runs here): the same blind spot as
    # ours, with a model that trusts the long spells it sees.
    assert adversary_run(plan, 52.0).cost <= 1.06 * ON_DEMAND_COST


@pytest.mark.parametrize("up", [1, 2, 3, 4, 6, 9])
@pytest.mark.parametrize("down", [1, 3, 6])
def test_ours_meets_the_deadline_on_every_short_periodic_pattern(up: int, down: int) -> None:
    # Spells just long enough to tempt the leave-on-demand rule (1-9 ticks: up to 1.5 h, the
    # rule's proof age stretched by scarcity), then gone: the deadline holds at the tightest one.
    res = run(([1] * up + [0] * down) * ticks(30), "ours", deadline=52.0)
    assert res.met_deadline, (up, down, res)
    assert res.cost <= 1.05 * ON_DEMAND_COST
