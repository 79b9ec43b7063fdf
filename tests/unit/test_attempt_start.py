"""What a retried task does with what earlier tries left (``RunAttempt._earlier``), decision by decision.

The run folder and the cloud are in-memory stand-ins with the same calls; the decisions are ours.
"""

from __future__ import annotations

import json
import logging

from airflow_cloudtrain.contract.runs import RunKey, RunStatus, delivered_key, status_key
from airflow_cloudtrain.core.cloud import Instance
from airflow_cloudtrain.lifecycle.prepare import LaunchOptions, WaitSettings
from airflow_cloudtrain.lifecycle.run.attempt import RunAttempt, RunContext
from airflow_cloudtrain.operators.config import parse_config

BUCKET = "s3://bucket/runs"


class Folder:
    def __init__(self) -> None:
        self.objects: dict[str, str] = {}

    def list(self, prefix: str) -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))

    def get_text(self, key: str) -> str | None:
        return self.objects.get(key)

    def put_text(self, key: str, text: str) -> None:
        self.objects[key] = text


class Cloud:
    def __init__(self, instances: list[Instance]) -> None:
        self.instances = {i.id: i for i in instances}

    def find(self, digest: str, ended: bool = False) -> list[Instance]:
        return [i for i in self.instances.values() if ended or i.state in ("pending", "running")]

    def describe(self, ids: list[str]) -> dict[str, Instance]:
        gone = Instance("?", "terminated", "", None, False, missing=True)
        return {i: self.instances.get(i, gone) for i in ids}


class Backend:
    provider = "aws"
    region = "us-east-1"

    def __init__(self, instances: list[Instance], folder: Folder) -> None:
        self.cloud = Cloud(instances)
        self.folder = folder
        self.terminated: list[str] = []

    def bind_region(self, region: str) -> None:
        self.region = region

    def run_folder(self, run_uri: str) -> Folder:
        return self.folder

    def location(self, zone: str | None) -> str | None:
        return self.region

    def terminate_instances(self, pairs: list[tuple[str, str | None]]) -> None:
        self.terminated.extend(i for i, _ in pairs)
        for iid, _ in pairs:
            self.cloud.instances.pop(iid, None)


def attempt(instances: list[Instance], folder: Folder) -> tuple[RunAttempt, Backend]:
    config = parse_config({"cloud": "ec2spot", "command": "train", "bucket": BUCKET, "cpus": 2})
    backend = Backend(instances, folder)
    ctx = RunContext(
        config,
        RunKey("d", "t", "r", -1, BUCKET),
        backend,
        None,
        2,
        LaunchOptions(),
        logging.getLogger("test"),
        WaitSettings(),
    )
    return RunAttempt(ctx), backend


def inst(iid: str, state: str) -> Instance:
    return Instance(iid, state, "t3.small", "us-east-1a", True, tags={"cloudtrain-price-microusd": "12000"})


def finished(folder: Folder, iid: str, state: str = "succeeded") -> None:
    status = RunStatus(state=state, instance_id=iid, exit_code=0 if state == "succeeded" else 1, ended_at=1.0)
    folder.put_text(status_key(iid), status.to_json())


def test_an_unreported_final_status_is_delivered_and_nothing_launches() -> None:
    folder = Folder()
    finished(folder, "i-1")
    run, _ = attempt([inst("i-1", "terminated")], folder)
    launch, outcome = run._earlier()
    assert (launch.instance_id, launch.adopted, launch.hourly_usd) == ("i-1", True, 0.012)
    assert outcome is not None and outcome.ok and outcome.ended_at == 1.0


def test_a_reported_end_is_history_and_the_job_runs_again() -> None:
    folder = Folder()
    finished(folder, "i-1", "failed")
    folder.put_text(delivered_key("i-1"), json.dumps({"state": "failed"}))
    run, _ = attempt([], folder)
    assert run._earlier() is None  # a retry after a reported failure launches again


def test_a_live_instance_is_adopted_and_duplicates_released() -> None:
    folder = Folder()
    run, backend = attempt([inst("i-1", "running"), inst("i-2", "running")], folder)
    launch, outcome = run._earlier()
    assert outcome is None and launch.instance_id == "i-1" and launch.adopted
    assert backend.terminated == ["i-2"]


def test_an_ended_instance_without_a_final_status_is_deleted_then_launched_again() -> None:
    folder = Folder()
    run, backend = attempt([inst("vm-1", "terminated")], folder)  # a powered-off GCE VM still exists
    assert run._earlier() is None
    assert backend.terminated == ["vm-1"]


def test_a_live_instance_a_teardown_gave_up_on_is_released_not_adopted() -> None:
    folder = Folder()
    folder.put_text(delivered_key("i-1"), json.dumps({"state": "released"}))
    run, backend = attempt([inst("i-1", "running")], folder)
    assert run._earlier() is None
    assert backend.terminated == ["i-1"]
