"""An instance the emulated EC2 ends by its own hand (a spot reclaim, an instance-initiated shutdown)
is never described as terminated without the reason EC2 gives. moto's terminate sets the state first
and its reasons after (first none, then the user's), and ours came after that: a describe in between,
over the wire from another request thread, showed a terminated instance with no reason code, which EC2
never does. And a describe reads an instance's StateReason before its State (the order of EC2's
shape), so an ending between the two reads paired the old (empty) reason with the new state whatever
the order of the writes. Endings and describes take one lock (``emulator.aws.backend.ENDING``).

Both windows are a few bytecodes wide, so the tests open them on purpose: moto's terminate reads the
clock right after it sets the state (its "User initiated (<time>)" text), where the first test asks
for a describe over the wire; the second ends the instance while moto serializes a describe of it,
right after the reason was read."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from airflow_cloudtrain.emulator.aws.images import an_image


def test_a_describe_made_inside_a_reclaim_never_sees_it_terminated_without_its_reason(
    emu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    import moto.ec2.models.instances as moto_instances

    ec2 = boto3.client("ec2")
    image = an_image(ec2)
    launched = ec2.run_instances(ImageId=image, InstanceType="t3.micro", MinCount=3, MaxCount=3)
    ids = [i["InstanceId"] for i in launched["Instances"]]
    seen: list[tuple[str, str]] = []  # (state, reason code) of each describe asked inside a terminate
    describes: list[threading.Thread] = []
    ending: list[str] = []
    clock = moto_instances.utcnow

    def describe(iid: str) -> None:
        (inst,) = boto3.client("ec2").describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"]
        seen.append((inst["State"]["Name"], inst.get("StateReason", {}).get("Code", "")))

    def clock_read_inside_terminate() -> Any:
        if ending:  # moto's terminate: the state is set, its reasons not yet
            asked = threading.Thread(target=describe, args=(ending[0],), daemon=True)
            describes.append(asked)
            asked.start()
            asked.join(1.0)  # unlocked, it is answered now; locked, once the ending is whole
        return clock()

    monkeypatch.setattr(moto_instances, "utcnow", clock_read_inside_terminate)
    for iid in ids:
        ending[:] = [iid]
        emu.interrupt(iid, notice_s=0)  # the cloud takes it at once
        ending.clear()
    for asked in describes:
        asked.join(60)

    assert len(seen) == len(ids)  # the window was met once per instance, and each describe answered
    assert all(code == "Server.SpotInstanceTermination" for state, code in seen if state == "terminated"), (
        seen
    )
    final = ec2.describe_instances(InstanceIds=ids)["Reservations"]
    assert {(i["State"]["Name"], i["StateReason"]["Code"]) for r in final for i in r["Instances"]} == {
        ("terminated", "Server.SpotInstanceTermination")
    }


def test_an_ending_between_a_describes_reads_of_reason_and_state_waits_for_the_describe(
    emu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from moto.core import serialize

    ec2 = boto3.client("ec2")
    image = an_image(ec2)
    iid = ec2.run_instances(ImageId=image, InstanceType="t3.micro", MinCount=1, MaxCount=1)["Instances"][0][
        "InstanceId"
    ]
    pick = serialize.ResponseSerializer.get_value
    endings: list[threading.Thread] = []

    def reason_read_then_ending(self: Any, value: Any, key: str, shape: Any) -> Any:
        picked = pick(self, value, key, shape)
        if key == "StateReason" and getattr(value, "id", None) == iid and not endings:
            ending = threading.Thread(target=emu.interrupt, args=(iid,), kwargs={"notice_s": 0}, daemon=True)
            endings.append(ending)
            ending.start()
            ending.join(2.0)  # unlocked, it ends the instance at once; locked, it waits for this describe
        return picked

    monkeypatch.setattr(serialize.ResponseSerializer, "get_value", reason_read_then_ending)
    (seen,) = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"]
    assert endings, "the describe never read the instance's StateReason"
    endings[0].join(60)
    assert not endings[0].is_alive()
    state, code = seen["State"]["Name"], seen.get("StateReason", {}).get("Code", "")
    assert (state, code) in {("running", ""), ("terminated", "Server.SpotInstanceTermination")}, (state, code)
    (after,) = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"]
    assert (after["State"]["Name"], after["StateReason"]["Code"]) == (
        "terminated",
        "Server.SpotInstanceTermination",
    )
