"""The fast optimum (policy/bounds.py): lower <= exact optimum <= upper, tight on real traces.

The exact program of policy/optimum.py is itself pinned to the simulator by brute force
(test_policy_optimum.py); here the Lagrangian bounds are pinned to it, and the C pass to numpy.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from airflow_cloudtrain.policy import bounds_c, load_trace, optimal_cost, optimal_costs
from airflow_cloudtrain.policy.bounds import Moves, optimum_bounds
from airflow_cloudtrain.policy.multizone import load_zone_sets, ours_zones, simulate_zones

np = pytest.importorskip("numpy")

TRACES = Path(__file__).resolve().parents[2] / "airflow_cloudtrain" / "policy" / "data" / "traces"
TICK = 1.0 / 6.0


def kw(job: float, deadline: float, changeover: float = 0.2, gap: float = TICK) -> dict[str, float]:
    return {
        "job_hours": job,
        "deadline_hours": deadline,
        "changeover_hours": changeover,
        "spot_price": 0.32,
        "on_demand_price": 1.0,
        "gap_hours": gap,
    }


def test_sandwiches_the_exact_optimum_on_random_small_traces() -> None:
    rng = random.Random(7)
    for i in range(16):
        n = rng.randint(30, 80)
        data = [int(rng.random() < rng.uniform(0.2, 0.9)) for _ in range(n)]
        job = rng.uniform(2.0, 5.0)
        deadline = job + rng.uniform(0.3, 3.0)
        if i % 2:  # a whole number of ticks: the upper bound is reported too
            deadline = math.ceil(deadline / TICK) * TICK
        changeover = rng.choice([0.1, 0.2, 0.25, 1.0 / 3.0])
        args = kw(job, deadline, changeover)
        exact = optimal_cost(data, **args).cost
        b = optimum_bounds([data], [0], **args)
        assert b.lower[0] <= exact + 1e-9 <= b.upper[0] + 2e-9, (data, job, deadline, changeover)
        assert math.isfinite(b.upper[0]) == bool(i % 2)


def test_within_half_a_percent_of_the_exact_optimum_on_a_sample_of_the_shipped_traces() -> None:
    """The benchmark reports the lower bound where the exact program is too slow: this is how
    far below the true optimum that figure is (a gap to it over-states a policy's gap)."""
    trace = load_trace(TRACES / "aws-10-26-2022" / "us-west-2a_v100_8.json")
    starts = list(range(0, 3400, 301))
    for deadline in (52.0, 72.0):
        args = kw(48.0, deadline, gap=trace.gap_hours)
        exact = np.array(optimal_costs(trace, starts, **args))
        b = optimum_bounds([trace.data], starts, **args)
        assert (b.lower <= exact + 1e-9).all() and (exact <= b.upper + 1e-9).all()
        below = exact / b.lower - 1.0
        assert below.mean() < 0.005, (deadline, below)
        assert below.max() < 0.02, (deadline, below)


def test_independent_zones_batched_together_equal_one_at_a_time() -> None:
    a = load_trace(TRACES / "aws-10-26-2022" / "us-west-2a_v100_1.json")
    b = load_trace(TRACES / "aws-10-26-2022" / "us-west-2b_v100_1.json")
    starts = [0, 500, 1700]
    args = kw(24.0, 30.0, gap=a.gap_hours)
    both = optimum_bounds([a.data, b.data], starts * 2, zone_of_run=[0, 0, 0, 1, 1, 1], **args)
    one_a = optimum_bounds([a.data], starts, **args)
    one_b = optimum_bounds([b.data], starts, **args)
    assert np.allclose(both.lower, np.concatenate([one_a.lower, one_b.lower]))


def test_more_zones_never_cost_more_and_an_empty_zone_changes_nothing() -> None:
    a = load_trace(TRACES / "aws-10-26-2022" / "us-west-2a_v100_8.json").data
    b = load_trace(TRACES / "aws-10-26-2022" / "us-west-2b_v100_8.json").data
    starts = [0, 900, 2000]
    args = kw(24.0, 30.0)
    single = optimum_bounds([a], starts, **args)
    with_empty = optimum_bounds([a, [0] * len(a)], starts, moves=Moves(0.05), **args)
    assert np.allclose(single.lower, with_empty.lower) and np.allclose(single.upper, with_empty.upper)
    two = optimum_bounds([a, b], starts, moves=Moves(0.05), **args)
    assert (two.lower <= single.lower + 1e-9).all()
    # an identical second zone adds nothing a run could use
    twin = optimum_bounds([a, a], starts, moves=Moves(0.05), **args)
    assert np.allclose(twin.lower, single.lower)


def test_no_zone_aware_run_beats_the_multi_zone_lower_bound() -> None:
    (zone_set,) = load_zone_sets(TRACES / "16-node-aws-08-27-2023")
    moves = Moves(0.05, 0.044, 0.4)
    starts = list(range(0, 3800, 397))
    args = kw(24.0, 30.0, gap=zone_set.gap_hours)
    b = optimum_bounds(zone_set.available(), starts, regions=zone_set.regions, moves=moves, **args)
    sim_args = {k: v for k, v in args.items() if k != "gap_hours"}
    for i, start in enumerate(starts):
        run = simulate_zones(zone_set, ours_zones, moves=moves, start=start, **sim_args)
        assert run.met_deadline
        assert run.cost >= b.lower[i] - 1e-9, (start, run, b.lower[i])


def test_compiled_pass_equals_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    if bounds_c.library() is None:
        pytest.skip("no C compiler here: the numpy pass is the only one")
    (zone_set,) = load_zone_sets(TRACES / "16-node-aws-08-27-2023")
    starts = [0, 777, 2500]
    args = kw(12.0, 16.0, gap=zone_set.gap_hours)
    moves = Moves(0.05, 0.044, 0.4)
    compiled = optimum_bounds(zone_set.available(), starts, regions=zone_set.regions, moves=moves, **args)
    monkeypatch.setenv("CLOUDTRAIN_BOUNDS_NUMPY", "1")
    plain = optimum_bounds(zone_set.available(), starts, regions=zone_set.regions, moves=moves, **args)
    assert np.array_equal(compiled.lower, plain.lower) and np.array_equal(compiled.upper, plain.upper)


def test_rejects_a_deadline_no_schedule_can_meet() -> None:
    with pytest.raises(ValueError, match="infeasible"):
        optimum_bounds([[1] * 10], [0], **kw(1.0, 1.1))
