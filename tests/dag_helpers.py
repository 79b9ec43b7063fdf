"""Running DAGs inside real Airflow from tests: files go into the DAGs folder, then dag.test()."""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest


def dags_folder() -> Path:
    return Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])


def _import(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"dag_{path.stem}_{time.monotonic_ns()}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def write_dag(source: str, name: str) -> Any:
    """Put a DAG file into the DAGs folder (dag.test() needs it there) and import it."""
    path = dags_folder() / f"{name}.py"
    path.write_text(source)
    return _import(path)


EXAMPLE_DAGS = Path(__file__).resolve().parents[1] / "example_dags"  # a DAG bundle of its own (conftest)


def load_example(name: str) -> Any:
    """An example DAG (or a DAG a test wrote), imported fresh (module-level settings such as
    deferrable are re-read)."""
    example = EXAMPLE_DAGS / f"{name}.py"
    return _import(example if example.exists() else dags_folder() / f"{name}.py")


def task_states(run: Any) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


def xcom(run: Any, task_id: str) -> Any:
    return run.get_task_instance(task_id).xcom_pull(task_ids=task_id)


def start_first_try(dag_id: str, logical_date: datetime, env: dict[str, str]) -> Any:
    """Start try 1 of a DAG run in a process of its own (``env`` added to ours: what makes it die):
    a fork of a warm parent with ``subprocess.Popen``'s face (``tests/first_try.py``)."""
    import first_try

    return first_try.start(dag_id, logical_date, env)


def fleet_nothing_left(digest: str, client: Callable[[str], Any] | None = None) -> None:
    """A fleet run's queues, group, launch template and instances (by run key) are all gone; asked with
    ``client(service)`` (default: boto3's, from the environment: the test session's emulated AWS)."""
    import boto3

    client = client or boto3.client
    sqs, asg, ec2 = client("sqs"), client("autoscaling"), client("ec2")
    assert sqs.list_queues(QueueNamePrefix=f"ct-{digest}").get("QueueUrls", []) == []
    groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[f"ct-{digest}"])["AutoScalingGroups"]
    assert groups == []
    templates = ec2.describe_launch_templates(
        Filters=[{"Name": "launch-template-name", "Values": [f"ct-{digest}"]}]
    )["LaunchTemplates"]
    assert templates == []
    alive = ec2.describe_instances(
        Filters=[
            {"Name": "tag:cloudtrain-run-key", "Values": [digest]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
    )["Reservations"]
    assert alive == []


def gce_fleet_nothing_left(emu: Any, digest: str) -> None:
    """A GCE fleet run's topics, subscriptions, template, group, VMs and firewall rules (by run key)
    are all gone, asked through the real Google clients."""
    from google.api_core import exceptions as gexc
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1
    from google.pubsub_v1 import PublisherClient, SubscriberClient

    from airflow_cloudtrain.emulator import GCP_PROJECT
    from airflow_cloudtrain.emulator.gcp.gce import compute_client_kwargs

    pubsub = {"credentials": AnonymousCredentials(), "client_options": {"api_endpoint": emu.pubsub_endpoint}}
    publisher, subscriber = (
        PublisherClient(transport="rest", **pubsub),
        SubscriberClient(transport="rest", **pubsub),
    )
    for suffix in ("items", "dlq"):
        with pytest.raises(gexc.NotFound):
            publisher.get_topic(topic=f"projects/{GCP_PROJECT}/topics/ct-{digest}-{suffix}")
        with pytest.raises(gexc.NotFound):
            subscriber.get_subscription(
                subscription=f"projects/{GCP_PROJECT}/subscriptions/ct-{digest}-{suffix}"
            )
    compute = compute_client_kwargs(emu.gce_endpoint)
    with pytest.raises(gexc.NotFound):
        compute_v1.InstanceTemplatesClient(**compute).get(
            project=GCP_PROJECT, instance_template=f"ct-{digest}"
        )
    groups = compute_v1.InstanceGroupManagersClient(**compute)
    for zone in ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"):
        with pytest.raises(gexc.NotFound):
            groups.get(project=GCP_PROJECT, zone=zone, instance_group_manager=f"ct-{digest}")
    alive = [i for i in emu.gce.alive() if i["labels"].get("cloudtrain-run-key") == digest]
    assert alive == [], alive
    rules = [r.name for r in compute_v1.FirewallsClient(**compute).list(project=GCP_PROJECT)]
    assert [r for r in rules if r.startswith(f"ct-{digest}-")] == []  # the workers' firewall rules
