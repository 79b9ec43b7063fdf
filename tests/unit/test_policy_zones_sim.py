"""The multi-zone simulator and ours_zones: moves instead of on-demand, same model as one zone."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_cloudtrain.policy import POLICIES, Decision, PolicyState, load_trace, ours, simulate
from airflow_cloudtrain.policy.bounds import Moves
from airflow_cloudtrain.policy.multizone import (
    ZoneSet,
    as_operator,
    load_zone_sets,
    ours_zones,
    region_of,
    simulate_zones,
    single_zone,
)

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "airflow_cloudtrain" / "policy" / "data" / "traces"
TICK = 1.0 / 6.0
ARGS = {
    "job_hours": 4.0,
    "deadline_hours": 6.0,
    "changeover_hours": 0.2,
    "spot_price": 0.3,
    "on_demand_price": 1.0,
}


def zone_set(
    *rows: list[int], zones: tuple[str, ...] = ("us-west-2a", "us-west-2b", "us-east-2a")
) -> ZoneSet:
    names = zones[: len(rows)]
    return ZoneSet("v100_1", TICK, names, tuple(region_of(z) for z in names), tuple(tuple(r) for r in rows))


def test_shipped_zone_sets_are_grouped_by_instance_with_their_regions() -> None:
    sets = {s.group: s for s in load_zone_sets(TRACES / "aws-10-26-2022")}
    assert set(sets) == {"k80_1", "k80_8", "v100_1", "v100_8"}
    assert sets["v100_1"].zones == ("us-west-2a", "us-west-2b")
    assert sets["v100_1"].regions == ("us-west-2", "us-west-2")
    (sixteen,) = load_zone_sets(TRACES / "16-node-aws-08-27-2023")
    assert sixteen.regions == ("us-east-2", "us-west-2", "us-west-2")
    assert max(max(c) for c in sixteen.counts) == 16
    # us-east-2b's file is shorter: padded as unavailable, like ticks past any trace's end
    assert all(len(row) == sixteen.ticks for row in sixteen.available())


def test_one_zone_is_exactly_the_single_zone_simulator() -> None:
    trace = load_trace(TRACES / "aws-10-26-2022" / "us-west-2b_v100_8.json")
    one = ZoneSet("v100_8", trace.gap_hours, ("us-west-2b",), ("us-west-2",), (trace.data,))
    args = dict(ARGS, job_hours=24.0, deadline_hours=30.0)
    for name in ("greedy", "uniform_progress", "ours"):
        for start in (0, 1111, 2900):
            a = simulate(trace, POLICIES[name], start=start, **args)
            b = simulate_zones(one, single_zone(POLICIES[name]), start=start, **args)
            assert (a.cost, a.finish_hours, a.launches, a.interruptions) == pytest.approx(
                (b.cost, b.finish_hours, b.launches, b.interruptions)
            ), (name, start)
            assert b.moves == 0


def test_after_preemptions_ours_zones_moves_to_the_zone_with_spot_instead_of_on_demand() -> None:
    a = [1] * 6 + [0] * 60
    b = [0] * 8 + [1] * 58
    args = dict(ARGS, deadline_hours=8.0)  # slack enough to look for spot rather than pay for on-demand
    run = simulate_zones(zone_set(a, b), ours_zones, moves=Moves(restore_hours=0.05), **args)
    assert run.met_deadline and run.moves == 1 and run.interruptions == 1
    assert run.on_demand_hours == 0.0
    # limited to the first zone (regions=[one zone] in the operator), it falls back as before
    stuck = simulate_zones(zone_set(a), single_zone(ours), **args)
    assert stuck.moves == 0 and stuck.on_demand_hours > 0 and stuck.cost > run.cost


def test_a_move_pays_restore_time_and_across_regions_transfer_and_egress() -> None:
    a = [1] * 3 + [0] * 60
    b = [0] * 4 + [1] * 59
    moves = Moves(restore_hours=TICK, transfer_hours=TICK, egress_usd=0.7)
    same = simulate_zones(zone_set(a, b), ours_zones, moves=moves, **ARGS)
    other = simulate_zones(
        zone_set(a, b, zones=("us-west-2a", "us-east-2a")), ours_zones, moves=moves, **ARGS
    )
    assert same.moves == other.moves == 1
    # same decisions; the cross-region move costs one more tick of spot setup and the egress
    assert other.finish_hours == pytest.approx(same.finish_hours + TICK)
    assert other.cost == pytest.approx(same.cost + 0.3 * TICK + 0.7)


def test_a_zone_is_seen_only_when_tried() -> None:
    """No clairvoyance: the policy is told about one zone per tick, the one it runs in or tries."""
    rows = [[1, 0] * 30, [0, 1] * 30, [1] * 60]
    seen: list[tuple[float, bool]] = []

    def spy(state: PolicyState, zones: int) -> Decision:
        seen.append((state.elapsed, state.spot_available))
        return "wait"

    simulate_zones(zone_set(*rows), spy, max_hours=10 * TICK, **ARGS)
    # us-east-2a has spot all along, but the run learns it only when it gets there: it tries
    # us-west-2a (spot), again (none: trouble), us-west-2b (none), then us-east-2a
    assert [avail for _, avail in seen[:4]] == [True, False, False, True]


def test_gangs_need_all_their_nodes_free_in_one_zone() -> None:
    counts = [[3] * 40, [8] * 40]
    zs = zone_set(*counts)
    assert zs.available(4) == [[0] * 40, [1] * 40]
    run = simulate_zones(zs, ours_zones, nodes=8, **dict(ARGS, job_hours=2.0, deadline_hours=4.0))
    assert run.met_deadline and run.on_demand_hours == 0.0
    gang_of_9 = simulate_zones(zs, ours_zones, nodes=9, **dict(ARGS, job_hours=2.0, deadline_hours=4.0))
    assert gang_of_9.spot_hours == 0.0 and gang_of_9.met_deadline


def test_ours_zones_meets_every_deadline_on_the_shipped_zone_sets() -> None:
    for folder in ("aws-10-26-2022", "16-node-aws-08-27-2023"):
        for zs in load_zone_sets(TRACES / folder):
            window = int(52.0 / zs.gap_hours)
            for start in range(0, zs.ticks - window, zs.ticks // 5):
                run = simulate_zones(
                    zs,
                    ours_zones,
                    moves=Moves(0.05, 0.044, 0.4),
                    start=start,
                    job_hours=48.0,
                    deadline_hours=52.0,
                    changeover_hours=0.2,
                    spot_price=0.32,
                    on_demand_price=1.0,
                )
                assert run.met_deadline, (folder, zs.group, start)


def markov(rng: random.Random, n: int) -> list[int]:
    up, out = rng.random() < 0.5, []
    for _ in range(n):
        out.append(int(up))
        if rng.random() < 0.1:
            up = not up
    return out


def run_zones_json(traces: Path, *extra: str) -> dict[str, Any]:
    rng = random.Random(3)
    for name in ("us-west-2a_v100_1", "us-west-2b_v100_1", "us-east-2a_v100_1"):
        payload = {"metadata": {"gap_seconds": 600}, "data": markov(rng, 300)}
        (traces / f"{name}.json").write_text(json.dumps(payload))
    cmd = [sys.executable, str(REPO / "benchmarks" / "spot_policy.py"), "--zones", "--traces", str(traces)]
    cmd += ["--job-hours", "6", "--deadline-hours", "9", "--start-every-hours", "12", "--workers", "1"]
    out = subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=300, check=True).stdout
    return out if "--json" not in extra else json.loads(out)  # type: ignore[return-value]


def test_benchmark_zones_json_shape(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    report = run_zones_json(tmp_path, "--json", "--nodes", "1", "--planner")
    assert list(report) == [
        "mode",
        "traces",
        "zone_sets",
        "nodes",
        "moves",
        "policies",
        "nodes_free",
        "wall_seconds",
    ]
    assert report["zone_sets"] == {"v100_1": ["us-east-2a", "us-west-2a", "us-west-2b"]}
    names = ["on_demand", "greedy", "uniform_progress", "ours", "ours_zones"]
    operator = ["ours_operator", "ours_zones_operator"]
    planned = ["ours_plan", "ours_plan_zones", "ours_plan_operator", "ours_plan_zones_operator"]
    optima = ["optimum_single_zone", "optimum_multi_zone"]
    assert list(report["policies"]) == [*names, *operator, *planned, *optima]
    for name in planned:  # --planner's rows (policy/planner.py): same runs, every deadline met
        row = report["policies"][name]
        assert row["deadlines_met"] == 1.0 and row["cpu_ms_per_run"] > 0.0, name
        assert row["zones"] == ("multi" if "zones" in name else "single")
        assert row["runs"] == report["policies"]["ours_zones" if "zones" in name else "ours"]["runs"]
    starts = len(range(0, 300 - 54 + 1, 72))
    multi_opt = report["policies"]["optimum_multi_zone"]
    single_opt = report["policies"]["optimum_single_zone"]
    assert multi_opt["runs"] == starts and single_opt["runs"] == 3 * starts
    for name in names:
        row = report["policies"][name]
        assert row["deadlines_met"] == 1.0, name
        assert row["gap_to_multi_zone_optimum"] >= -1e-4, name
        assert set(row) >= {"cost_vs_on_demand", "runs", "changeovers_per_run", "moves_per_run"}
        assert 0.0 <= row["on_demand_spot_seen_hours_per_run"] <= 6.0 + 0.2, name  # the job is 6 h
    assert report["policies"]["ours"]["moves_per_run"] == 0.0
    assert report["policies"]["on_demand"]["on_demand_spot_seen_hours_per_run"] > 0.0  # spot was there
    od_seen = {name: report["policies"][name]["on_demand_spot_seen_hours_per_run"] for name in names}
    assert od_seen["ours_zones"] < od_seen["on_demand"]
    for name, policy in zip(operator, ("ours", "ours_zones"), strict=True):
        # the operator leaves on-demand for spot too (at its probes), so less often on it while spot
        # is there than by staying (on_demand); not necessarily more than the policy asked every tick:
        # it takes a spell to be as old as the last time it saw none, an upper bound of its age
        row = report["policies"][name]
        assert row["deadlines_met"] == 1.0 and row["zones"] == report["policies"][policy]["zones"]
        assert row["on_demand_spot_seen_hours_per_run"] < od_seen["on_demand"], name
    assert report["policies"]["ours"]["gap_to_single_zone_optimum"] >= -1e-4
    assert set(report["nodes_free"]) == {
        "us-east-2a_v100_1",
        "us-west-2a_v100_1",
        "us-west-2b_v100_1",
        "any_v100_1",
    }


def test_benchmark_table_names_the_folder_it_read(tmp_path: Path) -> None:
    folder = tmp_path / "my-traces-2031"
    folder.mkdir()
    out = run_zones_json(folder)
    assert "folder my-traces-2031" in str(out) and "aws-10-26-2022" not in str(out)


def test_with_one_zone_ours_zones_is_ours() -> None:
    trace = load_trace(TRACES / "aws-10-26-2022" / "us-west-2a_k80_8.json")
    one = ZoneSet("k80_8", trace.gap_hours, ("us-west-2a",), ("us-west-2",), (trace.data,))
    args = dict(ARGS, job_hours=24.0, deadline_hours=30.0)
    for start in (0, 1500):
        assert simulate_zones(one, ours_zones, start=start, **args) == simulate_zones(
            one, single_zone(ours), start=start, **args
        )


def test_as_operator_leaves_on_demand_only_at_a_probe_and_only_where_spot_is() -> None:
    # What the operator acts on (lifecycle.resume.switch): while on-demand runs the policy is asked
    # every probe interval (here 0.5 h), as if spot were there, with the spell as old as the operator
    # can know (since it last saw none); the probe is a spot launch, so spot must really be there.
    state = PolicyState(
        elapsed=10.0,
        deadline=60.0,
        work_done=10.0,
        work_remaining=39.0,
        changeover=0.2,
        spot_available=True,
        running="on_demand",
        seen_available_hours=6.0,
        seen_unavailable_hours=4.0,
        spot_spells=3,
        spell_hours=1.0,
    )
    assert ours(state) == "spot"
    as_op = as_operator(single_zone(ours), probe_hours=0.1)
    at = dataclasses.replace  # the replay is stateful: one run, the clock going forward

    as_op(at(state, elapsed=0.0, running=None, spot_available=False), 1)  # spot unseen at the start
    assert as_op(at(state, elapsed=0.05), 1) == "on_demand"  # on-demand: no probe before 0.1 h
    assert as_op(at(state, elapsed=0.6, spot_available=False), 1) == "on_demand"  # a probe, none there
    assert as_op(at(state, elapsed=0.65), 1) == "on_demand"  # no probe before 0.7 h
    assert as_op(at(state, elapsed=0.7), 1) == "on_demand"  # spot seen 0.1 h: too young to leave for
    assert as_op(at(state, elapsed=0.95), 1) == "spot"  # 0.35 h > 1.5 changeovers, spot there: switch
    idle = dataclasses.replace(state, running=None, elapsed=7.0)
    assert as_op(idle, 1) == ours(idle) == "spot"  # between attempts it is the policy's call
