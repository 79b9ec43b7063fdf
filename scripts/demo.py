"""The demo: the main job (example_dags/ec2_train.py) on the emulated clouds, inside real Airflow.

Starts the emulator, prepares an isolated AIRFLOW_HOME with a migrated metadata DB, runs the DAG
with ``dag.test()`` and prints what happened: offer chosen, instance, job log, result, cost.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DAGS = ROOT / "example_dags"


def prepare_airflow_home() -> None:
    home = Path(os.environ.get("CLOUDTRAIN_DEMO_HOME") or tempfile.mkdtemp(prefix="cloudtrain-demo-"))
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(DAGS)
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ.setdefault("CLOUDTRAIN_CACHE_DIR", str(home / "cache"))
    from airflow.utils import db

    db.initdb()


def load_dag(name: str):
    spec = importlib.util.spec_from_file_location(f"example_dags.{name}", DAGS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def summarize(name: str, run) -> None:
    """What a user wants to know after a run, without Airflow's log around it."""
    from airflow_cloudtrain.agent.storage import open_run_folder
    from airflow_cloudtrain.runs import log_prefix

    print(f"\n=== {name}: dag run {run.state} ===")
    for ti in sorted(run.get_task_instances(), key=lambda t: t.start_date or t.end_date):
        print(f"  task {ti.task_id:<14} {ti.state}")
    result = run.get_task_instance("train").xcom_pull(task_ids="train")
    if not result:
        return
    print(
        f"  offer chosen : {result['instance_type']} in {result['region']}/{result['zone']} "
        f"({'spot' if result['spot'] else 'on-demand'})"
    )
    print(f"  instance     : {result['instance_id']} (terminated)")
    folder = open_run_folder(result["run_uri"])
    print("  job log      :")
    for key in folder.list(log_prefix(result["instance_id"])):
        for line in (folder.get_text(key) or "").splitlines():
            print(f"    | {line}")
    print(
        f"  result       : {result['state']}, exit code {result['exit_code']}, {result['duration_s']:.1f} s"
    )
    print(f"  results      : {result['results_uri']}/  {folder.list('results')}")
    print(f"  cost         : ${result['cost_usd']} ({result['cost_basis']})")
    print("  XCom         :", json.dumps(result, default=str))


def main() -> int:
    logging.basicConfig(level=logging.WARNING)
    prepare_airflow_home()
    from airflow_cloudtrain.emulator import Emulator

    dags = sys.argv[1:] or ["ec2_train", "gce_train"]
    failed = 0
    with Emulator() as emu:
        for name in dags:
            print(f"\n=== {name} on the emulated cloud ===", flush=True)
            dag = load_dag(name)
            run = dag.test()
            failed += run.state != "success"
            summarize(name, run)
        left = emu.running_instances()
        print(f"\ninstances still running on the emulated cloud: {left or 'none'}")
    return 1 if failed or left else 0


if __name__ == "__main__":
    sys.exit(main())
