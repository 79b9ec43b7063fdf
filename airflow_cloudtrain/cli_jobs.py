"""``cloudtrain jobs list`` / ``cloudtrain jobs logs``: Vertex AI training jobs without Airflow, as the
detector's ``lumi cloud gc jobs`` and ``lumi cloud gc logs`` showed ML Engine jobs.

Credentials and project come from the Airflow Google connection (``--conn-id``, default
``google_cloud_default``; an ``AIRFLOW_CONN_...`` variable is enough, no Airflow database needed), or
``--project``. ``JOB_ID`` is a job id (the display name; the newest job of that name), a numeric Vertex
id, or a full resource name.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from typing import Any


def _duration(text: str) -> float:
    """A duration in any form the operators take (``operators.checks.parse_duration``), for argparse."""
    from airflow_cloudtrain.operators.checks import parse_duration

    try:
        seconds = parse_duration(text, "--polling-interval")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if seconds is None:
        raise argparse.ArgumentTypeError("--polling-interval needs a duration, e.g. 30 or 1m")
    return seconds


def add_jobs_parser(sub: Any) -> None:
    jobs = sub.add_parser("jobs", help="Vertex AI training jobs: list them, print their logs").add_subparsers(
        dest="jobs_command", required=True
    )
    for name, helptext in (
        ("list", "list the project's training jobs, newest first"),
        ("logs", "print a job's log"),
    ):
        p = jobs.add_parser(name, help=helptext)
        p.add_argument("--region", default="us-central1")
        p.add_argument("--project", default=None, help="default: the connection's project")
        p.add_argument("--conn-id", default="google_cloud_default")
        if name == "list":
            p.add_argument("--running", action="store_true", help="only jobs not yet ended")
            p.add_argument("--all", action="store_true", help="every custom job, not only cloudtrain's")
            p.add_argument("--limit", type=int, default=50)
            p.set_defaults(func=_list)
        else:
            p.add_argument("job_id")
            p.add_argument("--follow", action="store_true", help="keep printing until the job ends")
            p.add_argument(
                "--polling-interval",
                type=_duration,
                default=30.0,
                help="time between log reads: seconds, or 90s, 15m, 1h30m (the operators' forms)",
            )
            p.set_defaults(func=_logs)


def _jobs(args: argparse.Namespace) -> Any:
    from airflow_cloudtrain.clouds.gcp.vertex import VertexJobs
    from airflow_cloudtrain.hooks.vertex import VertexHook

    hook = VertexHook(gcp_conn_id=args.conn_id, project_id=args.project)
    return hook, VertexJobs(hook.job_client(args.region), hook.project, args.region)


def _when(stamp: float | None) -> str:
    return "-" if stamp is None else datetime.fromtimestamp(stamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _list(args: argparse.Namespace) -> int:
    from airflow_cloudtrain.clouds.gcp.vertex import ACTIVE_FILTER
    from airflow_cloudtrain.contract.runs import TAG_MANAGED

    _, jobs = _jobs(args)
    clauses = [] if args.all else [f'labels.{TAG_MANAGED}="true"']
    if args.running:
        clauses.append(ACTIVE_FILTER)
    found = jobs.list(" AND ".join(clauses), limit=args.limit)
    print(f"{'job id':<36}{'state':<16}{'created (UTC)':<21}{'run time':>10}  name")
    for job in found:
        run = job.duration_s(time.time())
        print(
            f"{job.display_name:<36}{job.state.replace('JOB_STATE_', ''):<16}{_when(job.created_at):<21}"
            f"{'-' if run is None else f'{run:.0f}s':>10}  {job.name}"
        )
    if not found:
        print("(no jobs)")
    return 0


def resolve_job(jobs: Any, job_id: str) -> Any:
    """A job by full name, numeric id or display name (the newest of that name); None if none."""
    if job_id.startswith("projects/"):
        return jobs.get(job_id)
    if job_id.isdigit():
        return jobs.get(f"{jobs.parent}/customJobs/{job_id}")
    named = jobs.named(job_id)
    return named[0] if named else None


def _logs(args: argparse.Namespace) -> int:
    from airflow_cloudtrain.lifecycle.vertex.logs import JobLogTail

    hook, jobs = _jobs(args)
    job = resolve_job(jobs, args.job_id)
    if job is None:
        print(f"cloudtrain jobs logs: no job {args.job_id!r} in {jobs.parent}", file=sys.stderr)
        return 1
    tail = JobLogTail(hook, job.numeric_id)  # its own cursor: never moves the task's

    def show_all() -> None:  # every line there is now (a read takes at most MAX_PAGES pages)
        while lines := tail.poll():
            for line in lines:
                print(line.render(), flush=True)

    show_all()
    while args.follow and not job.terminal:
        time.sleep(args.polling_interval)
        job = jobs.get(job.name) or job
        show_all()  # after the end too: the lines written just before it
    if args.follow:
        print(f"job {job.display_name} ended {job.state}" + (f": {job.error}" if job.error else ""))
    return 0
