"""Every argument of every operator and sensor, against every class of bad value (issue 22).

``tests/unit/test_bad_inputs.py`` holds hand-picked cases; this table is generated: the arguments
come from the constructors' signatures (``inspect.signature``), so an argument added without a row
here fails ``test_every_argument_has_a_row``. Each row lists the bad values of that argument, drawn
from the classes a user actually produces: wrong type (bool for int, float for int, list for str),
empty, whitespace-only and padded strings, negative, zero, huge, NaN/inf, unicode lookalikes and
control characters, and the other cloud's value. ``COMBOS`` holds values that are valid alone but
not with another argument.

Each must be refused at construction (DAG parse time) with a ``ValueError`` whose message names the
field, shows the value and says what is accepted; a warning is not a refusal (warnings are errors
here), and silence is the worst outcome.
"""

from __future__ import annotations

import inspect
import math
import re
import socket
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_cloudtrain.operators import (
    CheckpointResumeOperator,
    CloudTrainGcOperator,
    CloudTrainOperator,
    MLEngineTrainOperator,
    PreemptibleGroupOperator,
    SpotFleetOperator,
)
from airflow_cloudtrain.sensors import InstanceStatusSensor, QueueDepthSensor

EXAMPLES = Path(__file__).resolve().parents[2] / "example_dags"
CODE_DIR = str(EXAMPLES / "train_code")
ML_CODE_DIR = str(EXAMPLES / "mlengine_code")
NAN, INF = math.nan, math.inf
HUGE = 10**18
I1 = "i-0123456789abcdef0"
CYRILLIC_E = "\u0435"  # looks like 'e'
ZWSP = "\u200b"  # zero-width space: invisible in the DAG file
FULLWIDTH_8 = "\uff18"  # '８'

# --- the constructions: one valid base per operator/sensor (and per cloud where args differ) -------

TRAIN_EC2 = {"cloud": "ec2", "command": "python train.py", "bucket": "s3://bkt/p"}
TRAIN_GCE = {"cloud": "gcloud", "command": "python train.py", "bucket": "gs://bkt/p"}
BASES: dict[str, tuple[type, dict[str, Any], str]] = {
    # key: (class, valid arguments, family: which row set applies)
    "ct_ec2": (CloudTrainOperator, TRAIN_EC2, "aws"),
    "ct_gce": (CloudTrainOperator, TRAIN_GCE, "gcp"),
    "resume": (CheckpointResumeOperator, {**TRAIN_EC2, "cloud": "ec2spot"}, "aws"),
    "fleet": (
        SpotFleetOperator,
        {"command": "python item.py", "bucket": "s3://bkt/p", "work_items": ["a"]},
        "aws",
    ),
    "group": (
        PreemptibleGroupOperator,
        {"command": "python item.py", "bucket": "gs://bkt/p", "work_items": ["a"]},
        "gcp",
    ),
    "ml": (
        MLEngineTrainOperator,
        {
            "region": "us-central1",
            "bucket": "gs://bkt/jobs",
            "code": ML_CODE_DIR,
            "python_module": "trainer.task",
        },
        "ml",
    ),
    "iss": (InstanceStatusSensor, {"cloud": "ec2", "instance_ids": [I1]}, "iss"),
    "iss_gce": (
        InstanceStatusSensor,
        {"cloud": "gcloud", "zone": "us-central1-a", "instance_ids": ["vm-1"]},
        "iss_gce",
    ),
    "qds": (QueueDepthSensor, {"queue": "my-queue", "max_depth": 0}, "qds"),
    "gc": (CloudTrainGcOperator, {"cloud": "ec2", "region": "us-east-1", "bucket": "s3://bkt/p"}, "gc"),
}


def own_arguments(cls: type) -> list[str]:
    """The constructor arguments our classes declare (BaseOperator's own are Airflow's to check)."""
    names: list[str] = []
    for klass in cls.__mro__:
        if not klass.__module__.startswith("airflow_cloudtrain") or "__init__" not in vars(klass):
            continue
        for p in inspect.signature(klass.__init__).parameters.values():
            if (
                p.name != "self"
                and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.name not in names
            ):
                names.append(p.name)
    return names


# --- the classes of bad values --------------------------------------------------------------------


def text_bad(sample: str, optional: bool = True) -> list[Any]:
    """Bad values for a name/id/URI argument whose valid form is like ``sample``."""
    values: list[Any] = [
        5,
        True,
        [sample],
        {sample: sample},
        "   ",
        "\t",
        f" {sample}",
        f"{sample} ",
        f"{sample}\n",
        f"{sample}{ZWSP}",
        f"{sample[:-1]}\x00",
        sample.replace("e", CYRILLIC_E, 1) if "e" in sample else f"{CYRILLIC_E}{sample}",
        sample * 200,
    ]
    if not optional:
        values += [None, ""]
    return values


def duration_bad(optional: bool = True) -> list[Any]:
    values: list[Any] = [
        True,
        -1,
        -0.5,
        0,
        NAN,
        INF,
        -INF,
        HUGE,
        "   ",
        "1h1h",
        "30m1h",
        "1x",
        "soon",
        "-5m",
        "1e3",
        "h",
        "1h30",
        f"{FULLWIDTH_8}h",
        "1h\x00",
        "nan",
        "inf",
        [60],
        {"seconds": 60},
        timedelta(0),
        timedelta(seconds=-5),
    ]
    if not optional:
        values += [None, ""]
    return values


def count_bad(low: int, high: int | None = None, optional: bool = False, strings: bool = False) -> list[Any]:
    values: list[Any] = [True, False, 1.5, NAN, INF, -INF, "many", "  ", [low + 1], low - 1, HUGE]
    if high is not None:
        values.append(high + 1)
    if not optional:
        values.append(None)
    if strings:
        values += [FULLWIDTH_8, "1e3", "", f"{low + 1}\x00"]
    else:
        values += [str(low + 1)]
    return values


BOOL_BAD: list[Any] = ["yes", "false", "True", 1, 0, NAN, [True], None]
SIZE_BAD: list[Any] = [True, -5, 0, NAN, INF, "12q", "16 g b", "1e3g", "   ", f"{FULLWIDTH_8}g", [16], "-1g"]
DICT_BAD: list[Any] = [["A=1"], "A=1", 5, True]


def bucket_bad(scheme: str, other: str) -> list[Any]:
    return [
        None,
        "",
        "   ",
        5,
        [f"{scheme}://bkt/p"],
        "bkt",
        f"{scheme}://",
        f"{scheme}:///p",
        f"{scheme}://b/p",  # name too short
        f"{scheme}://{'b' * 64}/p",  # name too long
        f"{scheme}://My-Bucket/p",  # upper case
        f"{scheme}://-bkt/p",
        f"{scheme}://bkt-/p",
        f"{scheme}://bk..t/p",
        f"{scheme}://192.168.1.1/p",
        f"{scheme}://bkt/p ",
        f" {scheme}://bkt/p",
        f"{scheme}://bkt/p\n",
        f"{scheme}://bkt/p\x00",
        f"{scheme}://bkt/p{ZWSP}",
        f"{scheme}://bkt//p",
        f"{scheme}://bkt{CYRILLIC_E}/p",
        f"{other}://bkt/p",
        "https://bkt.s3.amazonaws.com/p",
    ]


def project_bad() -> list[Any]:
    return [
        5,
        True,
        "p",
        "proj",
        "My-Project",
        "1project",
        "project-",
        "a" * 31,
        " my-project",
        "my project",
        "my-pr\u043eject",
        "my-project\x00",
        ["my-project"],
    ]


def conn_bad(optional: bool) -> list[Any]:
    values = [5, True, ["aws_default"], "   ", " aws_default", "aws default", f"aws_default{ZWSP}", "x\x00"]
    return values if optional else [*values, None, ""]


# The other cloud's arguments: valid names, given to a run that would ignore them.
AWS_ONLY_ON_GCE = {
    "key_name": "mykey",
    "subnet_id": "subnet-0123abcd",
    "security_group_ids": ["sg-0123abcd"],
    "iam_instance_profile": "trainer",
    "volume_id": "vol-0123abcd",
    "image_id": "ami-0123456789abcdef0",
}
GCE_ONLY_ON_AWS = {
    "service_account": "t@p.iam.gserviceaccount.com",
    "network": "my-vpc",
    "subnetwork": "my-subnet",
    "external_ip": False,
    "ssh_source_ranges": ["203.0.113.0/24"],
    "project_id": "my-project",
    "provisioning": "spot",
    "image_id": "projects/debian-cloud/global/images/family/debian-12",
}

Family = str
Row = list[Any] | Callable[[Family], list[Any]]


def _by_family(aws: list[Any], gcp: list[Any]) -> Callable[[Family], list[Any]]:
    return lambda family: aws if family == "aws" else gcp


def _other_cloud(name: str, own: list[Any]) -> Callable[[Family], list[Any]]:
    """``own`` on both clouds, plus the value the other cloud would ignore."""

    def values(family: Family) -> list[Any]:
        wrong = AWS_ONLY_ON_GCE if family == "gcp" else GCE_ONLY_ON_AWS
        return [*own, wrong[name]] if name in wrong else own

    return values


# CloudTrainOperator and the operators that take its arguments
TRAIN_ROWS: dict[str, Row] = {
    # gangs (issue 25): CloudTrainOperator and CheckpointResumeOperator
    "num_nodes": [None, 0, -1, True, 2.5, NAN, "x", "   ", "", [2], 65, 10**6, "3\x00"],
    "placement": ["", "   ", "Cluster", "spread", " cluster", 5, True, ["cluster"], "cluster\x00"],
    "log_nodes": ["", "   ", "tail", "ALL", " head", 5, True, ["all"], "all\x00"],
    # budgets (issue 27): a positive amount of USD that buys at least a minute of the cheapest offer
    "max_cost": [0, -1, -0.5, True, NAN, INF, "x", "", "   ", "0", "-3", "$", [5], "5\x00", 1e-9, "0.00001"],
    "command": [None, "", "   ", "\n", 5, True, ["python", "train.py"], "python train.py\x00"],
    "bucket": _by_family(bucket_bad("s3", "gs"), bucket_bad("gs", "s3")),
    "cloud": [
        None,
        "",
        "   ",
        3,
        True,
        ["ec2"],
        "azure",
        "aws",
        "gcp",
        "ec3",
        f"{CYRILLIC_E}c2",
        "ec2\x00",
        f"ec2{ZWSP}",
    ],
    "code": [
        5,
        True,
        ["x"],
        "   ",
        "/does/not/exist",
        __file__,
        "http://example.com/code.tgz",
        "s3://",
        "gs://",
        "code\x00",
    ],
    "image": [
        5,
        True,
        ["img"],
        "   ",
        "not an image!",
        " pytorch/pytorch",
        "pytorch/pytorch ",
        f"pytorch{ZWSP}",
        "py\x00",
    ],
    "setup_cmds": ["pip install x", [1], ["ok", None], [""], ["   "], {"a": "b"}, 5, True, ["echo\x00"]],
    "env": [
        *DICT_BAD,
        {"A": 1},
        {"A": None},
        {"A": True},
        {"": "x"},
        {"1A": "x"},
        {"A B": "x"},
        {f"A{ZWSP}": "x"},
        {"A": "x\x00"},
        {"CLOUDTRAIN_RUN_ID": "x"},
    ],
    "secret_env": [
        *DICT_BAD,
        {"A": 1},
        {"A": "plain-value"},
        {"": "aws-ssm:///a"},
        {"CLOUDTRAIN_X": "aws-ssm:///a"},
    ],
    "cpus": count_bad(1, 4096, optional=True, strings=True),
    "gpus": count_bad(0, 64, optional=True, strings=True),
    "gpu_type": _by_family(
        [7, True, ["A10G"], "   ", "RTX9090", f"A10G{ZWSP}", "A10G\x00", f"A10G{CYRILLIC_E}"],
        [7, True, ["T4"], "   ", "RTX9090", "A10G", f"T4{ZWSP}", "T4\x00"],
    ),
    "ram": [*SIZE_BAD, 1, "100m", HUGE, "1e18g"],
    "hdd": [*SIZE_BAD, 1, "512m", HUGE, "100000g"],
    "instance_type": _by_family(
        [
            42,
            True,
            ["m5.xlarge"],
            "   ",
            "m5.huge",
            "n1-standard-4",
            " m5.xlarge",
            f"m5.xlarge{ZWSP}",
            "m5.xlarge\x00",
        ],
        [
            42,
            True,
            ["n1-standard-4"],
            "   ",
            "m5.xlarge",
            "custom-3-4096",
            " n1-standard-4",
            "n1-standard-4\x00",
        ],
    ),
    "bid": [
        True,
        "abc",
        0,
        -1,
        "-1",
        NAN,
        INF,
        "nan",
        "   ",
        [0.5],
        "0.5.1",
        f"{FULLWIDTH_8}",
        HUGE,
        "1e18%",
    ],
    "region": _by_family(
        [
            5,
            True,
            ["us-east-1"],
            "   ",
            "mars-1",
            "us-central1",
            " us-east-1",
            f"us-{CYRILLIC_E}ast-1",
            "us-east-1\x00",
        ],
        [5, True, ["us-central1"], "   ", "mars-1", "us-east-1", " us-central1", "us-central1\x00"],
    ),
    "zone": _by_family(
        [5, True, ["us-east-1a"], "   ", "us-east-1z", "us-central1-a", " us-east-1a", "us-east-1a\x00"],
        [
            5,
            True,
            ["us-central1-a"],
            "   ",
            "us-central1-z",
            "us-east-1a",
            " us-central1-a",
            "us-central1-a\x00",
        ],
    ),
    "max_runtime": [*duration_bad(), "unlimitd", "forever", -INF],
    "deferrable": BOOL_BAD,
    "poll_interval": duration_bad(optional=False),
    "aws_conn_id": conn_bad(optional=True),
    "gcp_conn_id": conn_bad(optional=False),
    "project_id": _other_cloud("project_id", project_bad()),
    "image_id": _other_cloud("image_id", text_bad("ami-0123456789abcdef0")),
    "key_name": _other_cloud("key_name", [5, True, ["k"], "   ", " mykey", "mykey ", "my\x00key", "k" * 256]),
    "subnet_id": _other_cloud("subnet_id", text_bad("subnet-0123abcd")),
    "security_group_ids": _other_cloud(
        "security_group_ids", ["sg-123", ["default"], [" sg-0123abcd"], [5], "", 5, {"sg-1": 1}, [""]]
    ),
    "iam_instance_profile": _other_cloud(
        "iam_instance_profile", [5, True, ["trainer"], "   ", " trainer", "trainer\x00", "t" * 129]
    ),
    "tags": [
        *DICT_BAD,
        {"aws:team": "x"},
        {"cloudtrain-run": "x"},
        {"team": 1},
        {"team": None},
        {"": "x"},
        {"   ": "x"},
        {"k" * 129: "x"},
        {"team": "v" * 257},
        {"team": "x\x00"},
        {"te\x00am": "x"},
        {f"k{i}": "v" for i in range(31)},
    ],
    "volume_id": _other_cloud("volume_id", text_bad("vol-0123abcd")),
    "service_account": _other_cloud(
        "service_account",
        [5, True, ["default"], "   ", "not-an-email", " t@p.iam.gserviceaccount.com", "t@p\x00.com"],
    ),
    "network": _other_cloud(
        "network", [5, True, ["my-vpc"], "   ", "My VPC", " my-vpc", "my-vpc\x00", "-vpc"]
    ),
    "subnetwork": _other_cloud("subnetwork", [5, True, ["s"], "   ", "My Subnet", " my-subnet", "sub\x00"]),
    "external_ip": _other_cloud("external_ip", ["yes", "false", 1, 0, None, NAN]),
    "ssh_source_ranges": _other_cloud(
        "ssh_source_ranges",
        [5, True, "203.0.113.0/24", ["not-a-cidr"], ["10.0.0.0/33"], [5], ["   "], [None]],
    ),
    "provisioning": _other_cloud("provisioning", [5, True, "cheap", "   ", " spot", "SPOT\x00", ["spot"]]),
    "max_launch_attempts": count_bad(1, 100, optional=False),
    "live_prices": BOOL_BAD,
    "startup_timeout": duration_bad(),
    "heartbeat_timeout": duration_bad(),
    # the work-queue operators
    "work_items": [[], "not json", "{}", 5, None, True, {"a": 1}, [None], [NAN], [{"a": NAN}], [object()]],
    "num_workers": count_bad(1, 10_000, optional=False),
    "max_workers": count_bad(1, 10_000, optional=True),
    "item_timeout": duration_bad(),
    "max_item_attempts": count_bad(1, 1000, optional=False),
    "lease_timeout": [*duration_bad(), 5, 13 * 3600],
    "checkpoint_dir": [5, True, ["/ckpt"], "   ", "\t", "/ckpt\x00", " /ckpt", "/ckpt "],
    "checkpoint_interval": duration_bad(),
    "allow_failed_items": BOOL_BAD,
    "checkpoint_snapshots": BOOL_BAD,
    # CheckpointResumeOperator
    "max_restarts": count_bad(0, optional=False),
    "max_restarts_on_errors": count_bad(0, optional=False),
    "checkpoint_ranks": [None, "", "   ", "every", "HEAD", " head", "all ", 0, True, ["head"], "head\x00"],
    "resume_from": [
        5,
        True,
        ["ct-0123456789ab"],
        "   ",
        "yesterday",
        "gs://bkt/runs/x",
        " ct-0123456789ab",
        "ct-0123456789ab\x00",
        "ct-0123456789AB",
    ],
    "policy": [None, "", "   ", 5, True, ["deadline"], "cheapest", "Deadline", " deadline", "spot_first\x00"],
    "on_demand_after": count_bad(1, optional=True),
    "deadline": duration_bad(),
    "expected_duration": duration_bad(),
    "stop_grace": [*duration_bad(), 300, "5m"],
    "idle_timeout": duration_bad(),
    "probe_interval": [*duration_bad(), 0.5],  # CheckpointResumeOperator, with policy='deadline'
    "orphan_timeout": [*duration_bad(), ""],  # None is valid: no lease
    "zones": [  # CheckpointResumeOperator: the zones of one region a run may move between
        5,
        True,
        "us-east-1a",
        [],
        [None],
        [""],
        [5],
        ["us-east-1a", "us-east-1a"],
        ["us-east-1a", "us-west-2a"],
        ["us-central1-a"],
        ["us-east-1z"],
        [" us-east-1a"],
        ["us-east-1a\x00"],
        [f"us-{CYRILLIC_E}ast-1a"],
    ],
}
# PreemptibleGroupOperator: no max_workers, no bid (refused whatever the value)
GROUP_ONLY: dict[str, list[Any]] = {"max_workers": [1, 3, "3"], "bid": ["0.5", 0.5, "60%"]}
# CheckpointResumeOperator's deadline-policy arguments are checked with policy='deadline'
RESUME_DEADLINE = {"policy": "deadline", "deadline": "6h", "expected_duration": "1h"}

ML_ROWS: dict[str, Row] = {
    "max_cost": [0, -1, True, NAN, INF, "x", "", "   ", "0", [5], "5\x00", 1e-9],
    "region": [
        None,
        "",
        "   ",
        5,
        True,
        ["us-central1"],
        "US",
        "us-east-1",
        " us-central1",
        "us-central1\x00",
    ],
    "bucket": bucket_bad("gs", "s3"),
    "project_id": project_bad(),
    "code": [5, True, [], [5], "   ", "/does/not/exist", "gs://b/trainer.py", "s3://b/t.tar.gz", "code\x00"],
    "python_module": [
        5,
        True,
        ["trainer.task"],
        "   ",
        "trainer-task",
        "1trainer",
        " trainer.task",
        "trainer.task\x00",
        "trainer..task",
    ],
    "training_args": [5, True, {"a": 1}, "--lr 'x", [None], [["a"]], [NAN], ["a\x00"]],
    "image": [5, True, ["img"], "   ", "not an image!", " pytorch/pytorch", "py\x00"],
    "command": [5, True, {"a": 1}, "python 'x", [None], ["a\x00"]],
    "env": [*DICT_BAD, {"A": 1}, {"1A": "x"}, {"A": "x\x00"}],
    "executor_image": [5, True, ["img"], "   ", "not an image!", "py\x00"],
    "scale_tier": ["", "   ", 5, True, ["BASIC"], "GIANT", f"BAS{ZWSP}IC", "BASIC\x00"],
    "master_type": ["n1-standard-8"],  # only with scale_tier='CUSTOM': see COMBOS
    "worker_type": ["n1-standard-8"],
    "worker_count": [True, 1.5, NAN, -1, "many", HUGE, [1], 1],
    "parameter_server_type": ["n1-standard-8"],
    "parameter_server_count": [True, 1.5, NAN, -1, "many", [1], 1],
    "evaluator_type": ["n1-standard-8"],
    "evaluator_count": [True, 1.5, NAN, -1, "many", [1], 1],
    "master_accelerator": ["T4"],
    "worker_accelerator": ["T4"],
    "parameter_server_accelerator": ["T4"],
    "evaluator_accelerator": ["T4"],
    "job_id": [5, True, ["j"], "   ", "1bad", "bad-id", " job", "job\x00", "j" * 129, f"j{CYRILLIC_E}b"],
    "resume_from": [5, True, ["j"], "   ", "1bad", "bad-id", " job", "job\x00"],
    "spot": ["sometimes", 1, 0, NAN, [True], "yes"],
    "restart_job_on_worker_restart": ["sometimes", 1, 0, NAN, [True]],
    "max_runtime": [*duration_bad(), "unlimitd", "forever"],
    "service_account": [5, True, ["a"], "   ", "not-an-email", " t@p.iam.gserviceaccount.com", "t@p\x00.com"],
    "gcp_conn_id": conn_bad(optional=False),
    "deferrable": BOOL_BAD,
    "poll_interval": duration_bad(),
    "log_polling_interval": duration_bad(),
    "orphan_timeout": [*duration_bad(), ""],
}

ISS_ROWS: dict[str, Row] = {
    "cloud": [None, "", "   ", 3, True, ["ec2"], "azure", f"{CYRILLIC_E}c2"],
    "target_state": [None, "", "   ", 5, True, ["running"], "up", "Running", " running", "running\x00"],
    "instance_ids": lambda family: (
        [5, True, "i-1,i-2", [1, 2], {"a": I1}, ["vm-1"], [" " + I1], [I1 + "\x00"], "   ", [I1, 5], [I1, I1]]
        if family == "iss"
        else [5, True, ["VM_1"], [" vm-1"], ["vm-1\x00"], "   ", ["vm" * 40]]
    ),
    "run_id": [5, True, ["ct-0123456789ab"], "   ", "run-1", " ct-0123456789ab", "ct-0123456789ab\x00"],
    "region": lambda family: (
        [5, True, ["us-east-1"], "   ", "mars-1", "us-central1", " us-east-1", "us-east-1\x00"]
        if family == "iss"
        else [5, True, "   ", "mars-1", "us-east-1", "us-east1"]
    ),
    "zone": lambda family: (
        [5, True, "   ", "us-east-1z", "us-central1-a", "us-east-1a\x00"]
        if family == "iss"
        else [None, "", 5, True, "   ", "us-central1-z", "us-east-1a", " us-central1-a", "us-central1-a\x00"]
    ),
    "aws_conn_id": conn_bad(optional=True),
    "gcp_conn_id": conn_bad(optional=False),
    "project_id": lambda family: [*project_bad(), *(["my-project"] if family == "iss" else [])],
    "deferrable": BOOL_BAD,
    "missing_as_terminated": BOOL_BAD,
}

QDS_ROWS: dict[str, Row] = {
    "queue": [
        None,
        "",
        "   ",
        5,
        True,
        ["q"],
        "projects/p/topics/t",
        "has spaces",
        " my-queue",
        "my-queue\x00",
        f"my-queu{CYRILLIC_E}",
        "q" * 81,
        "https://",
        "projects/p/subscriptions/",
    ],
    "max_depth": [True, 1.5, NAN, INF, -1, "5", [0]],
    "min_depth": [True, 1.5, NAN, -1, "5", [0]],  # with max_depth=None
    "count_in_flight": BOOL_BAD,
    "aws_conn_id": conn_bad(optional=True),
    "region": [5, True, ["us-east-1"], "   ", "mars", " us-east-1", "us-east-1\x00", "us-central1"],
    "gcp_conn_id": conn_bad(optional=False),
    "project_id": project_bad(),
    "poll_interval": duration_bad(optional=False),
    "deferrable": BOOL_BAD,
    "executor_queue": [5, True, ["q"], "   ", "q\x00"],
}

GC_ROWS: dict[str, Row] = {  # cloudtrain gc as a task (on cloud="ec2")
    "cloud": ISS_ROWS["cloud"],
    "region": [5, True, ["us-east-1"], "   ", "mars-1", "us-central1", " us-east-1", "us-east-1\x00"],
    "zone": [5, True, "   ", "us-east-1a", "us-central1-a", "us-east-1a\x00"],  # EC2 is swept per region
    "project_id": [*project_bad(), "my-project"],
    "bucket": [v for v in bucket_bad("s3", "gs") if v not in (None, "")],  # optional
    "dry_run": BOOL_BAD,
    "older_than": [  # 0 is every age
        v for v in duration_bad() if v is True or not (v == 0 or v == timedelta(0))
    ],
    "aws_conn_id": conn_bad(optional=True),
    "gcp_conn_id": conn_bad(optional=False),
}

ROWS: dict[str, dict[str, Row]] = {
    "aws": TRAIN_ROWS,
    "gcp": TRAIN_ROWS,
    "ml": ML_ROWS,
    "iss": ISS_ROWS,
    "iss_gce": ISS_ROWS,
    "qds": QDS_ROWS,
    "gc": GC_ROWS,
}
# Arguments with no bad values of their own (none yet): name -> why.
NOT_APPLICABLE: dict[str, str] = {}


def _values(base: str, name: str) -> list[Any]:
    family = BASES[base][2]
    row = ROWS[family][name]
    values = row(family) if callable(row) else list(row)
    if base == "group" and name in GROUP_ONLY:
        return GROUP_ONLY[name]
    if base in ("ct_ec2", "resume", "fleet") and name == "provisioning":
        values = [v for v in values if v != "spot"] + ["spot"]  # refused on EC2 whatever the form
    return values


def _cases() -> list[Any]:
    cases = []
    for base, (cls, _, family) in BASES.items():
        for name in own_arguments(cls):
            if name in NOT_APPLICABLE or name not in ROWS[family]:
                continue
            for index, value in enumerate(_values(base, name)):
                cases.append(pytest.param(base, name, value, id=f"{base}-{name}-{index}"))
    return cases


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parse time must not touch the network: any connection attempt fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("network used at DAG parse time")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def _build(base: str, changes: dict[str, Any]) -> Any:
    cls, args, _ = BASES[base]
    merged = {**args, **changes}
    if base == "qds" and "min_depth" in changes and "max_depth" not in changes:
        merged["max_depth"] = None
    return cls(task_id="t", **merged)


# A message says what is accepted: one of these words, then the forms.
FORMS = re.compile(
    r"\b(use|give|such as|one of|accepted|at least|at most|between|set|leave|pick|drop)\b|e\.g\."
)


def _shown(value: Any) -> str | None:
    """The part of the value's repr the message must show (None: no short, stable repr)."""
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, (str, int, float, bool)) or value is None:
        text = repr(value)
        return text[:20] if len(text) <= 60 else text[:12]
    return None


def assert_refused(
    base: str, changes: dict[str, Any], field: str, value: Any = None, show: bool = True
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # only a warning is not a refusal
        try:
            _build(base, changes)
        except Exception as err:  # noqa: BLE001 - the point: say which
            if type(err) is not ValueError:
                pytest.fail(f"{field}={value!r}: {type(err).__name__} instead of a ValueError: {err}")
            message = str(err)
        else:
            pytest.fail(f"{field}={value!r} on {base} was accepted")
    assert field in message, f"the message does not name {field}: {message}"
    assert FORMS.search(message), f"the message does not say what is accepted: {message}"
    if show and (shown := _shown(value)) is not None and field not in ("secret_env",):
        assert shown in message, f"the message does not show the value {shown}: {message}"


def test_every_argument_has_a_row() -> None:
    missing = sorted(
        {
            f"{cls.__name__}.{name}"
            for cls, _, family in BASES.values()
            for name in own_arguments(cls)
            if name not in ROWS[family] and name not in NOT_APPLICABLE
        }
    )
    assert not missing, f"add rows of bad values (or a NOT_APPLICABLE reason) for {missing}"


@pytest.mark.parametrize(("base", "name", "value"), _cases())
def test_bad_value_is_refused_naming_the_field_and_the_forms(base: str, name: str, value: Any) -> None:
    changes = {name: value}
    if base == "resume" and name in ("deadline", "expected_duration", "probe_interval"):
        changes = {**RESUME_DEADLINE, **changes}  # checked with the policy they belong to
    assert_refused(base, changes, name, value)


# (base, changes, the field the message must name): valid alone, not together
COMBOS: list[tuple[str, dict[str, Any], str]] = [
    ("ct_ec2", {"zone": "us-west-2a", "region": "us-east-1"}, "zone"),
    ("ct_ec2", {"instance_type": "t3.micro", "gpus": 1}, "instance_type"),
    ("ct_ec2", {"instance_type": "t3.micro", "ram": "16g"}, "instance_type"),
    ("ct_ec2", {"instance_type": "g6e.xlarge", "region": "eu-west-1"}, "instance_type"),
    ("ct_ec2", {"gpus": 0, "gpu_type": "A10G", "instance_type": "m5.xlarge"}, "instance_type"),
    ("ct_ec2", {"cpus": 100_000}, "cpus"),
    ("ct_ec2", {"cpus": 500}, "cpus"),  # more than any offer: named, not "no offer has 500 vCPUs"
    ("ct_gce", {"cpus": "300"}, "cpus"),
    ("ct_ec2", {"gpus": 9}, "gpus"),
    ("ct_ec2", {"gpus": 9, "gpu_type": "A10G"}, "gpus"),
    ("ct_ec2", {"ram": "3000g"}, "ram"),
    ("ct_gce", {"ram": "4000g"}, "ram"),
    ("ct_ec2", {"gpus": 10**9}, "gpus"),
    ("ct_ec2", {"ram": "100000g"}, "ram"),
    ("ct_ec2", {"code": "gs://bkt/code.tgz"}, "code"),
    ("ct_gce", {"code": "s3://bkt/code.tgz"}, "code"),
    ("ct_ec2", {"secret_env": {"TOKEN": "gcp-secret://projects/p/secrets/s"}}, "secret_env"),
    ("ct_ec2", {"secret_env": {"A": "aws-ssm:///a"}, "env": {"A": "x"}}, "secret_env"),
    (
        "ct_gce",
        {"subnetwork": "projects/my-proj/regions/us-east1/subnetworks/s", "region": "us-central1"},
        "subnetwork",
    ),
    ("ct_gce", {"tags": {"Team": "ml"}}, "tags"),
    ("resume", {"policy": "deadline"}, "deadline"),
    ("resume", {"deadline": "6h"}, "deadline"),
    ("resume", {"expected_duration": "1h"}, "expected_duration"),
    ("resume", {"probe_interval": "10m"}, "probe_interval"),  # deadline policy only
    ("resume", {**RESUME_DEADLINE, "expected_duration": "7h"}, "expected_duration"),
    ("resume", {**RESUME_DEADLINE, "on_demand_after": 2}, "on_demand_after"),
    ("resume", {"resume_from": "gs://bkt/runs/ct-0123456789ab"}, "resume_from"),
    ("resume", {"zones": ["us-east-1a", "us-east-1b"], "zone": "us-east-1a"}, "zones"),
    ("resume", {"zones": ["us-east-1a", "us-east-1b"], "region": "us-west-2"}, "zones"),
    ("resume", {"zones": ["us-east-1a", "us-east-1b"], "subnet_id": "subnet-0123abcd"}, "zones"),
    ("fleet", {"num_workers": 5, "max_workers": 2}, "max_workers"),
    ("fleet", {"cloud": "ec2", "bid": "0.5"}, "bid"),
    ("fleet", {"cloud": "gcspot"}, "cloud"),
    ("group", {"cloud": "ec2spot", "bucket": "s3://bkt/p"}, "cloud"),
    ("group", {"lease_timeout": 700}, "lease_timeout"),
    ("ml", {"image": "us-docker.pkg.dev/p/r/t:1"}, "image"),
    ("ml", {"command": ["python", "x.py"]}, "command"),
    ("ml", {"scale_tier": "CUSTOM"}, "master_type"),
    ("ml", {"scale_tier": "CUSTOM", "master_type": "n1-standard-8", "worker_count": 2}, "worker_count"),
    (
        "ml",
        {"scale_tier": "CUSTOM", "master_type": "n1-standard-8", "worker_type": "n1-standard-8"},
        "worker_type",
    ),
    (
        "ml",
        {
            "scale_tier": "CUSTOM",
            "master_type": "standard",
            "worker_type": "n1-standard-8",
            "worker_count": 1,
        },
        "worker_type",
    ),
    ("iss", {"run_id": "ct-0123456789ab"}, "run_id"),
    ("iss", {"instance_ids": None}, "instance_ids"),
    ("iss_gce", {"region": "us-east1"}, "zone"),
    ("qds", {"min_depth": 5, "max_depth": 0}, "min_depth"),
    # the lease is renewed from the polls: a timeout of fewer than 3 of them ends healthy runs
    ("ct_ec2", {"orphan_timeout": 20, "poll_interval": 10}, "orphan_timeout"),
    ("fleet", {"orphan_timeout": "1m", "poll_interval": "30s"}, "orphan_timeout"),
    ("ml", {"orphan_timeout": "2m", "poll_interval": "1m"}, "orphan_timeout"),
    ("qds", {"queue": "https://sqs.us-east-1.amazonaws.com/123456789012/q", "region": "eu-west-1"}, "region"),
]


@pytest.mark.parametrize(
    ("base", "changes", "field"), COMBOS, ids=[f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(COMBOS)]
)
def test_values_valid_alone_are_refused_together(base: str, changes: dict[str, Any], field: str) -> None:
    assert_refused(base, changes, field, show=False)


# Legal values at the edges: accepted with no warning (decided in issue 22, documented in the README).
VALID: list[tuple[str, dict[str, Any]]] = [
    ("gc", {"older_than": 0}),
    ("gc", {"cloud": "gcp", "region": None, "zone": "us-central1-a", "bucket": "gs://bkt/p"}),
    ("ct_ec2", {"max_runtime": "1h30m"}),
    ("ct_ec2", {"max_runtime": "2d12h"}),
    ("ct_ec2", {"max_runtime": "1h 30m"}),
    ("ct_ec2", {"max_runtime": "90"}),
    ("ct_ec2", {"max_runtime": "1.5h"}),
    ("ct_ec2", {"max_runtime": " Unlimited "}),
    ("ct_ec2", {"max_runtime": 90}),
    ("ct_ec2", {"startup_timeout": "1h30m", "heartbeat_timeout": "15m"}),
    ("ct_ec2", {"poll_interval": "30s"}),
    ("ct_ec2", {"poll_interval": 0.5}),
    ("ct_ec2", {"cpus": " 8 ", "gpus": "0"}),  # UI params arrive as strings, padded by forms
    ("ct_ec2", {"ram": " 16g ", "hdd": "100 GiB"}),
    ("ct_ec2", {"ram": 512}),
    ("ct_ec2", {"cloud": " EC2 "}),
    ("ct_ec2", {"bucket": "s3://my.bucket-1/a/b/"}),
    ("ct_ec2", {"bucket": "s3://abc"}),
    ("ct_ec2", {"bucket": f"s3://{'b' * 63}/p"}),
    ("ct_ec2", {"bucket": "s3://bkt/données"}),  # object keys are UTF-8
    ("ct_gce", {"bucket": "gs://my_bucket/p"}),  # GCS takes '_'
    ("ct_ec2", {"bucket": "s3://legacy_bucket/p"}),  # and S3 buckets made before 2018
    ("ct_gce", {"bucket": f"gs://{'a' * 60}.{'b' * 60}.example.com/p"}),  # a domain-named bucket
    ("ct_gce", {"project_id": "my-project"}),
    ("ct_gce", {"project_id": "example.com:my-project"}),
    ("ct_gce", {"project_id": "a" * 30}),
    ("ct_ec2", {"env": {"A": ""}, "tags": {"team": ""}}),
    ("ct_ec2", {"region": "", "zone": "", "gpu_type": "", "instance_type": ""}),  # forms send "" for unset
    ("ct_ec2", {"aws_conn_id": None}),
    ("ct_ec2", {"aws_conn_id": "aws-prod.eu_1"}),
    ("ct_ec2", {"orphan_timeout": None}),  # no lease: max_runtime alone
    ("ct_ec2", {"orphan_timeout": timedelta(minutes=10), "max_runtime": "6h"}),
    ("ct_ec2", {"max_runtime": 90}),  # shorter than the default orphan_timeout: no warning
    ("ct_ec2", {"poll_interval": "15m"}),  # the default orphan_timeout fits 3 polls itself
    ("resume", {"orphan_timeout": "1h30m"}),
    ("resume", {"checkpoint_interval": "1h30m", "stop_grace": "1m30s", "idle_timeout": "2h"}),
    ("resume", {"policy": "deadline", "deadline": "2d12h", "expected_duration": "1d"}),
    ("resume", {"policy": "deadline", "deadline": timedelta(hours=6), "expected_duration": "1h"}),
    ("resume", {"zones": ["us-east-1a", "us-east-1b"], "region": "us-east-1"}),
    ("resume", {"zones": ("us-east-1c",)}),
    ("fleet", {"item_timeout": "1h30m", "lease_timeout": "5m", "checkpoint_interval": "10m"}),
    ("group", {"lease_timeout": "10m"}),
    ("ml", {"max_runtime": "1h30m", "poll_interval": "1m", "log_polling_interval": "30s"}),
    ("ml", {"project_id": "my-project"}),
    ("ml", {"max_runtime": "Unlimited"}),
    ("iss_gce", {"project_id": "my-project"}),
    ("qds", {"poll_interval": "1m"}),
    ("qds", {"queue": "projects/p/subscriptions/s", "project_id": "my-project"}),
]


@pytest.mark.parametrize(("base", "changes"), VALID)
def test_legal_edge_value_is_accepted_without_a_warning(base: str, changes: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _build(base, changes)


def test_the_table_covers_every_operator_and_sensor() -> None:
    import airflow_cloudtrain.operators as operators
    import airflow_cloudtrain.sensors as sensors

    public = {getattr(operators, n) for n in operators.__all__} | {
        getattr(sensors, n) for n in sensors.__all__
    }
    assert public == {cls for cls, _, _ in BASES.values()}
    assert len(_cases()) >= 500


# --- the issue's own examples: what the message says ----------------------------------------------


@pytest.mark.parametrize(
    ("base", "bucket", "words"),
    [
        ("ct_ec2", "s3://b/p", ["'b' has 1 character", "an S3 bucket name has 3 to 63 characters"]),
        ("ct_gce", "gs://b/p", ["'b' has 1 character", "a Cloud Storage bucket name has 3 to 63"]),
        (
            "ct_ec2",
            "s3://My_Bucket/p",
            ["'My_Bucket' has characters", "lowercase letters, digits, '.' and '-'"],
        ),
        ("ct_ec2", "gs://bkt/p", ["use a s3:// URI", "gs:// is Google Cloud Storage"]),
        ("ml", "gs://b/jobs", ["3 to 63 characters", "<bucket>/<job_id>/"]),
    ],
)
def test_a_bucket_uri_with_the_right_scheme_is_told_what_is_wrong(
    base: str, bucket: str, words: list[str]
) -> None:
    with pytest.raises(ValueError) as err:
        _build(base, {"bucket": bucket})
    assert all(word in str(err.value) for word in words), str(err.value)


@pytest.mark.parametrize("base", ["ct_gce", "ml", "iss_gce", "qds"])
def test_a_short_project_id_is_told_the_rule(base: str) -> None:
    changes = (
        {"project_id": "p"} if base != "qds" else {"project_id": "p", "queue": "projects/p/subscriptions/s"}
    )
    with pytest.raises(
        ValueError, match=r"project_id='p' is not valid: a Google Cloud project id has 6 to 30 characters"
    ):
        _build(base, changes)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1h30m", 5400),
        ("2d12h", 216_000),
        ("1h 30m", 5400),
        ("90", 90),
        ("90s", 90),
        ("15m", 900),
        ("1.5h", 5400),
    ],
)
def test_compound_durations_are_taken_by_every_duration_argument(text: str, seconds: float) -> None:
    op = _build("resume", {"max_runtime": text, "checkpoint_interval": text, "idle_timeout": text})
    config = op._config()
    assert config.max_runtime_s == op.resume.checkpoint_interval_s == op.resume.idle_timeout_s == seconds
    assert _build("ct_ec2", {"startup_timeout": text, "poll_interval": text}).wait.startup_timeout == seconds
    assert _build("qds", {"poll_interval": text}).poke_interval == seconds
    assert _build("ml", {"poll_interval": text}).poll_interval == seconds


def test_a_bad_duration_names_the_field_and_the_forms() -> None:
    with pytest.raises(ValueError) as err:
        _build("ct_ec2", {"max_runtime": "1h1h"})
    message = str(err.value)
    assert message.startswith("max_runtime='1h1h' is not a valid duration")
    assert all(form in message for form in ("'90s'", "'15m'", "'1h30m'", "'2d12h'", "'unlimited'")), message


def test_the_ram_rule_is_one_function_the_cli_can_call() -> None:
    from airflow_cloudtrain.spec import Hardware, parse_ram_mib

    assert parse_ram_mib("512m") == 512 and parse_ram_mib("1.1g") == 1280
    for value in (1, "100m", "0.25g"):
        with pytest.raises(ValueError, match=r"too small.*at least 512 MiB"):
            parse_ram_mib(value)
        with pytest.raises(ValueError, match=r"at least 512 MiB"):
            Hardware(ram=value)


def _with_template(base: str, name: str) -> dict[str, Any]:
    """The arguments that give ``name`` as a template (and leave out what would conflict with it)."""
    changes: dict[str, Any] = {name: "{{ params.value }}"}
    if base == "ml" and name in ("image", "command"):
        changes.update(python_module=None, code=None)  # the container form
    if base.startswith("iss") and name == "run_id":
        changes["instance_ids"] = None  # one or the other
    return changes


def _templated_cases() -> list[Any]:
    cases = []
    for base, (cls, _, _) in BASES.items():
        for name in own_arguments(cls):
            if name in cls.template_fields and not (base == "group" and name in GROUP_ONLY):  # no bid at all
                cases.append(pytest.param(base, name, id=f"{base}-{name}"))
    return cases


@pytest.mark.parametrize(("base", "name"), _templated_cases())
def test_a_templated_argument_waits_for_rendering(base: str, name: str) -> None:
    """Each templated argument, given as a template, passes parse time and is kept as given."""
    template = "{{ params.value }}"
    changes = _with_template(base, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        op = _build(base, changes)
    attr = "watched_queue" if (base, name) == ("qds", "queue") else name
    assert getattr(op, attr) == template


@pytest.mark.parametrize(("base", "name"), _templated_cases())
def test_a_templated_argument_does_not_hide_a_bad_neighbour(base: str, name: str) -> None:
    """The other arguments are still checked while one is a template."""
    neighbour = {
        "aws": ("env", {"A": 1}),
        "gcp": ("env", {"A": 1}),
        "ml": ("job_id", "1bad"),
        "iss": ("deferrable", "yes"),
        "iss_gce": ("deferrable", "yes"),
        "qds": ("poll_interval", "1h1h"),
        "gc": ("older_than", "1h1h"),
    }[BASES[base][2]]
    if neighbour[0] == name:
        neighbour = ("deferrable", "yes")
    with pytest.raises(ValueError, match=neighbour[0]):
        _build(base, {**_with_template(base, name), neighbour[0]: neighbour[1]})
