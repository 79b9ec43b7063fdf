"""EC2 Auto Scaling groups of spot workers in the emulated AWS (``emulator/aws/groups.py``).

moto creates and scales the groups; the emulator adds what AWS does and moto does not: members a
``MixedInstancesPolicy`` puts on the spot market are spot instances, a member reclaimed from outside
is replaced up to ``DesiredCapacity``, and deleting a group ends every member, protected ones too.
The groups here are built with plain boto3, as ``SpotFleetOperator`` builds them; most launch
templates carry plain-text user data (no agent starts: faster), one carries our bootstrap.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from waiting import wait_for

from airflow_cloudtrain.agent.queue_sqs import AutoScalingGroup
from airflow_cloudtrain.agent.worker import Worker
from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.contract.bootstrap import render_user_data
from airflow_cloudtrain.contract.workqueue import WorkerSettings
from airflow_cloudtrain.emulator import DEFAULT_BUCKET
from airflow_cloudtrain.emulator.aws.images import an_image
from airflow_cloudtrain.storage import open_run_folder

ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]
TYPES = ["m5.large", "m5a.large", "m6i.large"]
WAIT_S = 60.0  # generous: CI is 2 busy cores


def members(emu: Any, name: str) -> dict[str, dict[str, Any]]:
    """The group's live members, as ``running_instances()`` lists them."""
    return {i["id"]: i for i in emu.running_instances() if i["group"] == name}


def in_service(name: str) -> set[str]:
    """The members the Auto Scaling API reports InService."""
    groups = boto3.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[name])
    return {
        i["InstanceId"]
        for i in groups["AutoScalingGroups"][0]["Instances"]
        if i["LifecycleState"] == "InService"
    }


def desired(name: str) -> int:
    groups = boto3.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[name])
    return groups["AutoScalingGroups"][0]["DesiredCapacity"]


def settled(emu: Any, name: str, count: int) -> set[str] | None:
    """The members, once exactly ``count`` are live and the group reports exactly those InService."""
    live = set(members(emu, name))
    return live if len(live) == count and in_service(name) == live else None


def ec2_state(instance_id: str) -> dict[str, Any]:
    reservations = boto3.client("ec2").describe_instances(InstanceIds=[instance_id])["Reservations"]
    return reservations[0]["Instances"][0]


@contextlib.contextmanager
def fleet(
    emu: Any,
    user_data: str = "#!/bin/bash\necho not our bootstrap\n",
    size: int = 2,
    base: int = 0,
    on_demand_percent: int = 0,
) -> Iterator[str]:
    """A launch template and a mixed-instances Auto Scaling group over it, as SpotFleetOperator builds
    them; force-deleted (and every member gone) on the way out, whatever the test did."""
    ec2, asg = boto3.client("ec2"), boto3.client("autoscaling")
    name = f"ct-fleet-{uuid.uuid4().hex[:8]}"
    image = an_image(ec2)
    tags = [{"Key": runs.TAG_MANAGED, "Value": "true"}, {"Key": runs.TAG_RUN_KEY, "Value": name}]
    ec2.create_launch_template(
        LaunchTemplateName=name,
        LaunchTemplateData={
            "ImageId": image,
            "InstanceType": TYPES[0],
            "UserData": base64.b64encode(user_data.encode()).decode(),
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
            "BlockDeviceMappings": [
                {"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 20, "Encrypted": True}}
            ],
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
        },
    )
    distribution: dict[str, Any] = {
        "OnDemandBaseCapacity": base,
        "OnDemandPercentageAboveBaseCapacity": on_demand_percent,
    }
    if on_demand_percent < 100:
        distribution["SpotAllocationStrategy"] = "price-capacity-optimized"
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name,
        MinSize=0,
        MaxSize=6,
        DesiredCapacity=size,
        AvailabilityZones=ZONES,
        CapacityRebalance=True,
        MixedInstancesPolicy={
            "LaunchTemplate": {
                "LaunchTemplateSpecification": {"LaunchTemplateName": name, "Version": "$Latest"},
                "Overrides": [{"InstanceType": t} for t in TYPES],
            },
            "InstancesDistribution": distribution,
        },
    )
    try:
        yield name
    finally:
        with contextlib.suppress(ClientError):
            asg.delete_auto_scaling_group(AutoScalingGroupName=name, ForceDelete=True)
        deadline = time.monotonic() + WAIT_S
        while members(emu, name) and time.monotonic() < deadline:  # the emu fixture reports a leak
            time.sleep(0.2)
        ec2.delete_launch_template(LaunchTemplateName=name)


def test_members_of_a_spot_policy_are_spot_and_name_their_group(emu) -> None:
    with fleet(emu, size=2) as spot, fleet(emu, size=3, base=1, on_demand_percent=50) as mixed:
        first = wait_for(lambda: settled(emu, spot, 2), message="the spot group's 2 members")
        # placed on their market before the request that launched them was answered: no wait
        live = members(emu, spot)
        assert set(live) == first
        assert all(i["group"] == spot and i["cloud"] == "aws" and i["zone"] in ZONES for i in live.values())
        assert all(ec2_state(iid)["InstanceLifecycle"] == "spot" for iid in live)

        # a base of 1 on demand, then half of the rest: 2 on demand, 1 spot
        wait_for(lambda: settled(emu, mixed, 3), message="the mixed group's 3 members")
        assert sorted(i["spot"] for i in members(emu, mixed).values()) == [False, False, True]


def test_an_instance_outside_any_group_has_no_group(emu) -> None:
    ec2 = boto3.client("ec2")
    image = an_image(ec2)
    tags = [{"ResourceType": "instance", "Tags": [{"Key": runs.TAG_MANAGED, "Value": "true"}]}]
    raw = ec2.run_instances(
        ImageId=image, InstanceType="t3.micro", MinCount=1, MaxCount=1, TagSpecifications=tags
    )
    iid = raw["Instances"][0]["InstanceId"]
    try:
        (listed,) = [i for i in emu.running_instances() if i["id"] == iid]
        assert listed["group"] is None and listed["spot"] is False
    finally:
        ec2.terminate_instances(InstanceIds=[iid])


def test_a_reclaimed_member_is_replaced_until_desired_capacity(emu) -> None:
    with fleet(emu, size=2) as name:
        first = wait_for(lambda: settled(emu, name, 2), message="2 members")
        assert all(i["spot"] for i in members(emu, name).values())
        victim = sorted(first)[0]
        emu.interrupt(victim, notice_s=0)

        after = wait_for(
            lambda: (m := settled(emu, name, 2)) and victim not in m and m, message="a replacement"
        )
        assert len(after - first) == 1 and first - after == {victim}
        ended = ec2_state(victim)
        assert ended["State"]["Name"] == "terminated"
        assert ended["StateReason"]["Code"] == "Server.SpotInstanceTermination"
        assert desired(name) == 2
        (new,) = after - first
        wait_for(lambda: members(emu, name).get(new, {}).get("spot"), message="the replacement to be spot")


def test_scaling_protection_and_force_delete(emu) -> None:
    asg = boto3.client("autoscaling")
    with fleet(emu, size=1) as name:
        wait_for(lambda: settled(emu, name, 1), message="1 member")
        asg.update_auto_scaling_group(AutoScalingGroupName=name, MaxSize=5)  # keeps the policy, as on AWS
        group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
        assert group["MaxSize"] == 5 and group["MixedInstancesPolicy"]["InstancesDistribution"]
        asg.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=3)
        three = wait_for(lambda: settled(emu, name, 3), message="3 members after scaling out")
        assert all(i["spot"] for i in members(emu, name).values())

        kept = sorted(three)[1]
        asg.set_instance_protection(AutoScalingGroupName=name, InstanceIds=[kept], ProtectedFromScaleIn=True)
        asg.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=0)
        assert wait_for(lambda: settled(emu, name, 1), message="scale-in to the protected member") == {kept}

        asg.delete_auto_scaling_group(AutoScalingGroupName=name, ForceDelete=True)
        wait_for(lambda: not members(emu, name), message="every member, the protected one too, to end")
        assert ec2_state(kept)["State"]["Name"] in ("shutting-down", "terminated")
        assert not asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]


def test_a_member_that_leaves_with_a_decrement_is_not_replaced(emu) -> None:
    asg = boto3.client("autoscaling")
    with fleet(emu, size=2) as name:
        first = wait_for(lambda: settled(emu, name, 2), message="2 members")
        leaving, staying = sorted(first)
        asg.set_instance_protection(
            AutoScalingGroupName=name, InstanceIds=[leaving], ProtectedFromScaleIn=True
        )
        asg.terminate_instance_in_auto_scaling_group(InstanceId=leaving, ShouldDecrementDesiredCapacity=True)
        assert desired(name) == 1
        wait_for(lambda: settled(emu, name, 1) == {staying}, message="the worker to leave")

        # a reclaim of the other one is replaced: once that replacement is there, the group has been
        # reconciled after the worker left, and it launched nothing for the worker
        emu.interrupt(staying, notice_s=0)
        now = wait_for(
            lambda: (m := settled(emu, name, 1)) and staying not in m and m, message="a replacement"
        )
        assert leaving not in now and desired(name) == 1
        assert ec2_state(leaving)["State"]["Name"] in ("shutting-down", "terminated")


def test_a_member_with_our_bootstrap_runs_the_agent(emu) -> None:
    uri = f"s3://{DEFAULT_BUCKET}/groups/{uuid.uuid4().hex[:8]}"
    spec = runs.RunSpec(
        run_id="ct-groups",
        run_uri=uri,
        cloud="ec2spot",
        command="sleep 600",
        log_interval_s=0.2,
        heartbeat_interval_s=0.2,
        metadata_poll_s=0.2,
    )
    _, bucket, prefix = runs.split_uri(uri)
    s3 = boto3.client("s3")
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{runs.SPEC_KEY}", Body=spec.to_json())

    def status(instance_id: str) -> dict[str, Any]:
        try:
            body = s3.get_object(Bucket=bucket, Key=f"{prefix}/{runs.status_key(instance_id)}")["Body"]
        except ClientError:
            return {}
        return json.loads(body.read())

    with fleet(emu, user_data=render_user_data(uri, "ec2spot"), size=1) as name:
        (member,) = wait_for(lambda: settled(emu, name, 1), message="1 member")
        wait_for(
            lambda: status(member).get("state") == runs.RUNNING, message="the member's agent to run the job"
        )
        assert members(emu, name)[member]["spot"]
    assert emu.wait_until_idle(30)


def test_a_call_naming_a_deleted_group_gets_aws_s_validation_error(emu) -> None:
    """moto raised KeyError (HTTP 500, retried, a traceback in the emulator's log) for a worker's
    SetInstanceProtection after its group was deleted; AWS answers ValidationError."""
    client = boto3.client("autoscaling")
    with pytest.raises(ClientError) as err:
        client.set_instance_protection(
            InstanceIds=["i-123"], AutoScalingGroupName="ct-gone", ProtectedFromScaleIn=True
        )
    assert err.value.response["Error"]["Code"] == "ValidationError"
    assert "ct-gone" in err.value.response["Error"]["Message"]


def test_leaving_a_group_one_is_no_longer_in_gets_aws_s_validation_error(emu) -> None:
    """moto raised StopIteration (HTTP 500, a traceback in the emulator's log) for a worker's
    TerminateInstanceInAutoScalingGroup once its fleet's teardown had scaled the group in; AWS answers
    ValidationError."""
    asg = boto3.client("autoscaling", config=Config(retries={"total_max_attempts": 1}))
    with fleet(emu, size=1) as name:
        (member,) = wait_for(lambda: settled(emu, name, 1), message="1 member")
        asg.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=0)  # the teardown's scale-in
        wait_for(lambda: not members(emu, name), message="the member to end")
        with pytest.raises(ClientError) as err:
            asg.terminate_instance_in_auto_scaling_group(
                InstanceId=member, ShouldDecrementDesiredCapacity=True
            )
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert err.value.response["Error"] == {
        "Type": "Sender",
        "Code": "ValidationError",
        "Message": f"Instance Id not found - No managed instance found for instance ID: {member}",
    }


class _EmptyQueue:
    """A work queue with nothing left in it (the worker's receive, nothing else is called)."""

    def receive(self) -> None:
        return None


def test_a_worker_left_behind_by_its_group_powers_off_without_an_error(
    emu, tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The fleet's teardown scaled the group in before the worker, done with the queue, left it: the
    worker's leave (real Auto Scaling client) finds itself out of the group, takes that as done and
    powers off, logging no error."""
    with fleet(emu, size=1) as name:
        (member,) = wait_for(lambda: settled(emu, name, 1), message="1 member")
        boto3.client("autoscaling").set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=0)
        wait_for(lambda: not members(emu, name), message="the member to end")
        settings = WorkerSettings(
            provider="aws",
            queue="unused",
            dead_letter="unused",
            region="us-east-1",
            group=name,
            empty_polls=1,
        )
        uri = f"s3://{DEFAULT_BUCKET}/groups/{uuid.uuid4().hex[:8]}"
        worker_spec = settings.to_dict()
        spec = runs.RunSpec(
            run_id="ct-leave", run_uri=uri, cloud="ec2spot", command="true", worker=worker_spec
        )
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", emu.metadata.endpoint_for(member))
        poweroff = tmp_path / "powered-off"
        worker = Worker(
            open_run_folder(uri),
            spec,
            member,
            str(tmp_path / "work"),
            f"touch '{poweroff}'",
            _EmptyQueue(),
            AutoScalingGroup(settings, member),
        )
        with caplog.at_level(logging.INFO, logger="cloudtrain.agent"):
            assert worker.run() == 0
    assert poweroff.exists()
    assert [
        r.getMessage()
        for r in caplog.records
        if r.name == "cloudtrain.agent" and r.levelno >= logging.WARNING
    ] == []
    assert f"already out of group {name}" in caplog.text
