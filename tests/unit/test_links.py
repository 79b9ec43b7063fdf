"""Console links: the URL of each thing a task makes, on each cloud; the provider registers every link
class; and Airflow's DAG serialization (what the scheduler and UI read) keeps every operator's links."""

from __future__ import annotations

import json
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import pytest

import airflow_cloudtrain
from airflow_cloudtrain.core.records import LaunchRecord
from airflow_cloudtrain.links.console import (
    asg_url,
    ec2_instance_url,
    folder_url,
    gce_instance_url,
    mig_url,
    target_of,
)
from airflow_cloudtrain.links.run import (
    CONSOLE_XCOM_KEY,
    CloudInstanceLink,
    RunFolderLink,
    WorkerGroupLink,
    fleet_target,
    push_console_links,
    run_target,
)

RUN_URI = "s3://my-bucket/training/dag/train/manual__2026/try-1"


@pytest.mark.parametrize("region", ["us-east-1", "eu-west-1", "ap-southeast-2"])
def test_ec2_instance_and_asg_urls_are_in_the_run_s_region(region: str) -> None:
    assert ec2_instance_url(region, "i-0abc123") == (
        f"https://{region}.console.aws.amazon.com/ec2/home?region={region}#InstanceDetails:instanceId=i-0abc123"
    )
    assert asg_url(region, "ct-9f8e") == (
        f"https://{region}.console.aws.amazon.com/ec2/home?region={region}"
        "#AutoScalingGroupDetails:id=ct-9f8e;view=details"
    )


@pytest.mark.parametrize(("project", "zone"), [("my-proj", "us-central1-b"), ("other-42", "europe-west4-a")])
def test_gce_vm_and_mig_urls_name_zone_and_project(project: str, zone: str) -> None:
    assert gce_instance_url(project, zone, "ct-1234-t1-a0") == (
        f"https://console.cloud.google.com/compute/instancesDetail/zones/{zone}/instances/ct-1234-t1-a0"
        f"?project={project}"
    )
    assert mig_url(project, zone, "ct-1234") == (
        f"https://console.cloud.google.com/compute/instanceGroups/details/{zone}/ct-1234?project={project}"
    )


def test_run_folder_urls_open_the_folder_in_the_bucket_browser() -> None:
    assert folder_url(RUN_URI, "us-east-1") == (
        "https://s3.console.aws.amazon.com/s3/buckets/my-bucket?region=us-east-1&showversions=false"
        "&prefix=training/dag/train/manual__2026/try-1/"
    )
    assert folder_url("gs://bkt/runs/a b+c/", None, "my-proj") == (
        "https://console.cloud.google.com/storage/browser/bkt/runs/a%20b%2Bc?project=my-proj"
    )
    assert folder_url("gs://bkt", None, None) == "https://console.cloud.google.com/storage/browser/bkt"
    assert folder_url("file:///tmp/x") == ""


def _launch(cloud: str, **kw: Any) -> LaunchRecord:
    return LaunchRecord(run_id="r1", run_uri=kw.pop("run_uri", RUN_URI), cloud=cloud, **kw)


@pytest.mark.parametrize(
    ("cloud", "region", "zone", "iid", "project", "instance", "folder"),
    [
        (
            "ec2spot",
            "us-west-2",
            "us-west-2c",
            "i-0f00",
            None,
            "https://us-west-2.console.aws.amazon.com/ec2/home?region=us-west-2#InstanceDetails:instanceId=i-0f00",
            "https://s3.console.aws.amazon.com/s3/buckets/my-bucket?region=us-west-2",
        ),
        (
            "gcspot",
            "us-central1",
            "us-central1-f",
            "ct-ab-t2-a1",
            "proj-1",
            "https://console.cloud.google.com/compute/instancesDetail/zones/us-central1-f/instances/ct-ab-t2-a1"
            "?project=proj-1",
            "https://console.cloud.google.com/storage/browser/bkt/runs/r1?project=proj-1",
        ),
    ],
)
def test_instance_and_folder_links_of_a_launch(
    cloud: str, region: str, zone: str, iid: str, project: str | None, instance: str, folder: str
) -> None:
    run_uri = RUN_URI if cloud.startswith("ec2") else "gs://bkt/runs/r1"
    target = run_target(_launch(cloud, region=region, zone=zone, instance_id=iid, run_uri=run_uri), project)
    assert json.loads(json.dumps(target)) == target  # plain data: it travels as XCom
    assert CloudInstanceLink().url(target) == instance
    assert RunFolderLink().url(target).startswith(folder)
    assert WorkerGroupLink().url(target) == ""  # a single run has no group


def test_group_links_of_a_fleet() -> None:
    aws = SimpleNamespace(cloud="ec2spot", region="eu-west-1", zone=None, run_uri=RUN_URI, group="ct-77")
    gcp = SimpleNamespace(
        cloud="gcspot", region="us-central1", zone="us-central1-a", run_uri="gs://b/r", group="ct-77"
    )
    assert WorkerGroupLink().url(fleet_target(aws, None)) == asg_url("eu-west-1", "ct-77")
    assert WorkerGroupLink().url(fleet_target(gcp, "p-123")) == mig_url("p-123", "us-central1-a", "ct-77")
    assert CloudInstanceLink().url(fleet_target(gcp, "p-123")) == ""


def test_a_missing_or_foreign_xcom_gives_no_link() -> None:
    assert target_of(None) is None and target_of("https://x") is None and target_of({"a": 1}) is None
    target = run_target(_launch("gcloud", region="us-central1", instance_id="vm-1"), "p")  # no zone yet
    assert CloudInstanceLink().url(target) == ""


class RecordingTi:
    """Airflow's task instance, as far as pushing XCom goes."""

    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def test_push_writes_the_target_and_each_link_s_own_xcom() -> None:
    from airflow_cloudtrain.operators import CloudTrainOperator

    op = CloudTrainOperator(task_id="t", command="true", bucket="s3://my-bucket/training", region="us-east-1")
    ti = RecordingTi()
    push_console_links(ti, op, run_target(_launch("ec2", region="us-east-1", instance_id="i-1"), None))
    assert ti.pushed[CONSOLE_XCOM_KEY]["instance_id"] == "i-1"
    assert ti.pushed["_link_CloudInstanceLink"] == ec2_instance_url("us-east-1", "i-1")
    assert ti.pushed["_link_RunFolderLink"] == folder_url(RUN_URI, "us-east-1")


LINK_CLASSES = {
    "airflow_cloudtrain.links.run.CloudInstanceLink",
    "airflow_cloudtrain.links.run.RunFolderLink",
    "airflow_cloudtrain.links.run.WorkerGroupLink",
    "airflow_cloudtrain.links.vertex.VertexJobLink",
}


def test_provider_info_registers_every_link_class() -> None:
    import importlib

    from airflow.providers_manager import ProvidersManager

    registered = set(airflow_cloudtrain.get_provider_info()["extra-links"])
    assert registered == LINK_CLASSES
    for path in registered:
        module, _, name = path.rpartition(".")
        assert getattr(importlib.import_module(module), name)().name
    assert set(ProvidersManager().extra_links_class_names) >= LINK_CLASSES


def _dag() -> Any:
    from airflow.sdk import DAG

    from airflow_cloudtrain.operators import (
        CheckpointResumeOperator,
        CloudTrainOperator,
        MLEngineTrainOperator,
        PreemptibleGroupOperator,
        SpotFleetOperator,
    )

    with DAG("links_roundtrip", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
        CloudTrainOperator(task_id="single", command="true", bucket="s3://b-1/x", region="us-east-1")
        CheckpointResumeOperator(
            task_id="resume", cloud="gcspot", command="true", bucket="gs://b-1/x", region="us-central1"
        )
        SpotFleetOperator(task_id="fleet", command="true", bucket="s3://b-1/x", work_items=["a"])
        PreemptibleGroupOperator(task_id="group", command="true", bucket="gs://b-1/x", work_items=["a"])
        MLEngineTrainOperator(
            task_id="vertex",
            region="us-central1",
            bucket="gs://b-1/x",
            code="gs://b-1/p.tar.gz",
            scale_tier="BASIC",
            python_module="trainer.task",
        )
    return dag


EXPECTED = {
    "single": {"Cloud instance": "_link_CloudInstanceLink", "Run folder": "_link_RunFolderLink"},
    "resume": {"Cloud instance": "_link_CloudInstanceLink", "Run folder": "_link_RunFolderLink"},
    "fleet": {"Worker group": "_link_WorkerGroupLink", "Run folder": "_link_RunFolderLink"},
    "group": {"Worker group": "_link_WorkerGroupLink", "Run folder": "_link_RunFolderLink"},
    "vertex": {"Vertex AI job": "_link_VertexJobLink"},
}


def test_serialized_dag_keeps_every_operator_s_links(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.serialization.serialized_objects import DagSerialization

    # as the api-server reads it (its DAG bag loads operator links); a scheduler loop run in this
    # worker before (dag.test()) leaves Airflow's class-wide switch off
    monkeypatch.setattr(DagSerialization, "_load_operator_extra_links", True)
    data = DagSerialization.to_dict(_dag())
    DagSerialization.validate_schema(data)
    restored = DagSerialization.from_dict(json.loads(json.dumps(data)))  # as stored in the DB
    for task_id, expected in EXPECTED.items():
        links = restored.get_task(task_id).operator_extra_links
        assert {link.name: link.xcom_key for link in links} == expected, task_id
