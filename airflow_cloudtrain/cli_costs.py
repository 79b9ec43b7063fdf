"""``cloudtrain costs``: what training cost, per DAG, task, day, week or cloud, from the bucket's cost
index; ``--dag``, ``--state`` and ``--cloud`` narrow it to some runs, as the Cloud training page does.

Each attempt that ran writes one record when it is released and priced (``lifecycle.cost_index``);
this adds them up for the days asked for. It needs the bucket's credentials, not Airflow.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys
import time
from datetime import datetime, timezone
from typing import Any

DEFAULT_SINCE = "7d"


def parse_since(value: str, now: float | None = None) -> float:
    """A day (``2026-11-20``) or an age (``7d``, ``36h``) as unix time."""
    now = time.time() if now is None else now
    if m := re.fullmatch(r"(\d+(?:\.\d+)?)([dh])", value.strip()):
        return now - float(m[1]) * (86400.0 if m[2] == "d" else 3600.0)
    try:
        return datetime.strptime(value.strip(), "%Y-%m-%d").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--since {value!r}: give a day (2026-11-20) or an age (7d, 36h)"
        ) from None


def _costs(args: argparse.Namespace) -> int:
    from airflow_cloudtrain.lifecycle.cost_index import grand_total, read_records, select, totals
    from airflow_cloudtrain.storage import open_run_folder

    bucket = args.bucket or os.environ.get("CLOUDTRAIN_BUCKET")
    if not bucket:
        print("cloudtrain costs: give --bucket (or CLOUDTRAIN_BUCKET)", file=sys.stderr)
        return 2
    records = select(read_records(open_run_folder(bucket), args.since), args.dag, args.state, args.cloud)
    rows = totals(records, args.by)
    total = grand_total(records, args.by)
    if args.json:
        print(json.dumps({"by": args.by, "rows": rows, "total": total}, indent=2))
        return 0
    columns = [args.by, "runs", "attempts", "interruptions", "cost_usd"]
    if args.csv:
        writer = csv.DictWriter(sys.stdout, fieldnames=columns)
        writer.writeheader()
        writer.writerows([*rows, total])
        return 0
    shown = [
        [str(row[c]) if c != "cost_usd" else f"${row[c]:.4f}" for c in columns] for row in [*rows, total]
    ]
    widths = [max(len(c), *(len(r[i]) for r in shown)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for i, line in enumerate(shown):
        if i == len(shown) - 1:
            print("  ".join("-" * w for w in widths))
        print("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)))
    return 0


def add_costs_parser(sub: Any) -> None:
    from airflow_cloudtrain.lifecycle.cost_index import BY  # stdlib only: cheap at parse time

    costs = sub.add_parser(
        "costs", help="what training cost, per DAG, task, day, week or cloud (the bucket's cost index)"
    )
    costs.add_argument("--bucket", default=None, help="the operators' bucket (default: $CLOUDTRAIN_BUCKET)")
    costs.add_argument(
        "--since",
        type=parse_since,
        default=parse_since(DEFAULT_SINCE),
        help=f"a day (2026-11-20) or an age (7d, 36h); default {DEFAULT_SINCE}",
    )
    costs.add_argument("--by", choices=BY, default="dag")
    costs.add_argument("--dag", default="", help="only this DAG's runs")
    costs.add_argument(
        "--state",
        default="",
        help="only runs whose last attempt ended so (succeeded, failed, interrupted, ...)",
    )
    costs.add_argument(
        "--cloud", default="", help="only runs with an attempt on this cloud (ec2spot, gcloud, ...)"
    )
    form = costs.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true")
    form.add_argument("--csv", action="store_true")
    costs.set_defaults(func=_costs)
