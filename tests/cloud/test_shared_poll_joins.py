"""Every user of the shared poll, with triggers joining at random moments while a slow describe of the
group is under way (issue 22): none ever reports a live resource as missing, gone or lost.

A relay in front of the emulated API holds the group's describe calls (DescribeInstances,
GetQueueAttributes, the live index's ListObjectsV2) for a while: the window in which the next
triggers join. Each connection used here is the emulator's own with its endpoint at the relay.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from collections.abc import Iterator
from contextlib import aclosing
from typing import Any

import boto3
import pytest
from relay import Relay, relay
from test_run_trigger_scale import Agent

from airflow_cloudtrain.emulator.aws.images import an_image
from airflow_cloudtrain.triggers.instances import InstanceStateTrigger
from airflow_cloudtrain.triggers.queue_depth import QueueDepthTrigger

JOINS_S = 2.0  # triggers join at random moments over this long


async def first_event(trigger: Any, timeout: float = 180.0) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async with aclosing(trigger.run()) as events:
            async for event in events:
                return event.payload
        raise AssertionError("no event")

    return await asyncio.wait_for(first(), timeout)


async def joining(make: Any, n: int, seed: int) -> list[dict[str, Any]]:
    """``make(k)``'s trigger for k in range(n), each started after a random delay; their events."""
    rng = random.Random(seed)

    async def one(k: int, delay: float) -> dict[str, Any]:
        await asyncio.sleep(delay)
        return await first_event(make(k))

    return await asyncio.gather(*(one(k, rng.uniform(0.0, JOINS_S)) for k in range(n)))


@pytest.fixture
def slow_aws(emu, monkeypatch) -> Iterator[Any]:
    """``slow_aws(pattern)``: connection ``aws_slow`` through a relay holding matching calls 0.4 s."""
    relays: list[Any] = []

    def make(pattern: str) -> Relay:
        cm = relay(emu.aws_endpoint, pattern, 0.4)
        r = cm.__enter__()
        relays.append(cm)
        conn = json.loads(os.environ["AIRFLOW_CONN_AWS_DEFAULT"])
        conn["extra"]["endpoint_url"] = r.url
        monkeypatch.setenv("AIRFLOW_CONN_AWS_SLOW", json.dumps(conn))
        return r

    yield make
    for cm in relays:
        cm.__exit__(None, None, None)


def test_instance_triggers_joining_during_a_slow_describe(emu, slow_aws) -> None:
    ec2 = boto3.client("ec2")
    image = an_image(ec2)
    found = ec2.run_instances(ImageId=image, InstanceType="t3.micro", MinCount=12, MaxCount=12)
    ids = [i["InstanceId"] for i in found["Instances"]]
    r = slow_aws(r"DescribeInstances")
    try:

        def make(k: int) -> InstanceStateTrigger:
            return InstanceStateTrigger(
                cloud="ec2",
                instance_ids=[ids[k]],
                target_state="running",
                conn_id="aws_slow",
                region="us-east-1",
                poll_interval=0.5,
            )

        events = asyncio.run(joining(make, len(ids), seed=1))
        assert [e.get("message") for e in events if e["status"] != "success"] == []
        assert r.count("DescribeInstances") >= 2
    finally:
        ec2.terminate_instances(InstanceIds=ids)


def test_queue_depth_triggers_joining_during_a_slow_read(emu, slow_aws) -> None:
    sqs = boto3.client("sqs")
    urls = [sqs.create_queue(QueueName=f"ct-joins-{uuid.uuid4().hex[:8]}")["QueueUrl"] for _ in range(8)]
    r = slow_aws(r"GetQueueAttributes")
    try:

        def make(k: int) -> QueueDepthTrigger:
            return QueueDepthTrigger(
                queue=urls[k], max_depth=0, conn_id="aws_slow", region="us-east-1", poll_interval=0.5
            )

        events = asyncio.run(joining(make, len(urls), seed=2))
        assert [e.get("message") for e in events if e["status"] != "success"] == []
        assert [e["depth"] for e in events] == [0] * len(urls)
        assert r.count("GetQueueAttributes") >= 2
    finally:
        for url in urls:
            sqs.delete_queue(QueueUrl=url)


def test_run_triggers_recreated_during_a_slow_listing_never_call_a_beating_run_lost(
    emu, slow_aws, capfd
) -> None:
    """Triggers re-created by a triggerer restart, long after their runs started: a snapshot that
    never asked for a run's entry would read as "the agent never reported" (caught only by the
    run-folder check, with a false warning that the instance cannot write to the live index)."""
    ec2 = boto3.client("ec2")
    image = an_image(ec2)
    found = ec2.run_instances(ImageId=image, InstanceType="t3.micro", MinCount=8, MaxCount=8)
    ids = [i["InstanceId"] for i in found["Instances"]]
    agents = [Agent(i) for i in ids]
    for agent in agents:
        agent.say(f"{agent.iid} started")
        agent.flush()
    r = slow_aws(r"list-type=2")
    try:
        made: list[int] = []

        def make(k: int) -> Any:
            made.append(k)
            trigger = agents[k].launch(poll_interval=0.5)
            trigger.conn_id = "aws_slow"
            trigger.launch["launched_at"] = time.time() - 3600  # started an hour ago
            trigger.startup_timeout = 600
            return trigger

        async def main() -> list[dict[str, Any]]:
            waits = asyncio.ensure_future(joining(make, len(agents), seed=3))
            deadline = time.monotonic() + 120
            while len(made) < len(agents):
                assert time.monotonic() < deadline and not waits.done()
                await asyncio.sleep(0.05)
            listed = r.count("list-type=2")
            while r.count("list-type=2") < listed + 3:  # the last one joined has had its answers
                assert time.monotonic() < deadline and not waits.done()
                await asyncio.sleep(0.05)
            for agent in agents:
                await asyncio.to_thread(agent.finish)
            return await waits

        events = asyncio.run(main())
        assert [e["outcome"]["status"] for e in events] == ["success"] * len(agents), events
        out = "".join(capfd.readouterr())
        assert "No heartbeat of" not in out
    finally:
        ec2.terminate_instances(InstanceIds=ids)
