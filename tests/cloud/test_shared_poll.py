"""Triggers in one triggerer share their DescribeInstances; killing a deferred run terminates it."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import boto3

from airflow_cloudtrain.core.records import LaunchRecord
from airflow_cloudtrain.emulator.aws.images import an_image
from airflow_cloudtrain.triggers.instances import InstanceStateTrigger
from airflow_cloudtrain.triggers.run import RunTrigger


def plain_instances(n: int) -> list[str]:
    ec2 = boto3.client("ec2")
    image = an_image(ec2)
    return [
        i["InstanceId"]
        for i in ec2.run_instances(ImageId=image, InstanceType="t3.micro", MinCount=n, MaxCount=n)[
            "Instances"
        ]
    ]


async def first_event(trigger):
    async with aclosing(trigger.run()) as events:
        async for event in events:
            return event.payload


def test_fifty_triggers_share_one_describe_per_poll(emu) -> None:
    ids = plain_instances(50)
    try:
        emu.reset_counts()
        triggers = [
            InstanceStateTrigger(
                cloud="ec2",
                instance_ids=[i],
                target_state="running",
                conn_id="aws_default",
                region="us-east-1",
                poll_interval=0.5,
            )
            for i in ids
        ]

        async def main():
            return await asyncio.gather(*(first_event(t) for t in triggers))

        events = asyncio.run(main())
        assert all(e["status"] == "success" for e in events)
        assert emu.request_counts().get("DescribeInstances") == 1
    finally:
        boto3.client("ec2").terminate_instances(InstanceIds=ids)


def test_waiting_triggers_keep_sharing_across_polls(emu) -> None:
    ids = plain_instances(20)
    try:
        emu.reset_counts()
        triggers = [
            InstanceStateTrigger(
                cloud="ec2",
                instance_ids=[i],
                target_state="stopped",
                conn_id="aws_default",
                region="us-east-1",
                poll_interval=1.0,
            )
            for i in ids
        ]

        async def main() -> int:
            tasks = [asyncio.ensure_future(first_event(t)) for t in triggers]
            deadline = asyncio.get_running_loop().time() + 120
            # Wait on the count itself (not a fixed sleep): three polls, nobody reaches "stopped".
            while (calls := await asyncio.to_thread(described)) < 3:
                assert asyncio.get_running_loop().time() < deadline, f"only {calls} polls in 120 s"
                await asyncio.sleep(0.05)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return calls

        def described() -> int:
            return emu.request_counts().get("DescribeInstances", 0)

        seen = asyncio.run(main())
        # Unshared, the first poll alone would be 20 calls and three polls 60; shared, each poll is
        # one call for all 20 (a poll or two more may land before the cancel).
        assert 3 <= seen <= described() < 20
    finally:
        boto3.client("ec2").terminate_instances(InstanceIds=ids)


def test_run_trigger_on_kill_terminates_the_instance_and_says_so(emu, capfd) -> None:
    (iid,) = plain_instances(1)
    launch = LaunchRecord(
        run_id="ct-x", run_uri="s3://cloudtrain-emulated/x", cloud="ec2", region="us-east-1", instance_id=iid
    )
    trigger = RunTrigger(launch=launch.to_dict(), conn_id="aws_default")
    asyncio.run(trigger.on_kill())
    state = boto3.client("ec2").describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0][
        "State"
    ]
    assert state["Name"] == "terminated"
    out = "".join(capfd.readouterr())
    # said before the release starts (the triggerer may stop routing lines to the task log once the
    # trigger is done), and after it
    assert f"terminating instance {iid}" in out and f"Released {iid}" in out
