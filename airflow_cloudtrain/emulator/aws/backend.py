"""What the emulated AWS does on moto's in-process backends (EC2's, Auto Scaling's): instances ending by
the cloud's hand (spot interruptions, instance-initiated shutdowns) with the state reasons EC2 reports,
and the public SSM parameters real regions have and moto lacks."""

from __future__ import annotations

import threading
from typing import Any

ACCOUNT_ID = "123456789012"
GPU_IMAGE_PARAM = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id"
)
SHUTDOWN = ("Client.InstanceInitiatedShutdown", "Instance initiated shutdown")
SPOT_TERMINATION = ("Server.SpotInstanceTermination", "Spot instance termination")
# Held while an instance ends by the cloud's hand (a few attribute writes) and while moto answers a
# describe of instances (``server.FaultsAndCounts``, moto's dispatch only: no fault's delay inside). A
# describe reads an instance's StateReason before its State (the order of EC2's shape), so no order
# of the two writes keeps it from pairing the old reason with the new state: only this lock does.
ENDING = threading.RLock()


def ec2_backend(region: str) -> Any:
    from moto.ec2.models import ec2_backends

    return ec2_backends[ACCOUNT_ID][region]


def autoscaling_backend(region: str) -> Any:
    from moto.autoscaling.models import autoscaling_backends

    return autoscaling_backends[ACCOUNT_ID][region]


def end_instance(region: str, instance_id: str, code: str, message: str) -> None:
    """Terminate in moto with the state reason EC2 gives: ``StateReason`` ``{"Code": code, "Message":
    "<code>: <message>"}``, e.g. ``end_instance(region, id, *SHUTDOWN)``.

    moto's terminate sets the state first and its own reason after, and ours comes after that; EC2
    never shows a terminated instance without its reason, so the whole ending holds ``ENDING``, which
    describes hold while moto answers them."""
    from moto.ec2.models.instances import StateReason

    backend = ec2_backend(region)
    with ENDING:
        instance = backend.get_instance(instance_id)
        if instance.state == "terminated":
            return
        backend.terminate_instances([instance_id])
        instance.state_reason = StateReason(f"{code}: {message}", code)
        instance._reason = f"{code}: {message}"


def seed_public_parameters(region: str) -> None:
    """Public SSM parameters real regions have and moto lacks (the Deep Learning AMI id)."""
    from moto.ssm.models import ssm_backends

    ssm = ssm_backends[ACCOUNT_ID][region]
    cpu = ssm.get_parameter("/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64")
    if cpu is not None and ssm.get_parameter(GPU_IMAGE_PARAM) is None:
        ssm._parameters[GPU_IMAGE_PARAM].append(cpu)  # same image: no GPU drivers matter here
