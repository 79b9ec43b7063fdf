"""An instance the emulated EC2 ends by its own hand (a spot reclaim, an instance-initiated shutdown)
is never described as terminated without the reason EC2 gives. moto's terminate sets the state first
and its reasons after (first none, then the user's), and ours came after that: a describe in between,
over the wire from another request thread, showed a terminated instance with no reason code, which EC2
never does (``emulator.aws.backend.end_instance`` now puts the reason on first and the state last).

The window is a few bytecodes wide, so the test opens it on purpose: moto's terminate reads the clock
right after it sets the state (its "User initiated (<time>)" text), and the test describes the instance
over the wire at that moment."""

from __future__ import annotations

from typing import Any

import boto3
import pytest


def test_a_describe_inside_a_reclaim_never_sees_it_terminated_without_its_reason(
    emu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import moto.ec2.models.instances as moto_instances

    ec2 = boto3.client("ec2")
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    launched = ec2.run_instances(ImageId=image, InstanceType="t3.micro", MinCount=3, MaxCount=3)
    ids = [i["InstanceId"] for i in launched["Instances"]]
    seen: list[tuple[str, str]] = []  # (state, reason code) of each describe made inside a terminate
    ending: list[str] = []
    clock = moto_instances.utcnow

    def clock_read_inside_terminate() -> Any:
        if ending:  # moto's terminate: the state is set, its reasons not yet
            (inst,) = ec2.describe_instances(InstanceIds=ending)["Reservations"][0]["Instances"]
            seen.append((inst["State"]["Name"], inst.get("StateReason", {}).get("Code", "")))
        return clock()

    monkeypatch.setattr(moto_instances, "utcnow", clock_read_inside_terminate)
    for iid in ids:
        ending[:] = [iid]
        emu.interrupt(iid, notice_s=0)  # the cloud takes it at once
        ending.clear()

    assert len(seen) == len(ids)  # the window was met once per instance
    assert all(code == "Server.SpotInstanceTermination" for state, code in seen if state == "terminated"), (
        seen
    )
    final = ec2.describe_instances(InstanceIds=ids)["Reservations"]
    assert {(i["State"]["Name"], i["StateReason"]["Code"]) for r in final for i in r["Instances"]} == {
        ("terminated", "Server.SpotInstanceTermination")
    }
