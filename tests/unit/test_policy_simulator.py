"""The trace simulator's accounting, the deadline guarantee as a property, and the benchmark CLI."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_cloudtrain.policy import (
    POLICIES,
    PolicyState,
    SimulationError,
    get_policy,
    load_trace,
    simulate,
)

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "airflow_cloudtrain" / "policy" / "data" / "traces"  # shipped: see SOURCE.md there
TICK = 1.0 / 6.0


def sim(data: list[int], policy: str, job: float, deadline: float, gap: float = TICK, **kw: float):
    return simulate(
        data,
        get_policy(policy),
        job_hours=job,
        deadline_hours=deadline,
        changeover_hours=kw.get("changeover", 0.2),
        spot_price=kw.get("spot_price", 0.3),
        on_demand_price=1.0,
        gap_hours=gap,
    )


def markov_trace(rng: random.Random, n: int) -> list[int]:
    """Bursty availability: a two-state Markov chain with random spell lengths."""
    leave_up, leave_down = rng.uniform(0.01, 0.6), rng.uniform(0.01, 0.6)
    up = rng.random() < 0.5
    out = []
    for _ in range(n):
        out.append(int(up))
        if rng.random() < (leave_up if up else leave_down):
            up = not up
    return out


def test_accounting_with_one_preemption() -> None:
    # 10 h of spot, a one-tick outage, spot again: greedy relaunches and pays a second changeover.
    data = [1] * 60 + [0] + [1] * 200
    res = sim(data, "greedy", job=20.0, deadline=30.0)
    assert (res.launches, res.interruptions) == (2, 1)
    assert res.finish_hours == pytest.approx(20.0 + 2 * 0.2 + TICK)
    assert res.cost == pytest.approx(0.3 * (20.0 + 2 * 0.2))
    assert res.on_demand_hours == 0.0 and res.met_deadline


def test_billing_stops_mid_tick_when_work_is_done() -> None:
    res = sim([1] * 100, "on_demand", job=1.05, deadline=5.0)
    assert res.finish_hours == pytest.approx(1.25)
    assert res.cost == pytest.approx(1.25)


def test_ticks_past_the_end_of_the_trace_count_as_unavailable() -> None:
    res = sim([1] * 6, "greedy", job=3.0, deadline=4.0)
    assert res.met_deadline and res.interruptions == 1 and res.on_demand_hours > 0


def test_asking_for_spot_while_none_is_available_is_an_error() -> None:
    with pytest.raises(SimulationError, match="none is available"):
        simulate(
            [0, 0],
            lambda s: "spot",
            job_hours=1,
            deadline_hours=2,
            changeover_hours=0.2,
            spot_price=0.3,
            on_demand_price=1.0,
            gap_hours=TICK,
        )
    with pytest.raises(SimulationError, match="expected"):
        simulate(
            [1, 1],
            lambda s: "cheap",
            job_hours=1,
            deadline_hours=2,
            changeover_hours=0.2,
            spot_price=0.3,
            on_demand_price=1.0,
            gap_hours=TICK,
        )  # type: ignore[arg-type,return-value]


def test_simulator_feeds_only_the_past_to_the_policy() -> None:
    seen: list[PolicyState] = []

    def spy(state: PolicyState) -> str:
        seen.append(state)
        return "spot" if state.spot_available else "wait"

    data = [1, 1, 0, 0, 0, 1, 1, 1] + [1] * 30
    simulate(
        data,
        spy,
        job_hours=1.0,
        deadline_hours=6.0,
        changeover_hours=0.2,  # type: ignore[arg-type]
        spot_price=0.3,
        on_demand_price=1.0,
        gap_hours=TICK,
    )
    s = seen[6]  # third tick of the second spell
    assert s.spot_available and s.spot_spells == 2
    assert s.seen_available_hours == pytest.approx(3 * TICK)  # ticks 0, 1 and 5; not tick 6 itself
    assert s.seen_unavailable_hours == pytest.approx(3 * TICK)
    assert s.spell_hours == pytest.approx(TICK) and s.running == "spot"
    assert seen[2].running is None and seen[2].interruptions == 1


def test_same_input_gives_same_output() -> None:
    data = markov_trace(random.Random(3), 600)
    for name in POLICIES:
        assert sim(data, name, 40.0, 60.0) == sim(data, name, 40.0, 60.0)


def test_no_policy_misses_a_deadline_on_demand_could_meet_on_random_traces() -> None:
    rng = random.Random(20240416)
    for case in range(300):
        gap = rng.choice([TICK, 0.25, 0.05])
        job = rng.uniform(1.0, 30.0)
        changeover = rng.choice([0.0, 0.1, 0.2, 0.5])
        deadline = job + changeover + rng.choice([0.0, rng.uniform(0.0, 1.0), rng.uniform(0.0, job)])
        data = markov_trace(rng, int(2 * deadline / gap) + 10)
        for name in POLICIES:
            res = sim(data, name, job, deadline, gap=gap, changeover=changeover)
            assert res.met_deadline, (case, name, gap, job, changeover, deadline, res)


def test_ours_meets_every_deadline_on_the_real_traces() -> None:
    paths = sorted(TRACES.rglob("*.json"))
    assert paths
    rng = random.Random(7)
    decide = get_policy("deadline")
    for path in paths:
        trace = load_trace(path)
        for deadline in (48.2, 48.5, 52.0, 72.0):
            window = int(deadline / trace.gap_hours) + 1
            for start in rng.sample(range(len(trace.data) - window), 25):
                res = simulate(
                    trace,
                    decide,
                    job_hours=48.0,
                    deadline_hours=deadline,
                    changeover_hours=0.2,
                    spot_price=0.32,
                    on_demand_price=1.0,
                    start=start,
                )
                assert res.met_deadline, (path.name, deadline, start, res)


def run_benchmark_json(traces: Path, *extra: str) -> dict[str, Any]:
    rng = random.Random(1)
    for name in ("us-west-2a_v100_1", "us-west-2b_k80_8"):
        payload = {"metadata": {"gap_seconds": 600}, "data": markov_trace(rng, 400)}
        (traces / f"{name}.json").write_text(json.dumps(payload))
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "spot_policy.py"),
        "--traces",
        str(traces),
        "--job-hours",
        "6",
        "--deadline-hours",
        "9",
        "--start-every-hours",
        "12",
        "--workers",
        "1",
        "--json",
        *extra,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
    return json.loads(out)


def test_benchmark_json_shape(tmp_path: Path) -> None:
    pytest.importorskip("numpy")  # for the optimum
    report = run_benchmark_json(tmp_path)
    assert list(report) == ["policies", "optimum"]
    assert set(report["policies"]) == {"on_demand", "greedy", "uniform_progress", "ours"}
    runs = 2 * len(range(0, 400 - 54 + 1, 72))
    optimum = report["optimum"]
    assert optimum["runs"] == runs and optimum["deadlines_met"] == 1.0
    assert optimum["mean_changeovers"] is None  # the batched optimum computes costs only
    for name, row in report["policies"].items():
        assert 0.0 < row["cost_vs_on_demand"] <= 1.5, name
        assert 0.0 <= row["deadlines_met"] <= 1.0, name
        assert row["runs"] == runs, name
        # Per run, no policy is cheaper than the optimum, so neither is any mean of them.
        assert row["cost_vs_on_demand"] >= optimum["cost_vs_on_demand"] - 1e-4, name
        assert row["gap_to_optimum"] >= -1e-4, name
        assert set(row["gap_by_deadline"]) == {"9"}, name
    assert report["policies"]["on_demand"]["cost_vs_on_demand"] == pytest.approx(1.0)
    assert report["policies"]["ours"]["deadlines_met"] == 1.0
    assert report["policies"]["ours"]["cost_vs_on_demand"] < 1.0


def test_benchmark_json_without_optimum(tmp_path: Path) -> None:
    report = run_benchmark_json(tmp_path, "--no-optimum")
    assert list(report) == ["policies"]
    assert all("gap_to_optimum" not in row for row in report["policies"].values())
