"""The AWS cloud module against the emulated EC2: what a launch asks for is what EC2 records."""

from __future__ import annotations

import boto3
import pytest

from airflow_cloudtrain.catalog import choose_offer
from airflow_cloudtrain.clouds.aws.ec2 import aws_cloud
from airflow_cloudtrain.contract.errors import CapacityUnavailable
from airflow_cloudtrain.contract.runs import RunKey
from airflow_cloudtrain.core.cloud import LaunchRequest
from airflow_cloudtrain.hooks.aws import CloudTrainAwsHook
from airflow_cloudtrain.spec import Bid, Hardware

KEY = RunKey("dag", "task", "manual__1", -1)


def request(cloud: str, **kw) -> LaunchRequest:
    offer = choose_offer(cloud, Hardware(2, 0, "4g"), region="us-east-1")
    return LaunchRequest(
        offer=offer,
        zone=None,
        user_data="#!/bin/bash\ntrue\n",
        tags={**KEY.tags(), "team": "ml"},
        client_token="tok-1",
        disk_gib=80,
        **kw,
    )


@pytest.fixture()
def cloud(emu):
    # no cloudtrain-run-uri tag: the emulator starts no agent, the test drives the instance itself
    return aws_cloud(CloudTrainAwsHook(aws_conn_id="aws_default"))


def test_launch_is_secure_by_default_and_tagged(cloud) -> None:
    inst = cloud.launch(request("ec2"))
    try:
        ec2 = boto3.client("ec2")
        raw = ec2.describe_instances(InstanceIds=[inst.id])["Reservations"][0]["Instances"][0]
        assert raw["MetadataOptions"]["HttpTokens"] == "required"  # IMDSv2 only
        assert raw.get("KeyName") is None  # no SSH key unless asked
        assert {t["Key"]: t["Value"] for t in raw["Tags"]}["cloudtrain-run-key"] == KEY.digest
        shutdown = ec2.describe_instance_attribute(
            InstanceId=inst.id, Attribute="instanceInitiatedShutdownBehavior"
        )
        assert shutdown["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
        root = raw["BlockDeviceMappings"][0]["Ebs"]["VolumeId"]
        (volume,) = ec2.describe_volumes(VolumeIds=[root])["Volumes"]
        assert volume["Encrypted"] is True and volume["Size"] == 80
        assert {t["Key"]: t["Value"] for t in volume["Tags"]}["cloudtrain-run-key"] == KEY.digest
        assert [i.id for i in cloud.find(KEY.digest)] == [inst.id]
    finally:
        cloud.terminate([inst.id])
    assert cloud.describe([inst.id])[inst.id].state == "terminated"
    assert cloud.find(KEY.digest) == []


def test_spot_launch_carries_the_bid_in_dollars(cloud) -> None:
    req = request("ec2spot")
    req.max_price = Bid("60%").max_price(req.offer.price)
    sent: list[dict] = []  # what goes over the wire (moto does not keep a one-time spot request's price)
    cloud.launch_client.meta.events.register(
        "provide-client-params.ec2.RunInstances", lambda params, **_: sent.append(params)
    )
    inst = cloud.launch(req)
    try:
        raw = boto3.client("ec2").describe_instances(InstanceIds=[inst.id])["Reservations"][0]["Instances"][0]
        assert raw["InstanceLifecycle"] == "spot" and inst.spot
        spot = sent[0]["InstanceMarketOptions"]
        assert spot["MarketType"] == "spot"
        assert float(spot["SpotOptions"]["MaxPrice"]) == pytest.approx(req.offer.price * 0.6, abs=1e-6)
        assert spot["SpotOptions"]["InstanceInterruptionBehavior"] == "terminate"
    finally:
        cloud.terminate([inst.id])


def test_capacity_error_is_mapped_onto_our_vocabulary(cloud, emu) -> None:
    req = request("ec2")
    emu.fail_capacity(req.offer.instance_type)
    emu.reset_counts()
    with pytest.raises(CapacityUnavailable) as err:
        cloud.launch(req)
    assert err.value.code == "InsufficientInstanceCapacity"
    # EC2 sends it as HTTP 500; the launch client must not retry it (the launcher moves on at once)
    assert emu.request_counts().get("RunInstances") == 1


def test_describe_many_and_unknown_ids(cloud) -> None:
    ids = [cloud.launch(request("ec2")).id for _ in range(3)]
    try:
        states = cloud.describe([*ids, "i-0123456789abcdef0"])
        assert {states[i].state for i in ids} <= {"pending", "running"}
        assert states["i-0123456789abcdef0"].state == "terminated"  # gone from EC2 = ended
    finally:
        cloud.terminate(ids)


def test_hooks_share_parsed_service_models_and_still_reach_ec2(emu) -> None:
    """Each hook makes a session per call and each session a loader: without the shared loader every
    client parsed EC2's 4 MB model again (0.8 s of CPU per ``cloud()`` here instead of 0.1 s)."""
    first, second = (CloudTrainAwsHook(aws_conn_id="aws_default") for _ in range(2))
    loaders = {
        id(first.get_session()._session.get_component("data_loader")),
        id(second.get_session(region_name="eu-west-1")._session.get_component("data_loader")),
        id(first.get_session(deferrable=True).get_component("data_loader")),  # aiobotocore's
    }
    assert len(loaders) == 1
    model = first.get_session()._session.get_component("data_loader").load_service_model("ec2", "service-2")
    assert type(model) is dict and type(model["shapes"]["Instance"]) is dict  # not OrderedDict
    assert "Reservations" in second.client("ec2").describe_instances(MaxResults=5)


def test_a_hook_makes_one_client_per_service_region_and_options(emu) -> None:
    """A client costs a session and tens of ms of CPU: the ledger's find and delete of a fleet's queues,
    templates and groups asked the hook for three each time. The same service, region and options
    (even in a Config made anew) get the same client; any difference gets its own, and each reaches
    its service from any thread."""
    import threading

    from botocore.config import Config

    hook = CloudTrainAwsHook(aws_conn_id="aws_default")
    assert hook.client("ec2") is hook.client("ec2")
    once = Config(retries={"mode": "standard", "total_max_attempts": 1})
    assert hook.client("ec2", config=once) is hook.client("ec2", config=Config(retries=dict(once.retries)))
    distinct = {
        id(hook.client("ec2")),
        id(hook.client("ec2", config=once)),
        id(hook.client("ec2", region="eu-west-1")),
        id(hook.client("sqs")),
    }
    assert len(distinct) == 4
    assert hook.client("ec2", region="eu-west-1").meta.region_name == "eu-west-1"
    seen: list[str] = []
    threads = [
        threading.Thread(
            target=lambda: seen.append(str(len(hook.client("ec2").describe_regions()["Regions"])))
        )
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(seen) == 4 and len(set(seen)) == 1


def test_a_launchs_lookups_ride_out_throttling(cloud, emu) -> None:
    """The default image and its root device are looked up through throttling, as RunInstances is:
    botocore's own retries alone failed a gang's launch under 30% throttling (campaign s016). A client
    without SDK retries shows our own: one refused call each, then the answer."""
    from botocore.config import Config

    from airflow_cloudtrain.clouds.aws.ec2 import AwsCloud

    once = Config(retries={"total_max_attempts": 1})
    bare = AwsCloud(boto3.client("ec2", config=once), "us-east-1", boto3.client("ssm", config=once))
    emu.throttle(0.5, api=["DescribeImages", "GetParameter"], seed=1)  # draws 0.13, then 0.85
    emu.reset_counts()
    try:
        image = bare.default_image(0)
        emu.throttle(0.5, api=["DescribeImages", "GetParameter"], seed=1)
        assert bare.root_device(image) == cloud.root_device(image)
    finally:
        emu.clear_faults()
    counts = emu.request_counts()
    assert counts["throttled:GetParameter"] == 1 and counts["throttled:DescribeImages"] == 1, counts
