"""``cloudtrain gc``: list every resource the provider left on a cloud, and delete what no run wants.

It lists what carries the provider's run tags, labels or names in one region (or zone): instances,
groups, templates, queues, topics, subscriptions, security groups / firewall rules, placement groups /
policies, secrets, Vertex AI jobs; reads each run's lease in its run folder; and deletes (through the
ledger's deleters) what belongs to a finished run, a run whose lease lapsed, or (no lease to read) is
older than ``--older-than``. ``--dry-run`` only lists. The decision table is ``lifecycle.gc``'s.

Credentials come from the Airflow connections (``--aws-conn-id`` / ``--gcp-conn-id``; an
``AIRFLOW_CONN_...`` variable is enough, no Airflow database needed), as for ``cloudtrain jobs``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def older_than(text: str) -> float:
    """``--older-than``: a duration in the operators' forms (``90m``, ``1h``, ``2d``...), or 0."""
    from airflow_cloudtrain.operators.gc import older_than_seconds

    try:
        return older_than_seconds(text, "--older-than")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_gc_parser(sub: Any) -> None:
    p = sub.add_parser(
        "gc",
        help="list (and delete) what runs left on a cloud: instances, groups, queues, rules, secrets, jobs",
        description=__doc__.splitlines()[0].replace("``", ""),
    )
    p.add_argument("--cloud", required=True, choices=("aws", "ec2", "ec2spot", "gcp", "gcloud", "gcspot"))
    p.add_argument("--region", default=None, help="default: the connection's region")
    p.add_argument("--zone", default=None, help="GCE: list only this zone's VMs and groups")
    p.add_argument("--project-id", default=None, help="GCP project (default: the connection's)")
    p.add_argument(
        "--bucket",
        default=None,
        help="where the run folders live (s3://... or gs://...): finds the run of a resource that "
        "carries only its run key (default: $CLOUDTRAIN_BUCKET)",
    )
    p.add_argument("--dry-run", action="store_true", help="list only: no call that changes anything")
    p.add_argument(
        "--older-than",
        type=older_than,
        default=3600.0,
        help="touch nothing younger than this (default 1h: a run being launched has no lease yet)",
    )
    p.add_argument("--aws-conn-id", default="aws_default")
    p.add_argument("--gcp-conn-id", default="google_cloud_default")
    p.add_argument("--json", action="store_true", help="the listing as JSON")
    p.set_defaults(func=run_gc)


def run_gc(args: argparse.Namespace) -> int:
    import contextlib
    import os

    with contextlib.redirect_stdout(sys.stderr):  # Airflow's and the SDKs' logs: not into the table
        from airflow_cloudtrain.lifecycle.gc import format_table, gc

        found = gc(
            args.cloud,
            args.region,
            args.zone,
            args.project_id,
            args.bucket or os.environ.get("CLOUDTRAIN_BUCKET") or None,
            args.dry_run,
            args.older_than,
            args.aws_conn_id,
            args.gcp_conn_id,
        )
    failed = [x for x in found if x.result.startswith("failed")]
    if args.json:
        print(json.dumps({"dry_run": args.dry_run, "resources": [x.to_dict() for x in found]}, indent=2))
        return 1 if failed else 0
    print(format_table(found))
    doomed = [x for x in found if x.action == "delete"]
    if args.dry_run:
        print(f"\ndry run: {len(doomed)} of {len(found)} would be deleted; nothing was changed")
        return 0
    deleted = [x for x in doomed if x.result == "deleted"]
    print(f"\ndeleted {len(deleted)} of {len(found)}:" if deleted else f"\ndeleted nothing of {len(found)}")
    for x in deleted:
        print(f"  {x.kind} {x.id}")
    for x in failed:
        print(f"  FAILED {x.kind} {x.id}: {x.result}", file=sys.stderr)
    return 1 if failed else 0
