"""InstanceStatusSensor inside Airflow: reaches its target, or fails fast when it never can."""

from __future__ import annotations

import textwrap

import boto3
import pytest
from dag_helpers import task_states, write_dag

from airflow_cloudtrain.emulator.aws.images import an_image


def plain_instance() -> str:
    """An instance that is not ours (no cloudtrain tags): the emulator leaves it alone."""
    ec2 = boto3.client("ec2")
    image = an_image(ec2)
    return ec2.run_instances(ImageId=image, InstanceType="t3.micro", MinCount=1, MaxCount=1)["Instances"][0][
        "InstanceId"
    ]


def sensor_dag(dag_id: str, ids: list[str], target: str, deferrable: bool):
    source = textwrap.dedent(
        f"""
        from datetime import datetime, timedelta
        from airflow.sdk import DAG
        from airflow_cloudtrain.sensors import InstanceStatusSensor
        with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            InstanceStatusSensor(task_id="wait", cloud="ec2", instance_ids={ids!r}, target_state={target!r},
                                 poke_interval=0.5, timeout=120, deferrable={deferrable})
        """
    )
    return write_dag(source, dag_id)


@pytest.mark.parametrize("deferrable", [False, True], ids=["poke", "deferrable"])
def test_sensor_succeeds_when_running(emu, airflow_db, deferrable: bool) -> None:
    iid = plain_instance()
    try:
        run = sensor_dag(f"sense_ok_{int(deferrable)}", [iid], "running", deferrable).test()
        assert task_states(run) == {"wait": "success"}
    finally:
        boto3.client("ec2").terminate_instances(InstanceIds=[iid])


@pytest.mark.parametrize("deferrable", [False, True], ids=["poke", "deferrable"])
def test_sensor_fails_fast_on_a_terminated_instance(emu, airflow_db, capfd, deferrable: bool) -> None:
    running, dead = plain_instance(), plain_instance()
    boto3.client("ec2").terminate_instances(InstanceIds=[dead])
    try:
        run = sensor_dag(f"sense_dead_{int(deferrable)}", [running, dead], "running", deferrable).test()
    finally:
        boto3.client("ec2").terminate_instances(InstanceIds=[running])
    assert task_states(run) == {"wait": "failed"}
    assert f"can never reach 'running': {dead} is terminated" in capfd.readouterr().out


@pytest.mark.parametrize("target", ["terminated", "running"])
@pytest.mark.parametrize("deferrable", [False, True], ids=["poke", "deferrable"])
def test_an_instance_that_never_existed_fails_naming_it(
    emu, airflow_db, capfd, deferrable: bool, target: str
) -> None:
    """Not "is terminated" (and never success for target terminated): not found is its own answer."""
    ghost = "i-0123456789abcdef0"
    run = sensor_dag(f"sense_ghost_{int(deferrable)}_{target}", [ghost], target, deferrable).test()
    assert task_states(run) == {"wait": "failed"}
    out = capfd.readouterr().out
    assert f"not found: {ghost}" in out and f"{ghost} is terminated" not in out


def test_bad_sensor_arguments_fail_at_parse_time() -> None:
    from airflow_cloudtrain.sensors import InstanceStatusSensor

    with pytest.raises(ValueError, match="target_state='up' is not valid"):
        InstanceStatusSensor(task_id="s", cloud="ec2", instance_ids=["i-1"], target_state="up")
    with pytest.raises(ValueError, match="instance_ids"):
        InstanceStatusSensor(task_id="s", cloud="ec2")
    with pytest.raises(ValueError, match="cloud='azure'"):
        InstanceStatusSensor(task_id="s", cloud="azure", instance_ids=["i-1"])


def gce_instance(attempt: int) -> str:
    """A GCE VM with no run folder: the emulator starts no agent on it."""
    from airflow_cloudtrain.catalog import choose_offer
    from airflow_cloudtrain.clouds.gcp.gce import gcp_cloud
    from airflow_cloudtrain.core.cloud import LaunchRequest
    from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook
    from airflow_cloudtrain.spec import Hardware

    offer = choose_offer("gcloud", Hardware(2), zone="us-central1-b")
    request = LaunchRequest(
        offer=offer,
        zone="us-central1-b",
        user_data="#!/bin/bash\n",
        tags={"team": "ml"},
        client_token=f"0123456789abcdef0123-1-{attempt}",
        disk_gib=20,
    )
    return gcp_cloud(CloudTrainGcpHook(), "us-central1", "us-central1-b").launch(request).id


@pytest.mark.parametrize("deferrable", [False, True], ids=["poke", "deferrable"])
def test_gce_sensor_running_then_fails_fast_once_deleted(emu, airflow_db, capfd, deferrable: bool) -> None:
    from airflow_cloudtrain.clouds.gcp.gce import gcp_cloud
    from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook

    name = gce_instance(int(deferrable))
    source = textwrap.dedent(
        f"""
        from datetime import datetime
        from airflow.sdk import DAG
        from airflow_cloudtrain.sensors import InstanceStatusSensor
        with DAG("gce_sense_{int(deferrable)}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            InstanceStatusSensor(task_id="wait", cloud="gcloud", instance_ids=[{name!r}], target_state="running",
                                 zone="us-central1-b", poke_interval=0.5, timeout=120, deferrable={deferrable})
        """
    )
    assert task_states(write_dag(source, f"gce_sense_{int(deferrable)}").test()) == {"wait": "success"}
    gcp_cloud(CloudTrainGcpHook(), "us-central1", "us-central1-b").terminate([name])
    run = write_dag(source, f"gce_sense_{int(deferrable)}").test()
    assert task_states(run) == {"wait": "failed"}
    assert f"can never reach 'running': {name} is terminated" in capfd.readouterr().out
