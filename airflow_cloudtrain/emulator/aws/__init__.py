"""The emulated AWS: moto's server on loopback (``server``), what it cannot do itself played on its
in-process backend (``backend``), the wire formats of its requests and errors (``wire``), and the AWS
half of the instances' side (``instances``)."""

from __future__ import annotations

from airflow_cloudtrain.emulator.aws.backend import (
    ACCOUNT_ID,
    GPU_IMAGE_PARAM,
    ec2_backend,
    end_instance,
    seed_public_parameters,
)
from airflow_cloudtrain.emulator.aws.server import FaultsAndCounts, MotoServer
from airflow_cloudtrain.emulator.faults import EMULATOR_USER_AGENT

__all__ = [
    "ACCOUNT_ID",
    "EMULATOR_USER_AGENT",
    "GPU_IMAGE_PARAM",
    "FaultsAndCounts",
    "MotoServer",
    "ec2_backend",
    "end_instance",
    "seed_public_parameters",
]
