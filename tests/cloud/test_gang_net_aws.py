"""A gang's network on EC2 (``clouds.aws.gang_net``) against the emulated EC2: the run's security group
lets in only its own members (and the user's groups), the cluster placement group is made with it,
both tagged with the run key, re-attached by a retry, deleted at teardown after the run's instances,
and found by the tag sweep when the ledger lost them (a task killed halfway, a create whose answer
was lost). Read back with boto3, as a user would check in the console. The emulator's placement
groups (moto has none) are checked first: what EC2 accepts and refuses."""

from __future__ import annotations

import uuid
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from airflow_cloudtrain.contract.runs import TAG_MANAGED, TAG_RUN_KEY
from airflow_cloudtrain.emulator.aws.images import an_image

REGION = "us-east-1"


def ec2() -> Any:
    return boto3.client("ec2", region_name=REGION)


def backend() -> Any:
    from airflow_cloudtrain.clouds.aws.backend import AwsRunBackend

    return AwsRunBackend("aws_default", REGION)


def groups_of(digest: str) -> list[dict[str, Any]]:
    filters = [{"Name": f"tag:{TAG_RUN_KEY}", "Values": [digest]}]
    return list(ec2().describe_security_groups(Filters=filters)["SecurityGroups"])


def placements_of(digest: str) -> list[dict[str, Any]]:
    filters = [{"Name": f"tag:{TAG_RUN_KEY}", "Values": [digest]}]
    return list(ec2().describe_placement_groups(Filters=filters)["PlacementGroups"])


def code(err: pytest.ExceptionInfo[ClientError]) -> str:
    return str(err.value.response["Error"]["Code"])


# --- the emulator's placement groups ---------------------------------------------------------------


def test_placement_groups_are_created_described_and_deleted_as_ec2_does(emu: Any) -> None:
    client, name = ec2(), f"pg-{uuid.uuid4().hex[:8]}"
    tags = [{"ResourceType": "placement-group", "Tags": [{"Key": "k", "Value": "v"}]}]
    made = client.create_placement_group(GroupName=name, Strategy="cluster", TagSpecifications=tags)
    assert made["PlacementGroup"]["GroupName"] == name and made["PlacementGroup"]["Strategy"] == "cluster"
    (got,) = client.describe_placement_groups(GroupNames=[name])["PlacementGroups"]
    assert (got["State"], got["Tags"]) == ("available", [{"Key": "k", "Value": "v"}])
    assert got["GroupId"].startswith("pg-")
    by_tag = client.describe_placement_groups(Filters=[{"Name": "tag:k", "Values": ["v"]}])["PlacementGroups"]
    assert name in [g["GroupName"] for g in by_tag]
    with pytest.raises(ClientError) as dup:
        client.create_placement_group(GroupName=name, Strategy="cluster")
    assert code(dup) == "InvalidPlacementGroup.Duplicate"
    with pytest.raises(ClientError) as bad:
        client.create_placement_group(GroupName=f"{name}-x", Strategy="tight")
    assert code(bad) == "InvalidParameterValue"
    client.delete_placement_group(GroupName=name)
    for call in (
        lambda: client.describe_placement_groups(GroupNames=[name]),
        lambda: client.delete_placement_group(GroupName=name),
    ):
        with pytest.raises(ClientError) as gone:
            call()
        assert code(gone) == "InvalidPlacementGroup.Unknown"


def test_a_launch_into_an_unknown_placement_group_is_refused(emu: Any) -> None:
    client = ec2()
    image = an_image(client)
    with pytest.raises(ClientError) as err:
        client.run_instances(
            ImageId=image, InstanceType="c5n.large", MinCount=1, MaxCount=1, Placement={"GroupName": "nope"}
        )
    assert code(err) == "InvalidPlacementGroup.Unknown"


def test_a_placement_group_with_a_live_instance_cannot_be_deleted(emu: Any) -> None:
    client, name = ec2(), f"pg-{uuid.uuid4().hex[:8]}"
    client.create_placement_group(GroupName=name, Strategy="cluster")
    image = an_image(client)
    iid = client.run_instances(
        ImageId=image, InstanceType="c5n.large", MinCount=1, MaxCount=1, Placement={"GroupName": name}
    )["Instances"][0]["InstanceId"]
    shown = client.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["Placement"]
    assert shown.get("GroupName") == name
    with pytest.raises(ClientError) as in_use:
        client.delete_placement_group(GroupName=name)
    assert code(in_use) == "InvalidPlacementGroup.InUse"
    client.terminate_instances(InstanceIds=[iid])
    client.delete_placement_group(GroupName=name)


# --- the run's gang network --------------------------------------------------------------------------


def test_the_gang_network_lets_in_only_its_members_and_goes_after_the_instances(emu: Any) -> None:
    from airflow_cloudtrain.clouds.aws.gang_net import ensure_gang_network
    from airflow_cloudtrain.core.ledger import ResourceLedger

    digest = uuid.uuid4().hex[:20]
    client, run = ec2(), backend()
    vpc = client.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    user_group = client.create_security_group(GroupName=f"user-{digest}", Description="mine", VpcId=vpc)[
        "GroupId"
    ]
    emu.reset_counts()
    for _ in range(2):  # a retry re-attaches: nothing made twice
        ledger = ResourceLedger(digest)
        net = ensure_gang_network(run, ledger, digest, placement="cluster", peer_groups=[user_group])
    counts = emu.request_counts()
    assert counts.get("CreateSecurityGroup") == 1 and counts.get("CreatePlacementGroup") == 1, counts

    (group,) = groups_of(digest)
    assert group["GroupId"] == net.security_group_id and group["VpcId"] == vpc
    assert group["GroupName"] == f"ct-{digest}-gang"
    tags = {t["Key"]: t["Value"] for t in group["Tags"]}
    assert tags[TAG_RUN_KEY] == digest and tags[TAG_MANAGED] == "true"
    # ingress: every protocol, from its members and the user's group; from no address range at all
    sources = sorted(p["GroupId"] for rule in group["IpPermissions"] for p in rule["UserIdGroupPairs"])
    assert sources == sorted([net.security_group_id, user_group])
    assert all(rule["IpProtocol"] == "-1" for rule in group["IpPermissions"])
    assert not any(rule["IpRanges"] or rule["Ipv6Ranges"] for rule in group["IpPermissions"])
    (placement,) = placements_of(digest)
    assert placement["GroupName"] == net.placement_group == f"ct-{digest}-gang"
    assert placement["Strategy"] == "cluster"

    # a node of the gang, launched into both (and tagged with the run key, as every instance is)
    image = an_image(client)
    node = client.run_instances(
        ImageId=image,
        InstanceType="c5n.large",
        MinCount=1,
        MaxCount=1,
        SecurityGroupIds=[net.security_group_id],
        Placement={"GroupName": net.placement_group},
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": TAG_RUN_KEY, "Value": digest}]},
        ],
    )["Instances"][0]["InstanceId"]
    ledger.release(run)  # the instance is not in this ledger: the tag sweep finds it
    assert groups_of(digest) == [] and placements_of(digest) == []
    state = client.describe_instances(InstanceIds=[node])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state == "terminated"
    client.delete_security_group(GroupId=user_group)


def test_a_task_killed_between_the_two_creates_leaves_nothing_after_the_sweep(emu: Any) -> None:
    from airflow_cloudtrain.clouds.aws.gang_net import GANG_KINDS, PG_KIND, SG_KIND, ensure_gang_network
    from airflow_cloudtrain.core.ledger import ResourceLedger

    class Killed(Exception):
        pass

    digest = uuid.uuid4().hex[:20]
    run = backend()
    checks: list[int] = []

    def killed_before_the_second_create() -> None:
        checks.append(1)
        if len(checks) == 2:
            raise Killed

    with pytest.raises(Killed):
        ensure_gang_network(
            run, ResourceLedger(digest), digest, placement="cluster", check=killed_before_the_second_create
        )
    assert len(groups_of(digest)) == 1 and placements_of(digest) == []  # made half of it
    lost = ResourceLedger(digest)  # the killed task's store is gone: only the run key is known
    assert sorted(r.kind for r in lost.sweep(run, list(GANG_KINDS))) == [SG_KIND]
    run.sweep_kinds = (*run.sweep_kinds, *run.gang_kinds)  # what the abandon path does for a gang
    released = ResourceLedger(digest).release(run)
    assert [r.kind for r in released] == [SG_KIND]
    assert groups_of(digest) == [] and placements_of(digest) == []
    assert PG_KIND in run.sweep_kinds


def test_a_create_whose_answer_was_lost_is_found_by_its_tag(emu: Any) -> None:
    """The ledger wrote its intent (no id), the create went through, the worker died before the answer:
    the release's sweep finds the group and the placement group by the run key tag."""
    from airflow_cloudtrain.clouds.aws.gang_net import PG_KIND, SG_KIND, _tags, resource_name
    from airflow_cloudtrain.core.ledger import ResourceLedger

    digest = uuid.uuid4().hex[:20]
    run, client = backend(), ec2()
    ledger = ResourceLedger(digest)
    ledger.intend(SG_KIND, REGION, token=resource_name(digest))
    ledger.intend(PG_KIND, REGION, token=resource_name(digest))
    vpc = client.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    client.create_security_group(
        GroupName=resource_name(digest),
        Description="d",
        VpcId=vpc,
        TagSpecifications=_tags(digest, "security-group"),
    )
    client.create_placement_group(
        GroupName=resource_name(digest),
        Strategy="cluster",
        TagSpecifications=_tags(digest, "placement-group"),
    )
    released = ledger.release(run)
    assert sorted(r.kind for r in released) == [PG_KIND, SG_KIND]
    assert groups_of(digest) == [] and placements_of(digest) == []


def test_abandoning_a_gang_s_run_sweeps_its_network_by_tag(emu: Any) -> None:
    """The abandon path (a kill, a triggerer's on_kill) knows only the run key: the spec in the run
    folder says the run is a gang, so the release's sweep looks for its network as well."""
    import logging

    from airflow_cloudtrain.clouds.aws.gang_net import ensure_gang_network
    from airflow_cloudtrain.contract import runs
    from airflow_cloudtrain.core.ledger import ResourceLedger
    from airflow_cloudtrain.emulator import DEFAULT_BUCKET
    from airflow_cloudtrain.lifecycle.run.abandon import abandon_run
    from airflow_cloudtrain.storage import open_run_folder

    log = logging.getLogger("test")
    for num_nodes in (1, 3):
        digest = uuid.uuid4().hex[:20]
        folder = open_run_folder(f"s3://{DEFAULT_BUCKET}/runs/gang-abandon/{digest}")
        spec = runs.RunSpec(
            run_id="ct-g", run_uri=folder.uri, cloud="ec2", command="true", num_nodes=num_nodes
        )
        folder.put_text(runs.SPEC_KEY, spec.to_json())
        ensure_gang_network(backend(), ResourceLedger(digest), digest, placement="cluster")
        abandon_run(backend(), folder, ResourceLedger(digest), log, try_number=1)
        left = (len(groups_of(digest)), len(placements_of(digest)))
        if num_nodes == 1:  # not a gang: the sweep does not look (the test leaves no leak behind)
            assert left == (1, 1)
            cleanup = ResourceLedger(digest)
            cleanup.sweep(backend(), ["security_group", "placement_group"])
            cleanup.release(backend(), sweep=False)
            assert (groups_of(digest), placements_of(digest)) == ([], [])
        else:
            assert left == (0, 0)
