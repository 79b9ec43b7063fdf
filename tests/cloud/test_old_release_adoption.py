"""A run started by the previous release (0.1.0, commit 44b71dd) is adopted by this code, on EC2 and GCE.

The run folder format and the ``task_state_store`` entries are the contract between releases: an
upgrade may land while a task's instance trains, its worker lost (deploys restart workers). What
0.1.0 wrote for such a run is stored in ``tests/data/release_0_1_0/`` (``ec2/``, ``gce/``; how it was
captured: the README there): its ledger, its launch record, the files it put in the run folder, the
tags / labels it gave the instance, the user data / startup script it booted it with and, on GCE, the
run's firewall rule. The test plays that state back, for each provider (the ``provider`` parameter):

1. what the old ledger names is created in the emulator as 0.1.0 made it (GCE: the run's deny-all
   firewall rule, then the VM; EC2: the instance), with the same tags / labels, bootstrap and spot
   scheduling, and the old run folder files are uploaded;
2. try 1 is a worker that writes the old ``task_state_store`` entries and dies (SIGKILL), as the
   0.1.0 worker did while it waited;
3. try 2 is this release's ``CloudTrainOperator`` with the same run key (dag_id, task_id, run_id,
   map index, bucket).

What a user checks: the task succeeded on that instance (adopted, no second launch), the job's result
is delivered, and the instance is released (nothing of the run left in the cloud: the ``emu`` fixture
also fails on a live instance or a run's firewall rule left behind).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from dag_helpers import load_example, start_first_try, task_states, write_dag, xcom
from waiting import wait_for

from airflow_cloudtrain.contract.runs import RunKey
from airflow_cloudtrain.storage import open_run_folder

DATA_ROOT = Path(__file__).resolve().parents[1] / "data" / "release_0_1_0"
DATA = DATA_ROOT / "ec2"
WHEN = datetime(2026, 1, 1, tzinfo=timezone.utc)

DAG_SOURCE = """
import json
import os
import signal
from datetime import datetime

from airflow.sdk import DAG

from airflow_cloudtrain.operators import CloudTrainOperator

OLD_STORE = os.environ.get("CLOUDTRAIN_TEST_OLD_STORE")  # set only in the process that plays 0.1.0's worker


class Release010Worker(CloudTrainOperator):
    def execute(self, context):
        if OLD_STORE:  # what 0.1.0's worker had stored when it was lost mid-wait; then it is gone
            store = context["task_state_store"]
            with open(OLD_STORE) as f:
                for key, value in json.load(f).items():
                    if value is not None:
                        store.set(key, value)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().execute(context)


with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    Release010Worker(task_id="train", cloud="{cloud}", cpus=2, ram="4g", bucket="{bucket}",
                     region="{region}", poll_interval=0.5, live_prices=False,
                     command="echo started; sleep 2; echo trained > $CLOUDTRAIN_OUTPUT_DIR/model.txt")
"""


def render(text: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        text = text.replace("{{" + name + "}}", value)
    assert "{{" not in text, text
    return text


def launch_ec2(data: Path, region: str) -> str:
    """The instance, as 0.1.0's launch made it: its tags, type, zone, spot, bootstrap."""
    import boto3

    instance = json.loads((data / "instance.json").read_text())
    ec2 = boto3.client("ec2", region_name=region)
    made = ec2.run_instances(
        ImageId=instance["ImageId"],
        InstanceType=instance["InstanceType"],
        MinCount=1,
        MaxCount=1,
        UserData=(data / "user_data.sh").read_text(),
        Placement={"AvailabilityZone": instance["Placement"]["AvailabilityZone"]},
        InstanceMarketOptions={"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time"}},
        TagSpecifications=[{"ResourceType": "instance", "Tags": instance["Tags"]}],
    )
    return str(made["Instances"][0]["InstanceId"])


def launch_gce(data: Path, region: str) -> str:
    """The run's firewall rule and its VM, as 0.1.0's launch made them: the insert bodies it sent
    (labels, machine type, Spot scheduling, network tag, startup script), through the real clients."""
    from google.cloud import compute_v1

    from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook

    hook = CloudTrainGcpHook()
    kwargs = hook._client_kwargs("compute_endpoint")  # the connection's endpoint: the emulator
    rule = json.loads((data / "firewall.json").read_text())
    firewalls = compute_v1.FirewallsClient(**kwargs)
    firewalls.insert(project=rule["project"], firewall_resource=compute_v1.Firewall(rule["body"])).result()
    instance = json.loads((data / "instance.json").read_text())
    body = instance["body"]
    body["metadata"]["items"].insert(
        0, {"key": "startup-script", "value": (data / "user_data.sh").read_text()}
    )
    resource = compute_v1.Instance({"name": instance["name"], **body})
    hook.instances_client().insert(
        project=hook.project, zone=instance["zone"], instance_resource=resource
    ).result()
    return str(instance["name"])


@dataclass(frozen=True)
class Old:
    """One provider's captured 0.1.0 run: where its files are and the DAG it was captured with."""

    data: Path
    dag_id: str  # as captured: the run key (and so the run folder) derives from these
    cloud: str
    bucket: str
    region: str
    launch: Callable[[Path, str], str]
    launch_call: str  # the emulator's name for a create call: none may come from the new code


OLD = {
    "aws": Old(DATA, "release_0_1_0", "ec2spot", "s3://cloudtrain-emulated/release-0-1-0", "us-east-1",
               launch_ec2, "RunInstances"),
    "gcp": Old(DATA_ROOT / "gce", "release_0_1_0_gce", "gcspot", "gs://cloudtrain-emulated/release-0-1-0",
               "us-central1", launch_gce, "instances.insert"),
}  # fmt: skip


@pytest.mark.parametrize("provider", list(OLD))
def test_a_run_launched_by_0_1_0_is_adopted_delivered_and_released(
    emu, airflow_db, tmp_path, provider
) -> None:
    old = OLD[provider]
    write_dag(
        DAG_SOURCE.format(dag_id=old.dag_id, cloud=old.cloud, bucket=old.bucket, region=old.region),
        old.dag_id,
    )
    run_uri = RunKey(old.dag_id, "train", f"manual__{WHEN.isoformat()}", -1, old.bucket)
    template = (old.data / "store.json").read_text()
    old_uri = json.loads(render(template, {"instance_id": "i-0", "launched_at": "0", "requested_at": "0"}))
    folder = open_run_folder(old_uri["cloudtrain_launch"]["run_uri"])
    assert folder.uri.endswith(run_uri.path())  # the same run key as 0.1.0's: the new code finds it

    # the run folder as 0.1.0's operator left it, then its instance (whose agent reads that folder)
    now = time.time()
    files = sorted(p for p in (old.data / "run_folder").rglob("*") if p.is_file())
    assert files, "no captured run folder files"
    for path in files:
        if "{{instance_id}}" not in path.read_text(errors="replace"):
            folder.put_bytes(str(path.relative_to(old.data / "run_folder")), path.read_bytes())
    iid = old.launch(old.data, old.region)
    values = {"instance_id": iid, "launched_at": f"{now:.4f}", "requested_at": f"{now - 3:.4f}"}
    for path in files:
        text = path.read_text(errors="replace")
        if "{{instance_id}}" in text:
            folder.put_text(str(path.relative_to(old.data / "run_folder")), render(text, values))
    store = tmp_path / "store.json"
    store.write_text(render(template, values))

    # try 1: 0.1.0's worker, lost while it waited
    proc = start_first_try(old.dag_id, WHEN, {"CLOUDTRAIN_TEST_OLD_STORE": str(store)})
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -9, f"try 1 did not die: rc={proc.returncode}\n{err[-3000:]}"

    # try 2: this release
    emu.reset_counts()
    run = load_example(old.dag_id).test(logical_date=WHEN, run_after=WHEN)
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    assert result["instance_id"] == iid and result["adopted"] is True
    assert not emu.request_counts().get(old.launch_call)  # no second launch
    assert result["results_uri"].endswith(f"/results/{iid}")
    assert folder.get_text(f"results/{iid}/model.txt") == "trained\n"
    # released: nothing of the run left (the emu fixture also fails on a live instance or a firewall rule)
    from airflow_cloudtrain.clouds.registry import backend_for

    assert backend_for(old.cloud, region=old.region).cloud.find(run_uri.digest, ended=False) == []
    assert emu.running_instances() == []


# -- CheckpointResumeOperator tasks that 0.1.0 deferred --------------------------------------------
# 0.1.0's loop deferred on a RunTrigger with method_name="attempt_complete" and on a DateTimeTrigger
# (a pause before the next launch) with "wait_complete"; Airflow stores that name with the trigger, so
# a task deferred before an upgrade resumes through it. The fields 0.1.0's RunTrigger event carried
# (``triggers/run.py``, ``lifecycle/records.py`` at 44b71dd): the resumed task gets exactly these.
OLD_EVENT_KEYS = ("outcome", "launch", "next_log_seq")
_STORE = render(
    (DATA / "store.json").read_text(), {"instance_id": "i", "launched_at": "0", "requested_at": "0"}
)
OLD_LAUNCH_FIELDS = tuple(json.loads(_STORE)["cloudtrain_launch"])  # 0.1.0's LaunchRecord, as it stored one
OLD_OUTCOME_FIELDS = ("status", "state", "exit_code", "message", "interrupted", "interruptions", "instance",
                      "ended_at", "seen_ended_at")  # fmt: skip
JOBS = str(Path(__file__).parent / "jobs")
OLD_NAMES_BUCKET = "s3://cloudtrain-emulated/release-0-1-0-names"

OLD_NAMES_SOURCE = """
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_cloudtrain.operators import CheckpointResumeOperator

OLD_NAME = {{"RunTrigger": "attempt_complete", "DateTimeTrigger": "wait_complete"}}


class Release010Deferred(CheckpointResumeOperator):
    # what 0.1.0 stored with each trigger, and the event as 0.1.0's trigger shaped it
    def defer(self, *, trigger, method_name, kwargs=None, timeout=None):
        super().defer(trigger=trigger, method_name=OLD_NAME[type(trigger).__name__], kwargs=kwargs,
                      timeout=timeout)

    def resume_execution(self, next_method, next_kwargs, context):
        print(f"resumed through {{next_method}}")
        event = (next_kwargs or {{}}).get("event")
        if isinstance(event, dict):
            event = {{key: event[key] for key in {event_keys!r}}}
            event["launch"] = {{k: v for k, v in event["launch"].items() if k in {launch!r}}}
            event["outcome"] = {{k: v for k, v in event["outcome"].items() if k in {outcome!r}}}
            next_kwargs = {{**next_kwargs, "event": event}}
        return super().resume_execution(next_method, next_kwargs, context)


with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    Release010Deferred(task_id="train", cloud="ec2spot", cpus=2, ram="4g", code={jobs!r}, command={command!r},
                       bucket={bucket!r}, region="us-east-1", poll_interval=0.5, live_prices=False,
                       checkpoint_interval=1, deferrable=True, {extra})
"""


def old_names_dag(dag_id: str, command: str, extra: str) -> Any:
    source = OLD_NAMES_SOURCE.format(
        dag_id=dag_id,
        jobs=JOBS,
        command=command,
        bucket=OLD_NAMES_BUCKET,
        extra=extra,
        event_keys=OLD_EVENT_KEYS,
        launch=OLD_LAUNCH_FIELDS,
        outcome=OLD_OUTCOME_FIELDS,
    )
    return write_dag(source, dag_id)


def test_a_loop_deferred_by_0_1_0_resumes_through_its_method_names_and_delivers(
    emu, airflow_db, capfd, tmp_path
) -> None:
    """No spot capacity at first and hours of slack: the deadline policy pauses (``wait_complete``),
    then the launch's wait resumes through ``attempt_complete``; the task delivers its XCom."""
    import threading

    import boto3

    emu.fail_capacity("t3.medium")
    s3 = boto3.client("s3")
    prefix = "release-0-1-0-names/runs/old_names_ok/"

    def capacity_error_in_ledger() -> bool:
        listing = s3.list_objects_v2(Bucket="cloudtrain-emulated", Prefix=prefix).get("Contents", [])
        keys = [obj["Key"] for obj in listing if "/ledger/" in obj["Key"]]
        return any(
            b"capacity_error" in s3.get_object(Bucket="cloudtrain-emulated", Key=k)["Body"].read()
            for k in keys
        )

    # The job holds before its last step until the attempt's wait runs in the triggerer (dag.test()'s
    # second "running trigger in line": the pause's is the first): a job that finished before the
    # deferral would be delivered in the worker (``RunAttempt.over``), with no ``attempt_complete``
    # to resume through, on a machine slow enough
    import logging

    release = tmp_path / "release"
    triggers = threading.Semaphore(0)

    class TriggerRuns(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "running trigger in line" in record.getMessage():
                triggers.release()

    watch = TriggerRuns()
    dag_log = logging.getLogger("airflow.sdk.definitions.dag")
    dag_log.addHandler(watch)

    def capacity_back() -> None:
        try:
            wait_for(capacity_error_in_ledger, timeout=180, interval=0.2)
        finally:
            emu.clear_faults()
        try:
            for _ in range(2):
                triggers.acquire(timeout=300)
        finally:
            release.touch()

    gap = threading.Thread(target=capacity_back, daemon=True)
    gap.start()
    extra = (
        "policy='deadline', deadline=timedelta(hours=6), expected_duration=60, "
        "instance_type='t3.medium', max_launch_attempts=1"
    )
    command = f"STEPS_FINISH_AFTER={release} python3 steps.py 4 2 0.2"
    try:
        run = old_names_dag("old_names_ok", command, extra).test()
    finally:
        dag_log.removeHandler(watch)
    gap.join(5)
    out = capfd.readouterr().out
    assert task_states(run) == {"train": "success"}, out[-3000:]
    assert "resumed through wait_complete" in out and "resumed through attempt_complete" in out
    assert "resumed through execute_complete" not in out
    result = xcom(run, "train")
    assert [r["ended"] for r in result["attempts"]] == ["capacity_error", "finished"]
    assert result["attempts"][1]["spot"] is True and result["totals"]["waited_s"] > 0
    assert emu.running_instances() == []


def test_a_failed_job_deferred_by_0_1_0_fails_the_task_through_attempt_complete(
    emu, airflow_db, capfd
) -> None:
    run = old_names_dag("old_names_fail", "python3 steps.py 8 2 0.2 5", "").test()
    out = capfd.readouterr().out
    assert task_states(run) == {"train": "failed"}
    assert "resumed through attempt_complete" in out
    assert "more than max_restarts_on_errors=0" in out
    assert emu.running_instances() == []
