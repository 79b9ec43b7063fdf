"""Warm Celery workers against Airflow's default Celery configuration: the CPU a production
deployment's workers spend per task execution.

    python benchmarks/celery_warm.py [--runs 16]

For each arm, one ``cloudtrain up --production`` (PostgreSQL, Redis, two Celery workers, two
triggerers): ``warm`` as shipped (``[celery] celery_config_options =
airflow_cloudtrain.celery_config.CELERY_CONFIG``: the provider and the cloud SDKs imported once per
worker before its pool forks), ``cold`` with Airflow's own ``DEFAULT_CELERY_CONFIG`` (every task
process imports them itself). Each triggers ``--runs`` deferred ``CloudTrainOperator`` runs (the
production test's ``prod_train`` DAG, half on EC2, half on GCE, a 5 s job), waits until all ended,
and reads the CPU of the two workers' process trees before stopping: the worker processes, their pool
children, and the task processes the pool children forked and reaped (their ``children_*`` times).
Each deferred run executes twice on a worker (the start, then ``execute_complete``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "deployment"), str(ROOT / "tests")]

from celery_workers import process_by_output  # noqa: E402
from deployment_helpers import Api, Up  # noqa: E402
from waiting import wait_for  # noqa: E402

from airflow_cloudtrain.cli_up import free_port, home_secrets  # noqa: E402
from airflow_cloudtrain.cli_up_production import WORKERS  # noqa: E402

DAGS = ROOT / "tests" / "deployment" / "production_dags"
COLD = "airflow.providers.celery.executors.default_celery.DEFAULT_CELERY_CONFIG"


def _worker_trees_cpu(up: Up) -> float:
    """CPU-seconds of the workers' trees: each process's own, plus what its reaped children used."""
    import psutil

    total = 0.0
    for name in WORKERS:
        worker = process_by_output(up, name)
        for each in [worker, *worker.children(recursive=True)]:
            try:
                t = each.cpu_times()
            except psutil.Error:  # a task process that ended meanwhile: its parent's children_* has it
                continue
            total += t.user + t.system + t.children_user + t.children_system
    return total


def _executions(up: Up) -> int:
    return sum(
        (up.home / "logs" / f"{name}.out").read_text(errors="replace").count("Executing workload")
        for name in WORKERS
    )


def arm(config: str | None, runs: int) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="cloudtrain-warm-"))
    base.chmod(0o711)  # PostgreSQL runs as the postgres user: its folder must be reachable
    up = Up(base / "airflow_home", free_port())
    up.extra_args = ["--production", "--dags-folder", str(DAGS)]
    if config:
        up.extra_args += ["--set", f"AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS={config}"]
    try:
        up.start()
        api = wait_for(lambda: Api(up, home_secrets(up.home)["password"]), timeout=300, interval=2)
        wait_for(lambda: api.has_dag("prod_train"), timeout=300, interval=1, message="prod_train parsed")
        api.call("PATCH", "/dags/prod_train", {"is_paused": False})
        before = _worker_trees_cpu(up)
        started = time.monotonic()
        ids = [
            api.trigger("prod_train", {"cloud": "ec2" if k % 2 else "gcloud", "command": "sleep 5"})
            for k in range(runs)
        ]
        states = [api.wait_run("prod_train", run_id, timeout=1800) for run_id in ids]
        took = time.monotonic() - started
        since_start = _worker_trees_cpu(up)
        cpu = since_start - before
        executions = _executions(up)
        up.stop()
    finally:
        up.kill_everything()
        shutil.rmtree(base, ignore_errors=True)
    return {
        "runs": runs,
        "succeeded": states.count("success"),
        "executions": executions,
        "worker_cpu_s": cpu,
        "since_start_s": since_start,
        "per_execution_s": cpu / max(executions, 1),
        "wall_s": took,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=16)
    args = parser.parse_args()
    rows = {
        "cold (Airflow's DEFAULT_CELERY_CONFIG)": arm(COLD, args.runs),
        "warm (as shipped)": arm(None, args.runs),
    }
    print(f"\n{args.runs} deferred CloudTrainOperator runs (half EC2, half GCE), two Celery workers\n")
    print(
        "| workers | runs ok | task executions | workers' CPU-s for the runs | per execution | "
        "workers' CPU-s since their start (warm-up included) | wall s |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['succeeded']}/{r['runs']} | {r['executions']} | {r['worker_cpu_s']:.1f} | "
            f"{r['per_execution_s']:.2f} | {r['since_start_s']:.1f} | {r['wall_s']:.0f} |"
        )


if __name__ == "__main__":
    main()
