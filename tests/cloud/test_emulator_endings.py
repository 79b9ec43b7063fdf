"""An instance the emulated EC2 ends by its own hand (a spot reclaim, an instance-initiated shutdown)
is never described as terminated without the reason EC2 gives. moto's terminate sets the state first
and its reasons after (first none, then the user's), and ours after that: a describe in between, over
the wire from another thread, showed a terminated instance with no reason code, which EC2 never does
(``emulator.aws.backend.ENDING``)."""

from __future__ import annotations

import sys
import threading
from typing import Any

import boto3
from waiting import wait_for


def test_a_describe_never_sees_a_reclaimed_instance_without_its_reason(emu: Any) -> None:
    ec2 = boto3.client("ec2")
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    launched = ec2.run_instances(ImageId=image, InstanceType="t3.micro", MinCount=30, MaxCount=30)
    ids = [i["InstanceId"] for i in launched["Instances"]]
    codes: list[str] = []
    described = [0]
    done = threading.Event()
    errors: list[BaseException] = []

    def describe() -> None:
        client = boto3.client("ec2")
        try:
            while not done.is_set():
                for reservation in client.describe_instances(InstanceIds=ids)["Reservations"]:
                    codes.extend(
                        i.get("StateReason", {}).get("Code", "")
                        for i in reservation["Instances"]
                        if i["State"]["Name"] == "terminated"
                    )
                described[0] += 1
        except BaseException as err:  # reported below, not lost in the thread
            errors.append(err)

    reader = threading.Thread(target=describe, name="describer", daemon=True)
    reader.start()
    wait_for(lambda: described[0] or errors, message="a first describe")
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads switch as often as they can: a window, if any, is met
    try:
        for iid in ids:  # each ending while describes run over the wire
            before = described[0]
            emu.interrupt(iid, notice_s=0)  # the cloud takes it at once
            wait_for(lambda b=before: described[0] > b + 1 or errors, message="describes after the ending")
    finally:
        sys.setswitchinterval(interval)
        done.set()
        reader.join(timeout=120)
    assert not errors, errors
    final = ec2.describe_instances(InstanceIds=ids)["Reservations"]
    assert {i["StateReason"]["Code"] for r in final for i in r["Instances"]} == {
        "Server.SpotInstanceTermination"
    }
    assert codes and set(codes) == {"Server.SpotInstanceTermination"}, sorted(set(codes))
