"""The offline optimum: equal to brute force over every decision sequence, never beaten by a policy.

Brute force runs every sequence of "wait" / "spot" / "on_demand" decisions through ``simulate``
itself, so these tests pin the optimum to the simulator's model, not to a re-implementation of it.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from airflow_cloudtrain.policy import (
    POLICIES,
    Decision,
    PolicyState,
    RunResult,
    Trace,
    load_trace,
    optimal_cost,
    optimal_costs,
    optimal_plan,
    simulate,
)

pytest.importorskip("numpy")  # the optimum needs numpy; the policies do not

TRACES = Path(__file__).resolve().parents[2] / "airflow_cloudtrain" / "policy" / "data" / "traces"
TICK = 1.0 / 6.0
SPOT, OD = 0.3, 1.0
CHOICES: tuple[Decision, ...] = ("wait", "spot", "on_demand")


def kwargs(job: float, deadline: float, changeover: float, gap: float) -> dict[str, float]:
    return {
        "job_hours": job,
        "deadline_hours": deadline,
        "changeover_hours": changeover,
        "spot_price": SPOT,
        "on_demand_price": OD,
        "gap_hours": gap,
    }


def replay(trace: Trace | Sequence[int], plan: Sequence[Decision], gap: float, **kw: float) -> RunResult:
    """Run a fixed decision list, one per tick, through the simulator (on-demand after it ends)."""
    decisions = list(plan)

    def decide(state: PolicyState) -> Decision:
        k = round(state.elapsed / gap)
        return decisions[k] if k < len(decisions) else "on_demand"

    return simulate(trace, decide, **kw)


def brute_force(data: list[int], job: float, deadline: float, changeover: float, gap: float) -> RunResult:
    """The cheapest of all decision sequences over the deadline window that meet the deadline."""
    kw = kwargs(job, deadline, changeover, gap)
    n = math.ceil(deadline / gap) + 1
    best: RunResult | None = None
    for plan in itertools.product(CHOICES, repeat=n):
        if any(c == "spot" and not (i < len(data) and data[i]) for i, c in enumerate(plan)):
            continue  # the simulator rejects spot on a 0 tick
        res = replay(data, plan, gap, **kw)
        if res.met_deadline and (best is None or res.cost < best.cost):
            best = res
    assert best is not None
    return best


def assert_same_run(a: RunResult, b: RunResult) -> None:
    assert a.cost == pytest.approx(b.cost, abs=1e-9)
    assert a.met_deadline == b.met_deadline
    assert a.finish_hours == pytest.approx(b.finish_hours, abs=1e-9)
    assert (a.launches, a.interruptions) == (b.launches, b.interruptions)
    assert a.spot_hours == pytest.approx(b.spot_hours, abs=1e-9)
    assert a.on_demand_hours == pytest.approx(b.on_demand_hours, abs=1e-9)


def markov(rng: random.Random, n: int) -> list[int]:
    leave_up, leave_down = rng.uniform(0.01, 0.6), rng.uniform(0.01, 0.6)
    up, out = rng.random() < 0.5, []
    for _ in range(n):
        out.append(int(up))
        if rng.random() < (leave_up if up else leave_down):
            up = not up
    return out


HAND_MADE = [
    # (trace, job, deadline, changeover, gap): blips, late spot, tight and loose deadlines.
    ([1, 1, 0, 1, 1, 1, 1], 1.0, 1.5, 0.25, 0.25),
    ([1, 1, 0, 1, 1, 1, 1], 1.0, 1.25, 0.25, 0.25),
    ([0, 0, 1, 1, 1, 1, 1, 1], 1.0, 2.0, 0.25, 0.25),
    ([1, 0, 1, 0, 1, 0, 1, 0], 1.0, 2.0, 0.0, 0.25),
    ([1, 0, 1, 0, 1, 0, 1, 0], 1.0, 2.0, 0.5, 0.25),
    ([1, 1, 1, 0, 0, 0, 1, 1], 0.75, 1.75, 0.5, 0.25),
    ([0, 1, 1, 1], 1.0, 2.0, 0.75, 0.5),
    ([1, 1, 1, 1, 1, 0, 0, 1, 1], 0.5, 1.2, 0.2, TICK),  # 10-minute ticks, 0.2 h changeover
    ([1, 0, 1, 1, 1, 1, 1, 1, 1], 0.5, 1.0, 0.2, TICK),
]


@pytest.mark.parametrize(("data", "job", "deadline", "changeover", "gap"), HAND_MADE)
def test_equals_brute_force_on_hand_made_traces(
    data: list[int], job: float, deadline: float, changeover: float, gap: float
) -> None:
    kw = kwargs(job, deadline, changeover, gap)
    best = brute_force(data, job, deadline, changeover, gap)
    result, plan = optimal_plan(data, **kw)
    assert result.cost == pytest.approx(best.cost, abs=1e-9)
    assert result.met_deadline
    assert_same_run(replay(data, plan, gap, **kw), result)  # its own plan costs what it says
    assert optimal_costs(data, [0], **kw) == [pytest.approx(result.cost, abs=1e-12)]


def test_equals_brute_force_on_random_tiny_traces() -> None:
    rng = random.Random(11)
    for _ in range(25):
        gap = rng.choice([0.25, 0.5, TICK])
        changeover = rng.choice([0.0, 0.2, 0.25, 0.5])
        job = rng.choice([0.5, 0.75, 1.0])
        deadline = job + changeover + rng.choice([0.0, 0.25, 0.5, 0.75])
        if math.ceil(deadline / gap) + 1 > 8:
            continue
        data = [int(rng.random() < 0.6) for _ in range(10)]
        case = (data, job, deadline, changeover, gap)
        best = brute_force(data, job, deadline, changeover, gap)
        assert optimal_cost(data, **kwargs(job, deadline, changeover, gap)).cost == pytest.approx(
            best.cost, abs=1e-9
        ), case


def test_known_answers() -> None:
    kw = kwargs(10.0, 12.0, 0.2, TICK)
    always = optimal_cost([1] * 100, **kw)
    assert always.cost == pytest.approx(SPOT * 10.2) and always.launches == 1 and always.on_demand_hours == 0
    never = optimal_cost([0] * 100, **kw)
    assert never.cost == pytest.approx(OD * 10.2) and never.spot_hours == 0 and never.met_deadline
    # A one-tick blip: wait it out and relaunch spot (one more changeover), if the slack allows.
    blip = [1] * 30 + [0] + [1] * 100
    waited = optimal_cost(blip, **kw)
    assert waited.cost == pytest.approx(SPOT * 10.4)
    assert (waited.launches, waited.interruptions, waited.on_demand_hours) == (2, 1, 0.0)
    # With less slack than the blip costs, spot from the start cannot finish in time.
    tight = optimal_cost(blip, **kwargs(10.0, 10.3, 0.2, TICK))
    assert tight.met_deadline and tight.cost == pytest.approx(OD * 10.2)
    # Spot only after 2 h: with 2.5 h of slack, wait for it.
    late = optimal_cost([0] * 12 + [1] * 100, **kwargs(10.0, 12.5, 0.2, TICK))
    assert late.cost == pytest.approx(SPOT * 10.2) and late.finish_hours == pytest.approx(12.2)


def test_infeasible_deadline_returns_the_earliest_finish() -> None:
    kw = kwargs(10.0, 10.1, 0.2, TICK)  # shorter than job + changeover: nothing can make it
    result = optimal_cost([1] * 100, **kw)
    assert not result.met_deadline
    assert result.finish_hours == pytest.approx(10.2) and result.cost == pytest.approx(SPOT * 10.2)
    assert result.finish_hours == pytest.approx(simulate([1] * 100, POLICIES["on_demand"], **kw).finish_hours)
    with pytest.raises(ValueError, match="infeasible"):
        optimal_costs([1] * 100, [0], **kw)
    with pytest.raises(ValueError, match="gap_hours"):
        optimal_cost(
            [1] * 100, job_hours=1, deadline_hours=2, changeover_hours=0.2, spot_price=1, on_demand_price=2
        )


def test_without_a_common_unit_it_is_an_achievable_upper_bound() -> None:
    # A tick of pi/20 h and a 0.2 h changeover share no unit: the changeover is rounded up.
    gap = math.pi / 20
    data = [1, 1, 0, 1, 1, 1, 0, 1]
    kw = kwargs(0.6, 1.1, 0.2, gap)
    result, plan = optimal_plan(data, **kw)
    best = brute_force(data, 0.6, 1.1, 0.2, gap)
    assert result.cost >= best.cost - 1e-9
    assert result.cost <= best.cost * 1.05  # rounding by a 1/60 of a tick costs little
    achieved = replay(data, plan, gap, **kw)
    assert achieved.met_deadline and achieved.cost <= result.cost + 1e-9


def test_never_beaten_by_a_policy_on_random_traces() -> None:
    rng = random.Random(20240416)
    for case in range(60):
        gap = rng.choice([TICK, 0.25, 0.05])
        job = rng.uniform(1.0, 20.0)
        changeover = rng.choice([0.0, 0.1, 0.2, 0.5])
        deadline = job + changeover + rng.choice([0.0, rng.uniform(0.0, 1.0), rng.uniform(0.0, job)])
        data = markov(rng, int(2 * deadline / gap) + 10)
        kw = kwargs(job, deadline, changeover, gap)
        best = optimal_cost(data, **kw)
        assert best.met_deadline, case  # on-demand from the start can, so the optimum does
        assert best.finish_hours is not None and best.finish_hours <= deadline + 1e-9
        for name, decide in POLICIES.items():
            res = simulate(data, decide, **kw)
            assert res.met_deadline, (case, name)
            assert best.cost <= res.cost + 1e-9, (case, name, best, res)


def test_never_beaten_and_replayable_on_the_real_traces() -> None:
    rng = random.Random(3)
    paths = sorted(TRACES.rglob("*.json"))
    assert paths, f"no traces in {TRACES}"
    for path in paths:
        trace = load_trace(path)
        for deadline in (48.5, 52.0, 72.0):
            kw = kwargs(48.0, deadline, 0.2, trace.gap_hours)
            del kw["gap_hours"]
            starts = [*rng.sample(range(len(trace.data)), 3), len(trace.data) - 20]
            batch = optimal_costs(trace, starts, **kw)
            for start, batch_cost in zip(starts, batch, strict=True):
                best, plan = optimal_plan(trace, start=start, **kw)
                assert best.met_deadline and best.cost == pytest.approx(batch_cost, rel=1e-12)
                assert_same_run(replay(trace, plan, trace.gap_hours, start=start, **kw), best)
                for name, decide in POLICIES.items():
                    res = simulate(trace, decide, start=start, **kw)
                    assert res.met_deadline and best.cost <= res.cost + 1e-9, (path.name, start, name)
