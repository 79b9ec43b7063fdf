"""Deferred instance and run waits follow their AWS connection: a poll group's EC2 client and its
live index's S3 client are made anew when the connection was edited, without a triggerer restart
(issue 22)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from contextlib import aclosing
from typing import Any

import boto3
from relay import relay
from test_run_trigger_scale import Agent

from airflow_cloudtrain.emulator.aws.images import an_image
from airflow_cloudtrain.hooks import follow
from airflow_cloudtrain.triggers.instances import InstanceStateTrigger


async def first_event(t: Any) -> dict[str, Any]:
    async with aclosing(t.run()) as events:
        async for event in events:
            return event.payload
    raise AssertionError("the trigger ended without an event")


def test_a_connection_edited_while_an_instance_wait_runs_is_seen(emu, monkeypatch) -> None:
    monkeypatch.setattr(follow, "RECHECK_S", 1.0)
    conn = json.loads(os.environ["AIRFLOW_CONN_AWS_DEFAULT"])
    monkeypatch.setenv("AIRFLOW_CONN_AWS_EDITED", json.dumps(conn))
    ec2 = boto3.client("ec2")
    image = an_image(ec2)
    (iid,) = [i["InstanceId"] for i in ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1)["Instances"]]
    try:
        with relay(emu.aws_endpoint) as r:

            async def main() -> dict[str, Any]:
                trigger = InstanceStateTrigger(
                    cloud="ec2",
                    instance_ids=[iid],
                    target_state="stopped",
                    conn_id="aws_edited",
                    region="us-east-1",
                    poll_interval=0.3,
                )
                waiting = asyncio.ensure_future(first_event(trigger))
                deadline = time.monotonic() + 120
                while emu.request_counts().get("DescribeInstances", 0) < 2:  # the group polls
                    assert time.monotonic() < deadline and not waiting.done()
                    await asyncio.sleep(0.05)
                conn["extra"]["endpoint_url"] = r.url  # the edit, as the triggerer sees it
                os.environ["AIRFLOW_CONN_AWS_EDITED"] = json.dumps(conn)
                while r.count("DescribeInstances") < 1:
                    assert time.monotonic() < deadline, "the edited connection was never used"
                    assert not waiting.done(), waiting.result()
                    await asyncio.sleep(0.05)
                await asyncio.to_thread(ec2.stop_instances, InstanceIds=[iid])
                return await asyncio.wait_for(waiting, 120)

            event = asyncio.run(main())
        assert event["status"] == "success" and event["states"] == {iid: "stopped"}, event
    finally:
        ec2.terminate_instances(InstanceIds=[iid])


def test_a_connection_edited_while_a_run_wait_runs_is_seen_by_its_live_index(emu, monkeypatch) -> None:
    monkeypatch.setattr(follow, "RECHECK_S", 1.0)
    conn = json.loads(os.environ["AIRFLOW_CONN_AWS_DEFAULT"])
    monkeypatch.setenv("AIRFLOW_CONN_AWS_EDITED", json.dumps(conn))
    ec2 = boto3.client("ec2")
    image = an_image(ec2)
    (iid,) = [i["InstanceId"] for i in ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1)["Instances"]]
    agent = Agent(iid)
    agent.say("started")
    agent.flush()
    try:
        with relay(emu.aws_endpoint) as r:

            async def main() -> dict[str, Any]:
                trigger = agent.launch(poll_interval=0.3)
                trigger.conn_id = "aws_edited"
                waiting = asyncio.ensure_future(first_event(trigger))
                deadline = time.monotonic() + 120
                while emu.request_counts().get("ListObjectsV2", 0) < 3:  # the group polls
                    assert time.monotonic() < deadline and not waiting.done()
                    await asyncio.sleep(0.05)
                conn["extra"]["endpoint_url"] = r.url  # the edit, as the triggerer sees it
                os.environ["AIRFLOW_CONN_AWS_EDITED"] = json.dumps(conn)
                while r.count("list-type=2") < 1:
                    assert time.monotonic() < deadline, "the edited connection was never used"
                    assert not waiting.done(), waiting.result()
                    await asyncio.sleep(0.05)
                await asyncio.to_thread(agent.finish)
                return await asyncio.wait_for(waiting, 120)

            event = asyncio.run(main())
        assert event["outcome"]["status"] == "success", event
    finally:
        ec2.terminate_instances(InstanceIds=[iid])
