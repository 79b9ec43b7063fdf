"""A run that is already over when its task would defer finishes in the worker, without deferring.

A trigger that fires within seconds of the deferral hits Airflow's race in which the scheduler applies
the stale "success" of the defer exit to the resumed try and fails the task (apache/airflow#66374), so
every deferrable operator checks once before deferring. Each test makes the job end before the defer
point: the step that launches (``start``) is wrapped to return only once the job's end is visible in
the cloud, as on a slow worker, with nothing of our logic replaced. ``dag.test()`` runs a deferred
task's trigger through ``_run_inline_trigger``; a counting spy on it tells whether the task deferred.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from dag_helpers import task_states, write_dag, xcom

from airflow_cloudtrain.emulator.aws.images import an_image

JOBS = str(Path(__file__).resolve().parents[1] / "cloud" / "jobs")
VERTEX_CODE = str(Path(__file__).resolve().parents[2] / "example_dags" / "mlengine_code")
DEADLINE_S = 300.0  # a loaded machine boots an emulated instance slowly; the wait ends at the condition


@pytest.fixture()
def triggers_run(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The class names of the triggers ``dag.test()`` ran (each is a deferral)."""
    from airflow.sdk.definitions import dag as dag_module

    ran: list[str] = []
    real = dag_module._run_inline_trigger

    def spy(trigger: Any, ti: Any) -> Any:
        ran.append(type(trigger).__name__)
        return real(trigger, ti)

    monkeypatch.setattr(dag_module, "_run_inline_trigger", spy)
    return ran


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def ended_before_defer(monkeypatch: pytest.MonkeyPatch) -> None:
    """``RunAttempt.start`` returns once the launched job's final status is in the run folder."""
    from airflow_cloudtrain.lifecycle.run.abandon import has_final_status
    from airflow_cloudtrain.lifecycle.run.attempt import RunAttempt

    real = RunAttempt.start

    def start(self: RunAttempt) -> Any:
        launch, done = real(self)
        if done is None:
            wait_for(lambda: has_final_status(self.folder, launch.instance_id), "the job's final status")
        return launch, done

    monkeypatch.setattr(RunAttempt, "start", start)


def dag_source(dag_id: str, operator: str, args: str) -> str:
    return textwrap.dedent(
        f"""
        from datetime import datetime
        from airflow.sdk import DAG
        from airflow_cloudtrain.operators import {operator}

        with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            {operator}(task_id="train", deferrable=True, poll_interval=0.5, live_prices=False, {args})
        """
    )


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_cloud_train_over_before_defer_finishes_in_the_worker(
    emu, airflow_db, monkeypatch, capfd, triggers_run, provider: str
) -> None:
    ended_before_defer(monkeypatch)
    cloud, bucket, region = {
        "aws": ("ec2spot", "s3://cloudtrain-emulated/nodefer", "us-east-1"),
        "gcp": ("gcspot", "gs://cloudtrain-emulated/nodefer", "us-central1"),
    }[provider]
    args = f'cloud={cloud!r}, cpus=2, ram="4g", command="echo quick-and-done", bucket={bucket!r}, region={region!r}'
    run = write_dag(
        dag_source(f"nodefer_train_{provider}", "CloudTrainOperator", args), f"nodefer_train_{provider}"
    ).test()
    assert task_states(run) == {"train": "success"}
    assert triggers_run == []  # finished in the worker: never deferred
    result = xcom(run, "train")
    assert result["exit_code"] == 0 and result["cloud"] == cloud and result["cost_usd"] > 0
    out = capfd.readouterr().out
    assert "quick-and-done" in out  # the job's log still reached the task log
    assert "finishing in the worker, not deferring" in out
    assert emu.running_instances() == []


def test_checkpoint_resume_over_before_defer_finishes_in_the_worker(
    emu, airflow_db, monkeypatch, triggers_run
) -> None:
    ended_before_defer(monkeypatch)
    args = (
        'cloud="ec2spot", cpus=2, ram="4g", code=' + repr(JOBS) + ', command="python3 steps.py 3 1 0.05", '
        'bucket="s3://cloudtrain-emulated/nodefer", region="us-east-1", checkpoint_interval=1'
    )
    run = write_dag(dag_source("nodefer_resume", "CheckpointResumeOperator", args), "nodefer_resume").test()
    assert task_states(run) == {"train": "success"}
    assert triggers_run == []
    result = xcom(run, "train")
    assert result["exit_code"] == 0 and result["interruptions"] == 0
    assert [a["ended"] for a in result["attempts"]] == ["finished"]
    assert emu.running_instances() == []


def test_mlengine_over_before_defer_finishes_in_the_worker(
    emu, airflow_db, monkeypatch, triggers_run
) -> None:
    from airflow_cloudtrain.lifecycle.vertex.job import VertexJobRun

    real = VertexJobRun.start

    def start(self: VertexJobRun) -> Any:
        job = real(self)
        wait_for(lambda: (self.jobs.get(job.name) or job).terminal, f"{job.name} to end")
        return job

    monkeypatch.setattr(VertexJobRun, "start", start)
    source = textwrap.dedent(
        f"""
        from datetime import datetime
        from airflow.sdk import DAG
        from airflow_cloudtrain.operators import MLEngineTrainOperator

        with DAG("nodefer_vertex", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            MLEngineTrainOperator(task_id="train", region="us-central1", bucket="gs://cloudtrain-emulated/nodefer",
                code={VERTEX_CODE!r}, python_module="trainer.task", deferrable=True, poll_interval=0.5,
                log_polling_interval=0.5, training_args=["--steps", "2", "--step-s", "0.05"])
        """
    )
    run = write_dag(source, "nodefer_vertex").test()
    assert task_states(run) == {"train": "success"}
    assert triggers_run == []
    result = xcom(run, "train")
    assert result["state"] == "JOB_STATE_SUCCEEDED" and result["job_id"].startswith("train_")


@pytest.mark.parametrize("operator", ["SpotFleetOperator", "PreemptibleGroupOperator"])
def test_fleet_over_before_defer_finishes_in_the_worker(
    emu, airflow_db, monkeypatch, triggers_run, operator: str
) -> None:
    from airflow_cloudtrain.lifecycle.fleet.run import FleetRun
    from airflow_cloudtrain.lifecycle.fleet.watch import read_outcomes

    real = FleetRun.start

    def start(self: FleetRun) -> Any:
        handle = real(self)
        wait_for(lambda: len(read_outcomes(self.folder, set())) == len(handle.item_ids), "every outcome")
        return handle

    monkeypatch.setattr(FleetRun, "start", start)
    where = (
        'bucket="s3://cloudtrain-emulated/nodefer", region="us-east-1"'
        if operator == "SpotFleetOperator"
        else 'bucket="gs://cloudtrain-emulated/nodefer", region="us-central1"'
    )
    items = [{"steps": 1, "step_s": 0.05}]
    args = f'cpus=2, ram="4g", code={JOBS!r}, command="python3 item.py", {where}, work_items={items!r}'
    dag_id = f"nodefer_{operator.lower()}"
    run = write_dag(dag_source(dag_id, operator, args), dag_id).test()
    assert task_states(run) == {"train": "success"}
    assert triggers_run == []
    result = xcom(run, "train")
    assert result["items_total"] == 1 and result["items_succeeded"] == 1 and result["items_failed"] == []
    assert emu.running_instances() == []


def test_sensors_whose_condition_holds_return_without_deferring(emu, airflow_db, triggers_run) -> None:
    import boto3

    ec2, sqs = boto3.client("ec2"), boto3.client("sqs")
    image = an_image(ec2)
    iid = ec2.run_instances(ImageId=image, InstanceType="t3.micro", MinCount=1, MaxCount=1)["Instances"][0][
        "InstanceId"
    ]
    url = sqs.create_queue(QueueName="nodefer-empty")["QueueUrl"]
    try:
        wait_for(
            lambda: (
                ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]["Name"]
                == "running"
            ),
            f"{iid} to run",
        )
        source = textwrap.dedent(
            f"""
            from datetime import datetime
            from airflow.sdk import DAG
            from airflow_cloudtrain.sensors import InstanceStatusSensor, QueueDepthSensor

            with DAG("nodefer_sensors", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
                InstanceStatusSensor(task_id="running", cloud="ec2", instance_ids=[{iid!r}],
                                     target_state="running", poke_interval=0.5, timeout=120, deferrable=True)
                QueueDepthSensor(task_id="drained", queue={url!r}, max_depth=0, poll_interval=0.5, timeout=120,
                                 deferrable=True)
            """
        )
        run = write_dag(source, "nodefer_sensors").test()
        assert task_states(run) == {"running": "success", "drained": "success"}
        assert triggers_run == []
        assert xcom(run, "drained")["depth"] == 0
    finally:
        ec2.terminate_instances(InstanceIds=[iid])
        sqs.delete_queue(QueueUrl=url)
