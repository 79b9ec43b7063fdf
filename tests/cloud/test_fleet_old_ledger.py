"""A fleet whose ledger the previous release wrote (its stored form, its kind names) is released by
this one: the group first, then its member, template and queues, on the emulated AWS."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import boto3
from dag_helpers import fleet_nothing_left

from airflow_cloudtrain.clouds.registry import backend_for
from airflow_cloudtrain.core.ledger import STORE_KEY, ResourceLedger
from airflow_cloudtrain.core.retry import TransientBudget
from airflow_cloudtrain.lifecycle.fleet.run import release_fleet


class Store:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = json.loads(json.dumps(data))

    def get(self, key: str) -> Any:
        return self.data.get(key)

    def set(self, key: str, value: Any) -> None:
        self.data[key] = json.loads(json.dumps(value))


def test_a_fleet_ledger_written_by_the_previous_release_is_released(emu: Any) -> None:
    digest = uuid.uuid4().hex[:16]
    name, region = f"ct-{digest}", "us-east-1"
    sqs, ec2, autoscaling = boto3.client("sqs"), boto3.client("ec2"), boto3.client("autoscaling")
    dlq = sqs.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
    items = sqs.create_queue(QueueName=f"{name}-items")["QueueUrl"]
    ec2.create_launch_template(  # any image id: nothing boots
        LaunchTemplateName=name,
        LaunchTemplateData={
            "ImageId": "ami-12c6146b",
            "InstanceType": "t3.micro",
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": [{"Key": "cloudtrain-run-key", "Value": digest}]}
            ],
        },
    )
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateName": name},
        MinSize=0,
        MaxSize=2,
        DesiredCapacity=1,
        AvailabilityZones=["us-east-1a"],
    )
    groups = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    assert len(groups[0]["Instances"]) == 1
    # exactly what the previous release's FleetRun stored (the group's create call never returned)
    old = {
        "run_key": digest,
        "entries": [
            {"kind": "sqs_queue", "id": dlq, "location": region, "token": ""},
            {"kind": "sqs_queue", "id": items, "location": region, "token": ""},
            {"kind": "launch_template", "id": name, "location": region, "token": name},
            {"kind": "asg", "id": None, "location": region, "token": name},
        ],
    }
    store = Store({STORE_KEY: old})

    ledger = ResourceLedger.load(digest, store)
    release_fleet(ledger, backend_for("ec2spot", region=region), TransientBudget(budget_s=60.0))

    assert store.data[STORE_KEY]["entries"] == []
    deadline = time.monotonic() + 120  # a busy machine: wait on the condition, never a fixed sleep
    while True:
        try:
            fleet_nothing_left(digest)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)
