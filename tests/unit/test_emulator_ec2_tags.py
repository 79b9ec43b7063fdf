"""The emulated EC2 reads a resource's tags by its id (``emulator.aws.server._tags_by_resource_id``):
the same answers moto's scan gives, for every kind of tagged resource and for tag filters."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from airflow_cloudtrain.emulator.aws import ACCOUNT_ID
from airflow_cloudtrain.emulator.aws.images import an_image
from airflow_cloudtrain.emulator.aws.server import MotoServer

REGION = "us-east-1"


@pytest.fixture()
def ec2() -> Iterator[Any]:
    import boto3

    server = MotoServer()
    url = server.start()
    yield boto3.client(
        "ec2", region_name=REGION, endpoint_url=url, aws_access_key_id="a", aws_secret_access_key="b"
    )
    server.stop()


def test_tags_by_id_are_moto_s_own_answers_and_filters_find_the_same_instances(ec2: Any) -> None:
    from moto.ec2.models import core, ec2_backends

    assert getattr(core.TaggedEC2Resource.get_tags, "by_id", False)  # installed for this moto
    image = an_image(ec2)
    runs = {}
    for run in ("a", "b", "c"):
        tags = [
            {"Key": "run", "Value": run},
            {"Key": "Name", "Value": f"node-{run}"},
            {"Key": "z", "Value": ""},
        ]
        launched = ec2.run_instances(
            ImageId=image,
            InstanceType="t3.micro",
            MinCount=2,
            MaxCount=2,
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": tags},
                {"ResourceType": "volume", "Tags": tags},
            ],
        )
        runs[run] = sorted(i["InstanceId"] for i in launched["Instances"])
    ec2.run_instances(ImageId=image, InstanceType="t3.micro", MinCount=1, MaxCount=1)  # no tags at all
    ec2.create_tags(Resources=runs["b"][:1], Tags=[{"Key": "run", "Value": "b2"}])  # a value changed later
    ec2.terminate_instances(InstanceIds=runs["c"])

    backend = ec2_backends[ACCOUNT_ID][REGION]
    resources = [*backend.volumes.values(), *backend.describe_security_groups()]
    instances = [i for r in backend.all_reservations() for i in r.instances]
    for resource in [*instances, *resources]:
        if getattr(resource, "id", None) and hasattr(resource, "get_tags"):
            assert resource.get_tags() == backend.describe_tags(filters={"resource-id": [resource.id]}), (
                resource.id
            )

    def found(name: str, values: list[str]) -> list[str]:
        pages = ec2.describe_instances(Filters=[{"Name": name, "Values": values}])["Reservations"]
        return sorted(i["InstanceId"] for r in pages for i in r["Instances"])

    assert found("tag:run", ["a"]) == runs["a"]
    assert found("tag:run", ["b2"]) == runs["b"][:1] and found("tag:run", ["b"]) == runs["b"][1:]
    assert found("tag:Name", ["node-*"]) == sorted(runs["a"] + runs["b"] + runs["c"])
    assert found("tag-key", ["z"]) == sorted(runs["a"] + runs["b"] + runs["c"])
