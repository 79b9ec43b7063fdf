"""Benchmark the spot policies on real spot-availability traces.

Replays every trace in ``--traces`` through every policy in :mod:`airflow_cloudtrain.policy`
(the same ``decide`` functions the operator runs), from a start every ``--start-every-hours``,
and reports cost relative to always-on-demand, share of deadlines met and changeovers per run.
It also computes the offline optimum of every run (:func:`airflow_cloudtrain.policy.optimal_costs`:
perfect foresight of the trace, same model) and each policy's gap to it: the mean over runs of
``policy cost / optimum cost - 1`` (``--no-optimum`` skips it).

Defaults follow Wu et al., "Can't Be Late" (NSDI 2024): 48 h of work, 0.2 h changeover, deadlines
of 52, 60 and 72 h (job fractions 0.92, 0.80, 0.67). Prices are the us-west-2 rows of the
package's ``catalog/data/aws.csv``: on-demand ``Price``, and for spot the mean of ``SpotMin`` and
``SpotMax``. K80 traces (p2.*) have no catalog rows; they are priced with the spot/on-demand ratio
of the p3 type with the same GPU count (only the ratio matters: costs are reported relative to
on-demand), or left out with ``--exclude-k80``.

With ``--zones`` it runs the multi-zone benchmark instead (``benchmarks/spot_zones.py``): the
single-zone policies in each zone, the zone-aware ``ours_zones`` over all zones of a set, and both
optima (options ``--nodes``, ``--restore-hours``, ``--checkpoint-gb``, ``--bandwidth-gbps``,
``--egress-usd-per-gb``, ``--optimum``, ``--optimum-rounds``).

``--json`` prints one object, and its shape is kept stable (tests/unit/test_policy_simulator.py):

* default: ``{"policies": {NAME: ROW}, "optimum": ROW}`` (``"optimum"`` absent with ``--no-optimum``),
  NAME in on_demand, greedy, uniform_progress, ours (and ours_plan with ``--planner``); ROW =
  ``{"cost_vs_on_demand", "deadlines_met",
  "mean_changeovers" (null for the optimum), "runs", "by_deadline": {"52": cost, ...}}`` plus, for
  policies when the optimum ran, ``"gap_to_optimum"`` and ``"gap_by_deadline"``.
* ``--zones``: ``{"mode": "zones", "traces", "zone_sets": {GROUP: [zones]}, "nodes", "moves":
  {"restore_hours", "transfer_hours", "egress_usd"}, "policies": {NAME: ROW}, "nodes_free":
  {ZONE_GROUP or any_GROUP: share of ticks}, "wall_seconds"}``; NAME in on_demand, greedy,
  uniform_progress, ours, ours_zones, ours_operator, ours_zones_operator (``ours`` / ``ours_zones`` as the
  operator acts on them: probed every ``--probe-minutes`` while on-demand runs), with ``--planner`` also
  ours_plan, ours_plan_zones, ours_plan_operator, ours_plan_zones_operator (policy/planner.py),
  optimum_single_zone, optimum_multi_zone; ROW =
  ``{"zones": "single"|"multi", "cost_vs_on_demand", "deadlines_met", "runs"}`` plus for policies
  ``"changeovers_per_run"``, ``"moves_per_run"``, ``"on_demand_spot_seen_hours_per_run"`` (on-demand
  hours while the zone looked at had spot), ``"cpu_ms_per_run"`` (the policy's replay, CPU ms per
  run), ``"gap_to_single_zone_optimum"``, and for all but
  the multi-zone optimum ``"gap_to_multi_zone_optimum"``.

Usage: python benchmarks/spot_policy.py [--traces DIR] [--deadline-hours D] [--no-optimum] [--zones] [--planner]
[--json]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from airflow_cloudtrain.policy import POLICIES, Trace, load_trace, optimal_costs, simulate  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spot_zones import add_zone_args, exact_is_cheap, print_zone_report, zone_report  # noqa: E402

from airflow_cloudtrain.policy.bounds import optimum_bounds  # noqa: E402
from airflow_cloudtrain.policy.planner import plan  # noqa: E402

TRACE_SOURCE = "github.com/skypilot-org/spot-traces (NSDI 2024 'Can't Be Late')"
"""Credited in the table header, followed by the folder actually read (``--traces``)."""
# shipped in the package, with their source and licence in SOURCE.md beside them
DEFAULT_TRACES = REPO_ROOT / "airflow_cloudtrain" / "policy" / "data" / "traces" / "aws-10-26-2022"
CATALOG = REPO_ROOT / "airflow_cloudtrain" / "catalog" / "data" / "aws.csv"
REGION = "us-west-2"
DEFAULT_DEADLINES = (52.0, 60.0, 72.0)
INSTANCE_FOR_GPUS = {"1": "p3.2xlarge", "8": "p3.16xlarge"}
OPTIMUM = "optimum"
"""Task name of the offline optimum (not a policy: it knows the future)."""
PLANNER = {"ours_plan": plan}
"""``--planner``'s extra row: the stochastic-program policy (policy/planner.py), not a user setting yet."""


@dataclass(frozen=True)
class Price:
    """USD per instance-hour for one instance type in us-west-2, as read from the catalog."""

    instance: str
    on_demand: float
    spot_min: float
    spot_max: float

    @property
    def spot(self) -> float:
        """Mean of the catalog's SpotMin and SpotMax: neither the best nor the worst zone."""
        return (self.spot_min + self.spot_max) / 2.0


def read_prices(catalog: Path = CATALOG) -> dict[str, Price]:
    """The us-west-2 p3 prices the traces need, keyed by instance type."""
    wanted = set(INSTANCE_FOR_GPUS.values())
    prices: dict[str, Price] = {}
    with catalog.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["InstanceType"] in wanted and row["Region"] == REGION:
                prices[row["InstanceType"]] = Price(
                    row["InstanceType"], float(row["Price"]), float(row["SpotMin"]), float(row["SpotMax"])
                )
    missing = wanted - prices.keys()
    if missing:
        raise SystemExit(f"{catalog}: no {REGION} row for {', '.join(sorted(missing))}")
    return prices


def price_for(trace_name: str, prices: dict[str, Price]) -> Price:
    """``us-west-2a_v100_8`` -> p3.16xlarge; K80 traces borrow the p3 type with the same GPU count."""
    gpus = trace_name.rsplit("_", 1)[-1]
    if gpus not in INSTANCE_FOR_GPUS:
        raise SystemExit(f"cannot price trace {trace_name!r}: expected a name ending in _1 or _8")
    return prices[INSTANCE_FOR_GPUS[gpus]]


@dataclass(frozen=True)
class Task:
    """One (policy, trace, deadline) cell: all start offsets of it run in one worker call."""

    policy: str
    trace: Trace
    deadline: float
    job: float
    changeover: float
    spot_price: float
    on_demand_price: float
    start_every: int
    optimum: str = "auto"
    rounds: int = 4


def starts_of(task: Task) -> range:
    """Start ticks of one cell: every ``start_every`` ticks while the deadline window fits."""
    window = int(task.deadline / task.trace.gap_hours + 0.5)
    return range(0, len(task.trace.data) - window + 1, task.start_every)


def run_task(task: Task) -> tuple[Task, list[tuple[float, bool, int | None]]]:
    """Simulate every start of one cell; returns (cost / always-on-demand cost, met, launches).

    For the optimum, launches are ``None``: its batched program computes costs only.
    """
    trace = task.trace
    baseline = task.on_demand_price * (task.job + task.changeover)
    if task.policy == OPTIMUM:
        kw: dict[str, Any] = {
            "job_hours": task.job,
            "deadline_hours": task.deadline,
            "changeover_hours": task.changeover,
            "spot_price": task.spot_price,
            "on_demand_price": task.on_demand_price,
        }
        starts = starts_of(task)
        cheap = exact_is_cheap(trace.gap_hours, task.changeover, task.deadline, task.job, len(starts))
        if task.optimum == "exact" or (task.optimum == "auto" and cheap):
            costs = optimal_costs(trace, starts, **kw)
        else:  # the certified lower bound (policy/bounds.py): minutes, not hours, at 15 s ticks
            bounds = optimum_bounds(
                [trace.data], list(starts), gap_hours=trace.gap_hours, rounds=task.rounds, **kw
            )
            costs = [float(x) for x in bounds.lower]
        return task, [(cost / baseline, cost < float("inf"), None) for cost in costs]
    decide = POLICIES.get(task.policy) or PLANNER[task.policy]
    rows: list[tuple[float, bool, int | None]] = []
    for start in starts_of(task):
        res = simulate(
            trace,
            decide,
            job_hours=task.job,
            deadline_hours=task.deadline,
            changeover_hours=task.changeover,
            spot_price=task.spot_price,
            on_demand_price=task.on_demand_price,
            start=start,
        )
        rows.append((res.cost / baseline, res.met_deadline, res.launches))
    return task, rows


def spot_only_bound(task: Task) -> list[float]:
    """Cost ratio if every available spot hour were used with free changeovers: unreachable floor."""
    trace, ratio = task.trace, task.spot_price / task.on_demand_price
    window = int(task.deadline / trace.gap_hours + 0.5)
    out = []
    for start in starts_of(task):
        spot = min(task.job, sum(trace.data[start : start + window]) * trace.gap_hours)
        out.append((spot * ratio + task.job - spot) / (task.job + task.changeover))
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command line; defaults are the paper's setting so a bare run reproduces docs/spot_policy.md."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="directory of *.json traces")
    p.add_argument("--job-hours", type=float, default=48.0)
    p.add_argument("--deadline-hours", type=float, help="one deadline (default: 52, 60 and 72 h)")
    p.add_argument("--changeover-hours", type=float, default=0.2)
    p.add_argument("--start-every-hours", type=float, default=2.0, help="spacing of start offsets")
    p.add_argument("--exclude-k80", action="store_true", help="only the v100 traces (priced directly)")
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--no-optimum", action="store_true", help="skip the offline optimum and the gaps to it")
    p.add_argument(
        "--planner",
        action="store_true",
        help="add the ours_plan rows (policy/planner.py; with --zones also ours_plan_zones and both _operator)",
    )
    p.add_argument(
        "--json", action="store_true", help="print the JSON report only (shape: see the docstring)"
    )
    add_zone_args(p)
    return p.parse_args(argv)


def trace_header(traces: Path, count: int) -> str:
    """The first line of the table: the source, and the folder really read (not a fixed name)."""
    where = traces.resolve()
    where = where.relative_to(REPO_ROOT) if where.is_relative_to(REPO_ROOT) else where
    return f"Traces: {TRACE_SOURCE}, folder {where.name} ({count} files from {where})"


def mean_gap(costs: list[float], optimum: list[float]) -> float:
    """Mean over runs of ``cost / optimum cost - 1`` (runs paired by trace, deadline and start)."""
    return statistics.fmean(c / o - 1.0 for c, o in zip(costs, optimum, strict=True))


def main(argv: list[str] | None = None) -> int:
    """Run every policy (and the optimum) on every (trace, deadline, start); print table or JSON."""
    args = parse_args(argv)
    began = time.monotonic()
    deadlines = (args.deadline_hours,) if args.deadline_hours else DEFAULT_DEADLINES
    if args.zones:
        prices = read_prices()

        def price_of(group: str) -> tuple[float, float]:
            pr = price_for(f"zone_{group}", prices)
            return pr.spot, pr.on_demand

        zones_report = zone_report(args, price_of, deadlines)
        if args.json:
            print(json.dumps(zones_report, indent=2))
        else:
            print_zone_report(zones_report, trace_header(args.traces, len(list(args.traces.glob("*.json")))))
        return 0
    paths = sorted(args.traces.glob("*.json"))
    if args.exclude_k80:
        paths = [p for p in paths if "_k80_" not in p.name]
    if not paths:
        raise SystemExit(f"no *.json traces in {args.traces}")
    traces = [load_trace(p) for p in paths]
    prices = read_prices()
    with_optimum = not args.no_optimum
    if with_optimum and min(deadlines) < args.job_hours + args.changeover_hours:
        print("no optimum: a deadline is shorter than the job plus one changeover", file=sys.stderr)
        with_optimum = False
    # Slowest first keeps both workers busy: the optimum, then the policies in reverse order.
    policies = [*POLICIES, *(PLANNER if args.planner else ())]
    order = ([OPTIMUM] if with_optimum else []) + list(reversed(policies))
    tasks = [
        Task(
            name,
            tr,
            dl,
            args.job_hours,
            args.changeover_hours,
            price_for(tr.name, prices).spot,
            price_for(tr.name, prices).on_demand,
            max(1, round(args.start_every_hours / tr.gap_hours)),
            args.optimum,
            args.optimum_rounds,
        )
        for name in order
        for tr in traces
        for dl in deadlines
    ]
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        results = list(pool.map(run_task, tasks))

    names = policies + ([OPTIMUM] if with_optimum else [])
    rows: dict[str, list[tuple[float, bool, int | None]]] = defaultdict(list)
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    for task, out in results:
        rows[task.policy] += out
        cells[(task.policy, f"{task.deadline:g}h")] += [r[0] for r in out]
        cells[(task.policy, task.trace.name)] += [r[0] for r in out]
    bound = [x for t in tasks if t.policy == "on_demand" for x in spot_only_bound(t)]
    columns = [f"{d:g}h" for d in deadlines] + [t.name for t in traces]

    def gap(name: str, col: str | None = None) -> float | None:
        """Gap to the optimum of one policy, overall or in one column (None without optimum)."""
        if not with_optimum:
            return None
        if col is None:
            return mean_gap([r[0] for r in rows[name]], [r[0] for r in rows[OPTIMUM]])
        return mean_gap(cells[(name, col)], cells[(OPTIMUM, col)])

    summary = {}
    for name in names:
        launches = [r[2] for r in rows[name] if r[2] is not None]
        entry: dict[str, object] = {
            "cost_vs_on_demand": round(statistics.fmean(r[0] for r in rows[name]), 4),
            "deadlines_met": round(statistics.fmean(r[1] for r in rows[name]), 4),
            "mean_changeovers": round(statistics.fmean(launches), 2) if launches else None,
            "runs": len(rows[name]),
            "by_deadline": {
                f"{dl:g}": round(statistics.fmean(cells[(name, f"{dl:g}h")]), 4) for dl in deadlines
            },
        }
        if with_optimum and name != OPTIMUM:
            entry["gap_to_optimum"] = round(gap(name) or 0.0, 4)
            entry["gap_by_deadline"] = {f"{dl:g}": round(gap(name, f"{dl:g}h") or 0.0, 4) for dl in deadlines}
        summary[name] = entry
    if args.json:
        report: dict[str, object] = {"policies": {n: summary[n] for n in policies}}
        if with_optimum:
            report[OPTIMUM] = summary[OPTIMUM]
        print(json.dumps(report, indent=2))
        return 0

    used = sorted({price_for(t.name, prices).instance for t in traces})
    print(trace_header(args.traces, len(traces)))
    print(
        f"Job {args.job_hours:g} h, changeover {args.changeover_hours:g} h, deadlines "
        f"{', '.join(f'{d:g}' for d in deadlines)} h, a start every {args.start_every_hours:g} h: "
        f"{summary['ours']['runs']} runs per policy"
    )
    for inst in used:
        pr = prices[inst]
        print(
            f"Price {inst} {REGION} (aws.csv): on-demand ${pr.on_demand:.4f}/h, spot ${pr.spot:.4f}/h "
            f"= mean(SpotMin {pr.spot_min:.4f}, SpotMax {pr.spot_max:.4f}), ratio {pr.spot / pr.on_demand:.3f}"
        )
    if any("_k80_" in t.name for t in traces):
        print("k80 traces (p2.*, not in the catalog) are priced like the p3 type with the same GPU count.")
    print()
    gap_head = f"{'gap_to_optimum':>16}" if with_optimum else ""
    print(
        f"{'policy':<20}{'cost_vs_on_demand':>18}{'saved':>8}{'deadlines_met':>15}{'changeovers':>13}{gap_head}"
    )
    for name, s in summary.items():
        changeovers = "-" if s["mean_changeovers"] is None else f"{s['mean_changeovers']:.1f}"
        gap_cell = f"{s['gap_to_optimum']:>+16.1%}" if "gap_to_optimum" in s else ""
        line = (
            f"{name:<20}{s['cost_vs_on_demand']:>18.3f}{1 - s['cost_vs_on_demand']:>8.1%}"
            f"{s['deadlines_met']:>15.1%}{changeovers:>13}{gap_cell}"
        )
        print(line.rstrip())
    print(f"{'spot-only bound *':<20}{statistics.fmean(bound):>18.3f}{1 - statistics.fmean(bound):>8.1%}")
    print("* every available spot hour used, changeovers free, future known: no policy can reach it.")
    if with_optimum:
        print(
            "optimum: perfect foresight of the trace, same model (changeovers paid), cheapest schedule that\n"
            "meets the deadline. gap_to_optimum: mean over runs of cost / optimum cost - 1."
        )

    title = "cost_vs_on_demand (gap to optimum)" if with_optimum else "cost_vs_on_demand"
    print(f"\n{title} by deadline and by trace\n{'':<20}" + "".join(f"{p:>18}" for p in names))
    for col in columns:
        line = f"{col:<20}"
        for p in names:
            cost = statistics.fmean(cells[(p, col)])
            g = gap(p, col) if p != OPTIMUM else None
            line += f"{cost:>18.3f}" if g is None else f"{f'{cost:.3f} ({g:+.1%})':>18}"
        print(line)
    print(f"\nwall time {time.monotonic() - began:.1f} s with {args.workers} worker(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
