"""``benchmarks/spot_policy.py --zones``: the spot policies over the zones of one instance group.

Each zone set (the files ``ZONE_GROUP.json`` of one group in ``--traces``, see
:func:`airflow_cloudtrain.policy.multizone.load_zone_sets`) is replayed from a start every
``--start-every-hours`` for each deadline:

* single-zone policies (on_demand, greedy, uniform_progress, ours) run in each zone on its own
  (one run per zone and start), as today;
* ``ours_zones`` (the zone-aware ``policy="deadline"``) runs once per start over all the zones;
* ``ours_operator`` / ``ours_zones_operator``: the same two as ``CheckpointResumeOperator`` acts on them
  (while on-demand runs, asked only every ``--probe-minutes``, a spot launch as the probe:
  :func:`.multizone.as_operator`);
* with ``--planner``: ``ours_plan`` (per zone), ``ours_plan_zones`` (over all zones) and both as the
  operator acts on them, ``ours_plan_operator`` / ``ours_plan_zones_operator`` (:mod:`.planner`);
* ``optimum_single_zone``: per zone and start, the exact program of :mod:`.optimum` when it is
  cheap enough (``--optimum auto``), else the certified lower bound of :mod:`.bounds`;
* ``optimum_multi_zone``: per start, the certified lower bound of :mod:`.bounds` over all zones
  with the same move costs. A lower bound makes every gap to it an over-estimate, never flattery.

Gaps are the mean over runs of ``cost / optimum - 1``, runs paired by zone set, deadline, start
(and zone, for single-zone runs against the single-zone optimum). ``ours_zones`` against the
single-zone optimum is paired with the mean of that start's single-zone optima over the zones.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from airflow_cloudtrain.policy import POLICIES, optimal_costs
from airflow_cloudtrain.policy.bounds import Moves, optimum_bounds
from airflow_cloudtrain.policy.multizone import (
    PROBE_HOURS,
    ZoneSet,
    as_operator,
    load_zone_sets,
    ours_zones,
    simulate_zones,
    single_zone,
)
from airflow_cloudtrain.policy.planner import plan, plan_zones

SINGLE = tuple(POLICIES)
MULTI = "ours_zones"
AS_OPERATOR = {"ours_operator": "ours", "ours_zones_operator": MULTI}
"""Rows replaying ``ours`` / ``ours_zones`` as the operator acts on them (asked every ``--probe-minutes``
while on-demand runs, a spot launch beside it as the probe: :func:`.multizone.as_operator`)."""
OPT_SINGLE, OPT_MULTI = "optimum_single_zone", "optimum_multi_zone"
PLAN, PLAN_MULTI = "ours_plan", "ours_plan_zones"
PLAN_ROWS = {
    PLAN: PLAN,
    PLAN_MULTI: PLAN_MULTI,
    "ours_plan_operator": PLAN,
    "ours_plan_zones_operator": PLAN_MULTI,
}
"""``--planner``'s extra rows (:mod:`.planner`, the stochastic program) and the policy each replays."""
MULTI_ROWS = (MULTI, "ours_zones_operator", PLAN_MULTI, "ours_plan_zones_operator", OPT_MULTI)
EXACT_BUDGET = 4e10
"""Most state-ticks (rows x slack steps x ticks x runs) ``--optimum auto`` gives the exact program."""


@dataclass(frozen=True)
class ZoneTask:
    """One (what, zone set, deadline) cell; ``zone`` is None for the multi-zone rows."""

    what: str
    zone_set: ZoneSet
    zone: int | None
    deadline: float
    job: float
    changeover: float
    spot_price: float
    on_demand_price: float
    moves: Moves
    nodes: int
    starts: tuple[int, ...]
    optimum: str
    rounds: int
    probe_hours: float = PROBE_HOURS


def _one_zone(zs: ZoneSet, z: int) -> ZoneSet:
    return ZoneSet(zs.group, zs.gap_hours, zs.zones[z : z + 1], zs.regions[z : z + 1], zs.counts[z : z + 1])


def exact_is_cheap(gap: float, changeover: float, deadline: float, job: float, runs: int) -> bool:
    """Whether the exact program's rough state-ticks (rows x slack steps x ticks x runs) fit
    :data:`EXACT_BUDGET`; at 10-minute ticks they do, at 15-second ticks they are ~10^4 x more."""
    unit = gap / 60
    for u in (gap, gap / 2, gap / 3, gap / 4, gap / 5, gap / 6, gap / 10, gap / 12, gap / 20, gap / 30):
        if abs(changeover / u - round(changeover / u)) < 1e-9:
            unit = u
            break
    rows = 1 + 2 * (changeover / gap + 2)
    return rows * ((deadline - job) / unit) * (deadline / gap) * runs <= EXACT_BUDGET


Outcome = tuple[float, bool, int | None, int | None, float | None]
"""(cost in dollars, deadline met, launches, moves, on-demand hours while spot was seen) of one run;
the last three are None for the optima (their programs compute costs only)."""


def run_zone_task(t: ZoneTask) -> tuple[ZoneTask, list[Outcome], float]:
    """One :data:`Outcome` per start of one cell, and the CPU seconds the cell took."""
    began = time.process_time()
    kw: dict[str, Any] = {
        "job_hours": t.job,
        "deadline_hours": t.deadline,
        "changeover_hours": t.changeover,
        "spot_price": t.spot_price,
        "on_demand_price": t.on_demand_price,
    }
    zs = t.zone_set if t.zone is None else _one_zone(t.zone_set, t.zone)
    if t.what in (OPT_SINGLE, OPT_MULTI):
        rows = zs.available(t.nodes)
        cheap = exact_is_cheap(zs.gap_hours, t.changeover, t.deadline, t.job, len(t.starts))
        exact = t.what == OPT_SINGLE and (t.optimum == "exact" or (t.optimum == "auto" and cheap))
        if exact:
            costs = optimal_costs(rows[0], t.starts, gap_hours=zs.gap_hours, **kw)
        else:
            moves = t.moves if t.what == OPT_MULTI else Moves()
            b = optimum_bounds(
                rows, t.starts, gap_hours=zs.gap_hours, regions=zs.regions, moves=moves, rounds=t.rounds, **kw
            )
            costs = [float(x) for x in b.lower]
        return t, [(c, True, None, None, None) for c in costs], time.process_time() - began
    what = AS_OPERATOR.get(t.what, PLAN_ROWS.get(t.what, t.what))
    decides = {MULTI: ours_zones, PLAN: single_zone(plan), PLAN_MULTI: plan_zones}
    decide = decides.get(what) or single_zone(POLICIES[what])
    if t.what.endswith("_operator"):
        decide = as_operator(decide, t.probe_hours)
    out: list[Outcome] = []
    for s in t.starts:
        r = simulate_zones(zs, decide, moves=t.moves, nodes=t.nodes, start=s, **kw)
        out.append((r.cost, r.met_deadline, r.launches, r.moves, r.on_demand_spot_seen_hours))
    return t, out, time.process_time() - began


def add_zone_args(p: argparse.ArgumentParser) -> None:
    """The options of ``--zones`` (defaults stated in --help and in docs/spot_policy.md)."""
    g = p.add_argument_group("zones (--zones)")
    g.add_argument("--zones", action="store_true", help="multi-zone benchmark over each zone set")
    g.add_argument("--nodes", type=int, default=1, help="gang size: a zone has spot when >= N are free")
    g.add_argument("--restore-hours", type=float, default=0.05, help="extra setup per move (default 3 min)")
    g.add_argument("--checkpoint-gb", type=float, default=20.0, help="checkpoint size moved (default 20)")
    g.add_argument("--bandwidth-gbps", type=float, default=1.0, help="cross-region transfer (default 1)")
    g.add_argument("--egress-usd-per-gb", type=float, default=0.02, help="cross-region (default 0.02)")
    g.add_argument(
        "--optimum",
        choices=("auto", "exact", "bound"),
        default="auto",
        help="single-zone optimum: exact, bound, auto",
    )
    g.add_argument("--optimum-rounds", type=int, default=4, help="bisection rounds of the bound")
    g.add_argument(
        "--probe-minutes",
        type=float,
        default=PROBE_HOURS * 60.0,
        help="the operator rows' probe_interval while on-demand runs (default 10)",
    )


def moves_of(args: argparse.Namespace) -> Moves:
    """Move costs from the options: restore always; transfer time and egress across regions."""
    transfer = args.checkpoint_gb * 8.0 / args.bandwidth_gbps / 3600.0
    return Moves(args.restore_hours, transfer, args.checkpoint_gb * args.egress_usd_per_gb)


def nodes_free(zone_sets: list[ZoneSet], nodes: int) -> dict[str, float]:
    """Share of ticks with ``nodes`` spot instances free at once, per zone and in any zone."""
    out: dict[str, float] = {}
    for zs in zone_sets:
        rows = zs.available(nodes)
        for zone, row in zip(zs.zones, rows, strict=True):
            out[f"{zone}_{zs.group}"] = round(statistics.fmean(row), 4)
        out[f"any_{zs.group}"] = round(statistics.fmean(max(col) for col in zip(*rows, strict=True)), 4)
    return out


def zone_report(args: argparse.Namespace, price_of: Any, deadlines: tuple[float, ...]) -> dict[str, Any]:
    """Run every cell and summarise; ``price_of(group) -> (spot, on_demand)`` in $/h."""
    began = time.monotonic()
    zone_sets = load_zone_sets(args.traces)
    if not zone_sets:
        raise SystemExit(f"no *.json traces in {args.traces}")
    moves = moves_of(args)
    tasks = []
    for zs in zone_sets:
        spot, od = price_of(zs.group)
        for dl in deadlines:
            step = max(1, round(args.start_every_hours / zs.gap_hours))
            window = int(dl / zs.gap_hours + 0.5)
            starts = tuple(range(0, zs.ticks - window + 1, step))
            common = (dl, args.job_hours, args.changeover_hours, spot, od, moves, args.nodes, starts)
            extra = (args.optimum, args.optimum_rounds, args.probe_minutes / 60.0)
            tasks.append(ZoneTask(OPT_MULTI, zs, None, *common, *extra))
            tasks.append(ZoneTask(MULTI, zs, None, *common, *extra))
            tasks.append(ZoneTask("ours_zones_operator", zs, None, *common, *extra))
            planned = [w for w in PLAN_ROWS if args.planner]
            tasks += [ZoneTask(w, zs, None, *common, *extra) for w in planned if w in MULTI_ROWS]
            for z in range(len(zs.zones)):
                singles = [w for w in planned if w not in MULTI_ROWS]
                for what in (*singles, OPT_SINGLE, "ours_operator", *reversed(SINGLE)):
                    tasks.append(ZoneTask(what, zs, z, *common, *extra))
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        results = list(pool.map(run_zone_task, tasks))
    # key of a run: (group, deadline, start index, zone or None)
    runs: dict[str, dict[tuple[str, float, int, int | None], Outcome]] = defaultdict(dict)
    cpu: dict[str, float] = defaultdict(float)
    for t, out, seconds in results:
        cpu[t.what] += seconds
        base = t.on_demand_price * (t.job + t.changeover)
        for i, (cost, *rest) in enumerate(out):
            runs[t.what][(t.zone_set.group, t.deadline, i, t.zone)] = (cost / base, *rest)
    single_opt, multi_opt = runs[OPT_SINGLE], runs[OPT_MULTI]

    def gap_single(key: tuple[str, float, int, int | None], cost: float) -> float:
        if key[3] is not None:
            return cost / single_opt[key][0] - 1.0
        zs = next(z for z in zone_sets if z.group == key[0])
        mean = statistics.fmean(single_opt[(key[0], key[1], key[2], z)][0] for z in range(len(zs.zones)))
        return cost / mean - 1.0

    summary: dict[str, Any] = {}
    planned = tuple(PLAN_ROWS) if args.planner else ()
    for what in (*SINGLE, MULTI, *AS_OPERATOR, *planned, OPT_SINGLE, OPT_MULTI):
        rows = runs[what]
        entry: dict[str, Any] = {
            "zones": "multi" if what in MULTI_ROWS else "single",
            "cost_vs_on_demand": round(statistics.fmean(v[0] for v in rows.values()), 4),
            "deadlines_met": round(statistics.fmean(v[1] for v in rows.values()), 4),
            "runs": len(rows),
        }
        if what not in (OPT_SINGLE, OPT_MULTI):
            entry["changeovers_per_run"] = round(statistics.fmean(v[2] for v in rows.values()), 2)
            entry["moves_per_run"] = round(statistics.fmean(v[3] for v in rows.values()), 2)
            od_seen = statistics.fmean(v[4] for v in rows.values())  # type: ignore[misc]
            entry["on_demand_spot_seen_hours_per_run"] = round(od_seen, 2)
            entry["cpu_ms_per_run"] = round(1000.0 * cpu[what] / len(rows), 2)
            entry["gap_to_single_zone_optimum"] = round(
                statistics.fmean(gap_single(k, v[0]) for k, v in rows.items()), 4
            )
        if what != OPT_MULTI:
            entry["gap_to_multi_zone_optimum"] = round(
                statistics.fmean(
                    v[0] / multi_opt[(k[0], k[1], k[2], None)][0] - 1.0 for k, v in rows.items()
                ),
                4,
            )
        summary[what] = entry
    return {
        "mode": "zones",
        "traces": str(args.traces),
        "zone_sets": {zs.group: list(zs.zones) for zs in zone_sets},
        "nodes": args.nodes,
        "moves": {
            "restore_hours": moves.restore_hours,
            "transfer_hours": round(moves.transfer_hours, 4),
            "egress_usd": moves.egress_usd,
        },
        "policies": summary,
        "nodes_free": nodes_free(zone_sets, args.nodes),
        "wall_seconds": round(time.monotonic() - began, 1),
    }


def print_zone_report(report: dict[str, Any], header: str) -> None:
    """The human table of :func:`zone_report`."""
    print(header)
    sets = ", ".join(f"{g} ({' '.join(z)})" for g, z in report["zone_sets"].items())
    mv = report["moves"]
    print(f"Zone sets: {sets}; nodes per run {report['nodes']}")
    print(
        f"Moves: +{mv['restore_hours']:g} h restore per move; across regions also +{mv['transfer_hours']:g} h "
        f"transfer and ${mv['egress_usd']:g} egress"
    )
    print()
    head = f"{'policy':<26}{'zones':>7}{'cost_vs_od':>12}{'deadlines':>11}{'changeovers':>13}{'moves':>7}{'od_spot_h':>11}"
    print(head + f"{'gap_1zone_opt':>15}{'gap_multi_opt':>15}{'cpu_ms':>8}")
    for name, s in report["policies"].items():
        ch, mv_run, od_h = (
            s.get("changeovers_per_run"),
            s.get("moves_per_run"),
            s.get("on_demand_spot_seen_hours_per_run"),
        )
        line = (
            f"{name:<26}{s['zones']:>7}{s['cost_vs_on_demand']:>12.3f}{s['deadlines_met']:>11.1%}"
            f"{'-' if ch is None else f'{ch:.1f}':>13}{'-' if mv_run is None else f'{mv_run:.2f}':>7}"
            f"{'-' if od_h is None else f'{od_h:.2f}':>11}"
        )
        g1, gm = s.get("gap_to_single_zone_optimum"), s.get("gap_to_multi_zone_optimum")
        line += f"{'-' if g1 is None else f'{g1:+.1%}':>15}{'-' if gm is None else f'{gm:+.1%}':>15}"
        cpu = s.get("cpu_ms_per_run")
        line += f"{'-' if cpu is None else f'{cpu:.1f}':>8}"
        print(line)
    free = ", ".join(f"{k} {v:.1%}" for k, v in report["nodes_free"].items())
    print(f"\nShare of ticks with {report['nodes']} node(s) free at once: {free}")
    print(f"wall time {report['wall_seconds']:.1f} s")
