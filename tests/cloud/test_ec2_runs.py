"""CloudTrainOperator on the emulated AWS, inside real Airflow: every way a run can end.

Each scenario checks what a user would: the task's state, the run folder's status, and that the
instance is terminated (the ``emu`` fixture also fails any test that leaves one alive).
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import threading
import time
from typing import Any

import boto3
import pytest
from dag_helpers import task_states, write_dag, xcom

from airflow_cloudtrain.agent.storage import open_run_folder
from airflow_cloudtrain.catalog import rank_offers
from airflow_cloudtrain.runs import RunKey, RunStatus, join, status_key
from airflow_cloudtrain.spec import Hardware

BUCKET = "s3://cloudtrain-emulated/tests"
SECRET = "s3cr3t-Value-9f2"
LONG_JOB = "trap 'echo got SIGTERM; exit 143' TERM; echo started; for i in $(seq 1 600); do sleep 0.1; done"


def scenario(dag_id: str, command: str, cloud: str = "ec2spot", deferrable: bool = False, extra: str = "",
             operator: str = "CloudTrainOperator", preamble: str = "") -> Any:  # fmt: skip
    header = "from datetime import datetime, timedelta\nfrom airflow.sdk import DAG\n"
    header += "from airflow_cloudtrain.operators import CloudTrainOperator\n"
    body = textwrap.dedent(
        f"""
        with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            {operator}(task_id="train", cloud={cloud!r}, cpus=2, ram="4g", command={command!r},
                       bucket={BUCKET!r}, poll_interval=0.5, deferrable={deferrable}, live_prices=False,
                       env={{"WANDB_API_KEY": {SECRET!r}}} {extra})
        """
    )
    return write_dag(header + textwrap.dedent(preamble) + body, dag_id)


def run_uri(dag_id: str, run: Any) -> str:
    return join(BUCKET, RunKey(dag_id, "train", run.run_id, -1).path())


def instances_of(dag_id: str, run: Any) -> list[dict[str, Any]]:
    short = RunKey(dag_id, "train", run.run_id, -1).short_id
    pages = boto3.client("ec2").describe_instances(Filters=[{"Name": "tag:cloudtrain-run", "Values": [short]}])
    return [i for r in pages["Reservations"] for i in r["Instances"]]


def status_of(dag_id: str, run: Any, instance_id: str) -> RunStatus:
    text = open_run_folder(run_uri(dag_id, run)).get_text(status_key(instance_id))
    assert text, "the agent wrote no status"
    return RunStatus.from_json(text)


def when_running(emu: Any, action: Any, timeout: float = 60) -> threading.Thread:
    """In the background: once an instance of ours is running and its job has started, act on it."""

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for inst in emu.running_instances():
                if "started" in emu.agent_log(inst["id"]) or _job_started(inst["id"]):
                    action(inst["id"])
                    return
            time.sleep(0.2)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _job_started(instance_id: str) -> bool:
    s3 = boto3.client("s3")
    keys = s3.list_objects_v2(Bucket="cloudtrain-emulated", Prefix="tests/runs/")
    for obj in keys.get("Contents", []):
        if obj["Key"].endswith(f"{instance_id}/status.json"):
            body = s3.get_object(Bucket="cloudtrain-emulated", Key=obj["Key"])["Body"].read()
            return json.loads(body)["state"] == "running"
    return False


def test_failing_command_fails_the_task_and_terminates(emu, airflow_db) -> None:
    run = scenario("fail_cmd", "echo about to fail; exit 3").test()
    assert task_states(run) == {"train": "failed"}
    (inst,) = instances_of("fail_cmd", run)
    assert inst["State"]["Name"] == "terminated"
    status = status_of("fail_cmd", run, inst["InstanceId"])
    assert (status.state, status.exit_code) == ("failed", 3)


@pytest.mark.parametrize("deferrable", [False, True], ids=["blocking", "deferrable"])
def test_spot_interruption_fails_with_a_spot_error(emu, airflow_db, capfd, deferrable: bool) -> None:
    dag_id = f"spot_{int(deferrable)}"
    # the agent polls instance metadata every 5 s; AWS gives 2 minutes of notice
    watcher = when_running(emu, lambda iid: emu.interrupt(iid, notice_s=7))
    run = scenario(dag_id, LONG_JOB, deferrable=deferrable).test()
    watcher.join(5)
    assert task_states(run) == {"train": "failed"}
    assert "spot interruption: " in capfd.readouterr().out
    (inst,) = instances_of(dag_id, run)
    assert inst["State"]["Name"] == "terminated"
    status = status_of(dag_id, run, inst["InstanceId"])
    assert status.state == "interrupted" and status.interruption["kind"] == "spot"
    log = "".join(open_run_folder(run_uri(dag_id, run)).get_text(k) or ""
                  for k in open_run_folder(run_uri(dag_id, run)).list(f"instances/{inst['InstanceId']}/logs/"))  # fmt: skip
    assert "got SIGTERM" in log  # the job was told, and could have saved a checkpoint


def test_killed_task_terminates_its_instance(emu, airflow_db) -> None:
    """SIGTERM to the task process is how Airflow kills a running task; on_kill must take the instance."""
    before = signal.getsignal(signal.SIGTERM)
    try:
        watcher = when_running(emu, lambda iid: os.kill(os.getpid(), signal.SIGTERM))
        run = scenario("killed", LONG_JOB, cloud="ec2").test()
        watcher.join(5)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert task_states(run) == {"train": "failed"}
    (inst,) = instances_of("killed", run)
    assert inst["State"]["Name"] == "terminated"
    assert inst["StateReason"]["Code"] == "Client.UserInitiatedShutdown"  # by on_kill, not by the agent


CRASH = """
from airflow_cloudtrain.operators.cloud_train import STATE_KEY

class CrashAfterLaunch(CloudTrainOperator):
    # the worker dies between RunInstances and the wait: nothing of ours runs after that
    def _launch(self, context, *args, **kwargs):
        launch = super()._launch(context, *args, **kwargs)
        if context["ti"].try_number == 1:
            if {forget_state_store}:
                context["task_state_store"].delete(STATE_KEY)
            raise RuntimeError("worker lost right after launching")
        return launch
"""


@pytest.mark.parametrize("via", ["task_state_store", "tags"])
def test_retry_after_crash_adopts_the_first_instance(emu, airflow_db, via: str) -> None:
    emu.reset_counts()
    dag_id = f"crash_{via}"
    dag = scenario(dag_id, "echo trained", operator="CrashAfterLaunch",
                   preamble=CRASH.format(forget_state_store=via == "tags"),
                   extra=", retries=1, retry_delay=timedelta(seconds=0)")  # fmt: skip
    run = dag.test()
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    assert result["adopted"] is True
    assert emu.request_counts().get("RunInstances") == 1  # no second instance
    (inst,) = instances_of(dag_id, run)
    assert inst["InstanceId"] == result["instance_id"] and inst["State"]["Name"] == "terminated"


def test_capacity_error_fails_over_to_the_next_offer(emu, airflow_db) -> None:
    first, second = rank_offers("ec2spot", Hardware(2, 0, "4g"), region="us-east-1")[:2]
    emu.fail_capacity(first.instance_type)
    run = scenario("failover", "echo ok").test()
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    assert result["failover"] == [[first.instance_type, "us-east-1", "InsufficientInstanceCapacity"]]
    assert result["instance_type"] == second.instance_type


def test_no_capacity_anywhere_lists_what_was_tried(emu, airflow_db, capfd) -> None:
    offers = rank_offers("ec2spot", Hardware(2, 0, "4g"), region="us-east-1")[:2]
    for offer in offers:
        emu.fail_capacity(offer.instance_type)
    run = scenario("nocapacity", "echo ok", extra=", max_launch_attempts=2").test()
    assert task_states(run) == {"train": "failed"}
    out = capfd.readouterr().out
    assert "no capacity for any of 2 offers tried" in out
    assert all(f"{o.instance_type} in us-east-1: InsufficientInstanceCapacity" in out for o in offers)
    assert instances_of("nocapacity", run) == []


def test_no_credentials_in_user_data_xcom_or_logs(emu, airflow_db, capfd) -> None:
    run = scenario("nosecrets", "echo job ran").test()
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    (inst,) = instances_of("nosecrets", run)
    raw = boto3.client("ec2").describe_instance_attribute(InstanceId=inst["InstanceId"], Attribute="userData")
    import base64

    user_data = base64.b64decode(raw["UserData"]["Value"]).decode()
    assert "python3" in user_data and "--run-uri" in user_data  # it is the real bootstrap
    logs = capfd.readouterr().out
    for where, text in {"user data": user_data, "XCom": json.dumps(result), "logs": logs}.items():
        assert SECRET not in text, where
        assert os.environ["AWS_SECRET_ACCESS_KEY"] not in text.replace("tests", ""), where
        assert "aws_secret_access_key" not in text.lower(), where
