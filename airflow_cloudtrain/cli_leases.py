"""``cloudtrain runs list`` and the lease lines of ``cloudtrain runs show``: which runs are watched,
which lapsed, which were orphaned (``contract.lease``).

A run folder with ``orphaned.json`` shows as ``orphaned`` with the time its lease lapsed and who ended
it (its agent, its fleet's workers, or ``cloudtrain gc``); one whose lease lapsed but that nobody
ended yet (its agent is gone too) as ``lapsed``: ``cloudtrain gc`` deletes what it left.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from airflow_cloudtrain.contract.lease import LEASE_KEY, ORPHANED_KEY, Lease, Orphaned


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def lease_state(folder: Any, now: float | None = None) -> dict[str, Any] | None:
    """``{"state": "orphaned"|"lapsed"|"watched"|"unwatched", ...}`` of one run folder; None when it
    has neither record (a run of a release without leases, or one with ``orphan_timeout=None``)."""
    now = time.time() if now is None else now
    raw_orphaned, raw_lease = folder.get_text(ORPHANED_KEY), folder.get_text(LEASE_KEY)
    if raw_orphaned:
        record = Orphaned.from_json(raw_orphaned)
        return {
            "state": "orphaned",
            "lapsed_at": record.lapsed_at,
            "ended_by": record.ended_by,
            "noticed_at": record.noticed_at,
        }
    if not raw_lease:
        return None
    lease = Lease.from_json(raw_lease)
    lapses_at = lease.lapses_at()
    state = "unwatched" if lapses_at is None else ("lapsed" if lease.lapsed(now) else "watched")
    return {"state": state, "renewed_at": lease.renewed_at, "by": lease.by, "lapses_at": lapses_at}


def describe(state: dict[str, Any]) -> str:
    """One line for a person."""
    if state["state"] == "orphaned":
        return f"orphaned: its lease lapsed at {_utc(state['lapsed_at'])}; ended by {state['ended_by']}"
    renewed = f"renewed {_utc(state['renewed_at'])} by {state['by'] or '?'}"
    if state["state"] == "lapsed":
        return f"lapsed at {_utc(state['lapses_at'])} ({renewed}); nobody ended it yet: see cloudtrain gc"
    if state["state"] == "unwatched":
        return f"no orphan_timeout: only max_runtime ends it ({renewed})"
    return f"watched: lease {renewed}, lapses at {_utc(state['lapses_at'])}"


def orphaned_line(folder: Any) -> str | None:
    """The lease line of ``runs show`` (never fails the command: None when unreadable)."""
    try:
        state = lease_state(folder)
    except Exception:
        return None
    return None if state is None else f"lease: {describe(state)}"


def _runs_list(args: argparse.Namespace) -> int:
    """Every run folder under the bucket with a lease record, newest first."""
    from airflow_cloudtrain.storage import open_run_folder

    bucket = args.bucket or os.environ.get("CLOUDTRAIN_BUCKET")
    if not bucket:
        print("cloudtrain runs list: give --bucket (or CLOUDTRAIN_BUCKET)", file=sys.stderr)
        return 2
    root = open_run_folder(bucket)
    folders = sorted(
        {k.rsplit("/", 1)[0] for k in root.list("runs/") if k.endswith((f"/{LEASE_KEY}", f"/{ORPHANED_KEY}"))}
    )
    rows = []
    for path in folders:
        state = lease_state(root.at(f"{root.uri.rstrip('/')}/{path}"))
        if state is not None and (not args.orphaned or state["state"] in ("orphaned", "lapsed")):
            rows.append({"run_uri": f"{root.uri.rstrip('/')}/{path}", **state})
    rows.sort(key=lambda r: -float(r.get("lapsed_at") or r.get("renewed_at") or 0))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no run with a lease under " + bucket)
    for row in rows:
        print(f"{row['state']:<10} {row['run_uri']}\n           {describe(row)}")
    return 0


def add_runs_list(runs: Any) -> None:
    """``cloudtrain runs list`` on the ``runs`` subparsers."""
    listing = runs.add_parser(
        "list", help="list the runs of a bucket with their lease: watched, lapsed, or orphaned (and when)"
    )
    listing.add_argument("--bucket", default=None, help="the operator's bucket (default: $CLOUDTRAIN_BUCKET)")
    listing.add_argument("--orphaned", action="store_true", help="only the orphaned and lapsed runs")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=_runs_list)
