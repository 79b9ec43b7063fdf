"""The production deployment test's DAGs: each operator family deferred, its cloud and command from
the run's conf, so one file serves every case (tests/deployment/test_production.py)."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_cloudtrain.operators import CheckpointResumeOperator, CloudTrainOperator
from airflow_cloudtrain.sensors import InstanceStatusSensor

BUCKET = "{{ 's3://cloudtrain-emulated/prod' if params.cloud.startswith('ec2') else 'gs://cloudtrain-emulated/prod' }}"
PARAMS = {
    "cloud": Param("ec2", enum=["ec2", "ec2spot", "gcloud", "gcspot"]),
    "command": Param("sleep 5", type="string"),
}
ARGS = {"retries": 2, "retry_delay": timedelta(seconds=2)}


def _dag(dag_id: str) -> DAG:
    return DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1), params=PARAMS, default_args=ARGS)


with _dag("prod_train"):
    CloudTrainOperator(
        task_id="train",
        cloud="{{ params.cloud }}",
        command="{{ params.command }}",
        bucket=BUCKET,
        max_runtime="1h",
        poll_interval=1,
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
        poll_interval=1,
        deferrable=True,
    )

with _dag("prod_sensor"):
    train = CloudTrainOperator(
        task_id="train",
        cloud="ec2",
        command="{{ params.command }}",
        bucket="s3://cloudtrain-emulated/prod",
        max_runtime="1h",
        poll_interval=1,
        deferrable=True,
    )
    watch = InstanceStatusSensor(
        task_id="watch",
        cloud="ec2",
        run_id="{{ ti.xcom_pull(task_ids='train')['run_id'] }}",
        target_state="terminated",
        missing_as_terminated=True,
        poke_interval=1,
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
        poll_interval=1,
        deferrable=False,  # waits in its Celery worker's slot: the case of a worker lost mid-run
    )
