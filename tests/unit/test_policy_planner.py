"""``ours_plan`` (policy/planner.py): the stochastic program's decisions in states whose answer is
clear, the hard deadline override, and that it reads nothing but the past.

Hours throughout; 10-minute ticks, a 48 h job and 0.2 h changeovers as in the benchmark.
"""

from __future__ import annotations

import dataclasses

import pytest

from airflow_cloudtrain.policy import PolicyState, must_run_on_demand, simulate
from airflow_cloudtrain.policy.base import Decision
from airflow_cloudtrain.policy.planner import SpellModel, chain, model_scales, plan, plan_zones

pytest.importorskip("numpy")

TICK = 1.0 / 6.0


def state(slack: float, **kw: object) -> PolicyState:
    """10 h into a 48 h job with 40 h of work left and ``slack`` hours to spare; 4 spells seen."""
    base = {
        "elapsed": 10.0,
        "deadline": 10.0 + 40.0 + slack,
        "work_done": 8.0,
        "work_remaining": 40.0,
        "changeover": 0.2,
        "tick": TICK,
        "price_ratio": 0.32,
        "seen_available_hours": 5.0,
        "seen_unavailable_hours": 5.0,
        "spot_spells": 4,
        "spot_available": True,
    }
    return PolicyState(**{**base, **kw})  # type: ignore[arg-type]


def test_plenty_of_slack_and_a_spell_seen_long_leaves_on_demand_for_spot() -> None:
    assert plan(state(8.0, running="on_demand", spell_hours=2.0)) == "spot"
    assert plan(state(8.0, running=None, spell_hours=0.0)) == "spot"  # launch from idle


def test_slack_nearly_gone_stays_on_or_starts_on_demand() -> None:
    young = state(1.0, running="on_demand", spell_hours=0.0)
    assert not must_run_on_demand(young)  # the program's own choice, not the safety net's
    assert plan(young) == "on_demand"
    assert plan(state(1.0, running=None, spot_available=False, spell_hours=0.0)) == "on_demand"


def test_an_outage_with_slack_to_spare_is_waited_out() -> None:
    assert plan(state(8.0, running=None, spot_available=False, spell_hours=0.0)) == "wait"


def test_a_spell_young_and_slack_scarce_is_not_worth_leaving_on_demand_but_an_old_one_is() -> None:
    # The falling hazard: a spell 2 h old is expected to last far longer than a fresh one.
    assert plan(state(4.0, running="on_demand", spell_hours=0.0)) == "on_demand"
    assert plan(state(4.0, running="on_demand", spell_hours=2.0)) == "spot"


def test_the_safety_net_overrides_the_program() -> None:
    pinned = state(0.3, running=None, spell_hours=5.0)  # slack < tick + changeover
    assert must_run_on_demand(pinned)
    assert plan(pinned) == "on_demand"
    assert plan_zones(dataclasses.replace(pinned, spot_available=False), 3) == "on_demand"


def test_over_zones_it_plans_on_the_availability_it_has_seen_there() -> None:
    # No forced try of every zone: the outages the run saw (across the zones it tried) are the model.
    for s in (
        state(1.0, running=None, spot_available=False),
        state(8.0, running=None, spot_available=False),
        state(4.0, running="on_demand", spell_hours=2.0),
    ):
        assert plan_zones(s, 3) == plan(s)


def test_model_scales_follow_what_the_run_saw() -> None:
    short = state(8.0, seen_available_hours=2.0, spot_spells=20)  # spells of 0.1 h
    long = state(8.0, seen_available_hours=60.0, spot_spells=2)
    assert model_scales(short)[0] < 0 < model_scales(long)[0]
    assert model_scales(state(8.0, seen_available_hours=0.0, seen_unavailable_hours=0.0, spot_spells=0)) == (
        0,
        0,
    )


def test_the_availability_chain_is_a_chain_with_a_falling_hazard() -> None:
    up = SpellModel(((0.7, 0.5), (0.3, 5.0)), 1.0)
    p, is_up = chain(TICK, up, up)
    assert all(abs(sum(row) - 1.0) < 1e-12 and min(row) >= 0.0 for row in p)
    nb = is_up.count(True)
    ends = [p[b][nb] for b in range(nb)]  # up bucket b -> first down bucket
    assert ends == sorted(ends, reverse=True) and ends[0] > 2 * ends[-1]


def run_recording(data: list[int], deadline: float) -> list[Decision]:
    decisions: list[Decision] = []

    def record(s: PolicyState) -> Decision:
        decisions.append(plan(s))
        return decisions[-1]

    job = {"job_hours": 12.0, "changeover_hours": 0.2, "spot_price": 0.32, "on_demand_price": 1.0}
    simulate(data, record, deadline_hours=deadline, gap_hours=TICK, **job)
    return decisions


def test_it_never_reads_the_future_of_the_trace() -> None:
    # Two traces equal for the first 30 ticks, then opposite: the first 30 decisions are the same.
    head = ([1] * 7 + [0] * 3) * 3
    a = head + [1] * 200
    b = head + [0] * 200
    da, db = run_recording(a, 16.0), run_recording(b, 16.0)
    assert da[:30] == db[:30]
    assert da[30:] != db[30:]
