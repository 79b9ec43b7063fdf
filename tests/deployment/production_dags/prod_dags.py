"""The production deployment test's DAGs: each operator family deferred, its cloud and command from
the run's conf, so one file serves every case; and two blocking ones (a run, a sweep) for the worker
kills (tests/deployment/test_production.py)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_cloudtrain.operators import CheckpointResumeOperator, CloudTrainOperator, SpotFleetOperator
from airflow_cloudtrain.sensors import InstanceStatusSensor

BUCKET = "{{ 's3://cloudtrain-emulated/prod' if params.cloud.startswith('ec2') else 'gs://cloudtrain-emulated/prod' }}"
PARAMS = {
    "cloud": Param("ec2", enum=["ec2", "ec2spot", "gcloud", "gcspot"]),
    "command": Param("sleep 5", type="string"),
}
ARGS = {"retries": 2, "retry_delay": timedelta(seconds=2)}
# every wait polls every 5 s (the operators' default is 10), not every 1 s: with the workers' parsed
# service models (celery_config), the case alone took 241 CPU-seconds instead of 285 (one run each)
POLL_S = 5
# the two blocking DAGs' tasks go to a queue only the worker the test kills consumes (then the other)
PINNED = "pinned"
JOBS = str(Path(__file__).resolve().parents[2] / "cloud" / "jobs")  # item.py, the fleet tests' work item
# the fleet's items: the first runs to its end; the others hold after their first step until the test
# creates the run's release file, so the kill always lands with one item done and the rest in flight
HELD = {"steps": 3, "step_s": 0.2, "hold_at": 1, "release": "{{ params.release }}"}
FLEET_ITEMS = [{"steps": 2, "step_s": 0.2, "n": 0}, {**HELD, "n": 1}, {**HELD, "n": 2}]


def _dag(dag_id: str, params: dict[str, Param] = PARAMS) -> DAG:
    return DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1), params=params, default_args=ARGS)


with _dag("prod_train"):
    CloudTrainOperator(
        task_id="train",
        cloud="{{ params.cloud }}",
        command="{{ params.command }}",
        bucket=BUCKET,
        max_runtime="1h",
        poll_interval=POLL_S,
        deferrable=True,
    )

with _dag("prod_resume"):
    CheckpointResumeOperator(
        task_id="train",
        cloud="{{ params.cloud }}",
        command="{{ params.command }}",
        bucket=BUCKET,
        checkpoint_dir="/tmp/ckpt",
        max_runtime="1h",
        poll_interval=POLL_S,
        deferrable=True,
    )

with _dag("prod_sensor"):
    train = CloudTrainOperator(
        task_id="train",
        cloud="ec2",
        command="{{ params.command }}",
        bucket="s3://cloudtrain-emulated/prod",
        max_runtime="1h",
        poll_interval=POLL_S,
        deferrable=True,
    )
    watch = InstanceStatusSensor(
        task_id="watch",
        cloud="ec2",
        run_id="{{ ti.xcom_pull(task_ids='train')['run_id'] }}",
        target_state="terminated",
        missing_as_terminated=True,
        poke_interval=POLL_S,
        deferrable=True,
    )
    train >> watch

with _dag("prod_blocking"):
    CheckpointResumeOperator(
        task_id="train",
        cloud="{{ params.cloud }}",
        command="{{ params.command }}",
        bucket=BUCKET,
        checkpoint_dir="/tmp/ckpt",
        max_runtime="1h",
        poll_interval=POLL_S,
        deferrable=False,  # waits in its Celery worker's slot: the case of a worker lost mid-run
        queue=PINNED,
    )

with _dag("prod_fleet", {"release": Param("/nonexistent", type="string")}):
    SpotFleetOperator(
        task_id="sweep",
        cloud="ec2spot",
        cpus=2,
        ram="4g",
        code=JOBS,
        command="python3 item.py",
        bucket="s3://cloudtrain-emulated/prod-fleet",
        region="us-east-1",
        live_prices=False,
        max_runtime="1h",
        # one worker per item: the finished item never waits behind a held one; lease_timeout keeps its
        # default (120 s): the held items' leases must outlive the kill's minutes on a loaded machine, or
        # an item would be sent again (the fleet's at-least-once contract)
        num_workers=len(FLEET_ITEMS),
        max_workers=len(FLEET_ITEMS),
        work_items=FLEET_ITEMS,  # templated: each held item's release file comes from the run's conf
        poll_interval=POLL_S,
        deferrable=False,  # the sweep waits in its Celery worker's slot: the case of a worker lost mid-sweep
        queue=PINNED,
    )
