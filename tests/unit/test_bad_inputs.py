"""The bad-input table: every operator and sensor rejects bad values when the DAG file is parsed
(construction), naming the field and the value; legal edge values pass; templated fields stop only
their own checks, and the combinations are checked once rendered.

Grow ``BAD`` and ``VALID`` with every operator that lands (issue 14 asks for at least 120 and 20).
"""

from __future__ import annotations

import math
import socket
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_cloudtrain.catalog import select as select_mod
from airflow_cloudtrain.operators import (
    CheckpointResumeOperator,
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
I1 = "i-0123456789abcdef0"

BASES: dict[str, tuple[type, dict[str, Any]]] = {
    "ec2": (CloudTrainOperator, {"cloud": "ec2", "command": "python train.py", "bucket": "s3://bkt/p"}),
    "gce": (CloudTrainOperator, {"cloud": "gcloud", "command": "python train.py", "bucket": "gs://bkt/p"}),
    "gcspot": (CloudTrainOperator, {"cloud": "gcspot", "command": "python train.py", "bucket": "gs://bkt/p"}),
    "resume": (
        CheckpointResumeOperator,
        {"cloud": "ec2spot", "command": "python train.py", "bucket": "s3://bkt/p"},
    ),
    "fleet": (
        SpotFleetOperator,
        {"command": "python item.py", "bucket": "s3://bkt/p", "work_items": ["a", "b"]},
    ),
    "group": (
        PreemptibleGroupOperator,
        {"command": "python item.py", "bucket": "gs://bkt/p", "work_items": ["a", "b"]},
    ),
    "ml": (
        MLEngineTrainOperator,
        {
            "region": "us-central1",
            "bucket": "gs://bkt/jobs",
            "code": ML_CODE_DIR,
            "python_module": "trainer.task",
        },
    ),
    "iss": (InstanceStatusSensor, {"cloud": "ec2", "instance_ids": [I1]}),
    "iss_gce": (InstanceStatusSensor, {"cloud": "gcloud", "zone": "us-central1-a", "instance_ids": ["vm-1"]}),
    "qds": (QueueDepthSensor, {"queue": "my-queue", "max_depth": 0}),
}


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parse time must not touch the network: any connection attempt fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("network used at DAG parse time")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def build(base: str, **changes: Any) -> Any:
    return _build(base, changes)


def ABSENT(*names: str) -> dict[str, Any]:  # noqa: N802 - reads as a table marker
    """The base's own arguments left out (e.g. a sensor with neither max_depth nor min_depth)."""
    return {"__absent__": names}


# (base, changes, field the message must name, value text the message must contain or None)
BAD: list[tuple[str, dict[str, Any], str, str | None]] = [
    # --- CloudTrainOperator: the shared vocabulary ---------------------------------------------------
    ("ec2", {"cloud": "azure"}, "cloud", "'azure'"),
    ("ec2", {"cloud": None}, "cloud", "None"),
    ("ec2", {"cloud": 3}, "cloud", "3"),
    ("ec2", {"command": ""}, "command", "''"),
    ("ec2", {"command": None}, "command", "None"),
    ("ec2", {"command": ["python", "x.py"]}, "command", "['python', 'x.py']"),
    ("ec2", {"bucket": "gs://bkt/p"}, "bucket", "'gs://bkt/p'"),
    ("ec2", {"bucket": "bkt"}, "bucket", "'bkt'"),
    ("ec2", {"bucket": "s3://"}, "bucket", "'s3://'"),
    ("ec2", {"bucket": None}, "bucket", "None"),
    ("gce", {"bucket": "s3://bkt/p"}, "bucket", "'s3://bkt/p'"),
    ("ec2", {"cpus": 0}, "cpus", "0"),
    ("ec2", {"cpus": -1}, "cpus", "-1"),
    ("ec2", {"cpus": 1.5}, "cpus", "1.5"),
    ("ec2", {"cpus": "many"}, "cpus", "'many'"),
    ("ec2", {"cpus": True}, "cpus", "True"),
    ("ec2", {"gpus": -1}, "gpus", "-1"),
    ("ec2", {"gpus": "two"}, "gpus", "'two'"),
    ("ec2", {"ram": 1}, "ram", "1"),
    ("ec2", {"ram": "100m"}, "ram", "'100m'"),
    ("ec2", {"ram": 0}, "ram", "0"),
    ("ec2", {"ram": "12q"}, "ram", "'12q'"),
    ("ec2", {"ram": True}, "ram", "True"),
    ("ec2", {"ram": NAN}, "ram", "nan"),
    ("ec2", {"ram": -5}, "ram", "-5"),
    ("ec2", {"hdd": 95 * 1024**2}, "hdd", str(95 * 1024**2)),  # 95 PiB in GiB
    ("ec2", {"hdd": "tiny"}, "hdd", "'tiny'"),
    ("ec2", {"hdd": 0}, "hdd", "0"),
    ("ec2", {"hdd": "100000g"}, "hdd", "'100000g'"),
    ("ec2", {"hdd": INF}, "hdd", "inf"),
    ("ec2", {"hdd": 1}, "hdd", "1"),
    ("ec2", {"hdd": "512m"}, "hdd", "'512m'"),
    ("ec2", {"gpu_type": "RTX9090"}, "gpu_type", "'RTX9090'"),
    ("ec2", {"gpu_type": 7}, "gpu_type", "7"),
    ("gce", {"gpu_type": "A10G"}, "gpu_type", "'A10G'"),
    ("ec2", {"bid": "abc"}, "bid", "'abc'"),
    ("ec2", {"bid": 0}, "bid", "0"),
    ("ec2", {"bid": "-1"}, "bid", "'-1'"),
    ("ec2", {"bid": NAN}, "bid", "nan"),
    ("ec2", {"bid": True}, "bid", "True"),
    ("ec2", {"code": "gs://bkt/code.tgz"}, "code", "'gs://bkt/code.tgz'"),
    ("gce", {"code": "s3://bkt/code.tgz"}, "code", "'s3://bkt/code.tgz'"),
    ("ec2", {"code": "http://example.com/code.tgz"}, "code", "'http://example.com/code.tgz'"),
    ("ec2", {"code": "https://example.com/x"}, "code", "'https://example.com/x'"),
    ("ec2", {"code": "/does/not/exist"}, "code", "'/does/not/exist'"),
    ("ec2", {"code": __file__}, "code", repr(__file__)),
    ("ec2", {"code": 123}, "code", "123"),
    ("ec2", {"code": Path("/does/not/exist")}, "code", "'/does/not/exist'"),
    ("ec2", {"setup_cmds": "pip install x"}, "setup_cmds", "'pip install x'"),
    ("ec2", {"setup_cmds": [1]}, "setup_cmds", "[1]"),
    ("ec2", {"setup_cmds": ["ok", None]}, "setup_cmds", "None"),
    ("ec2", {"env": {"A": 1}}, "env", "1"),
    ("ec2", {"env": {"A": None}}, "env", "None"),
    ("ec2", {"env": {"A": {"b": 1}}}, "env", "{'b': 1}"),
    ("ec2", {"env": {"1BAD": "x"}}, "env", "'1BAD'"),
    ("ec2", {"env": ["A=1"]}, "env", "['A=1']"),
    ("ec2", {"max_runtime": NAN}, "max_runtime", "nan"),
    ("ec2", {"max_runtime": INF}, "max_runtime", "inf"),
    ("ec2", {"max_runtime": "soon"}, "max_runtime", "'soon'"),
    ("ec2", {"max_runtime": 0}, "max_runtime", "0"),
    ("ec2", {"max_runtime": -5}, "max_runtime", "-5"),
    ("ec2", {"poll_interval": NAN}, "poll_interval", "nan"),
    ("ec2", {"poll_interval": INF}, "poll_interval", "inf"),
    ("ec2", {"poll_interval": 0}, "poll_interval", "0"),
    ("ec2", {"poll_interval": "10x"}, "poll_interval", "'10x'"),
    ("ec2", {"startup_timeout": NAN}, "startup_timeout", "nan"),
    ("ec2", {"heartbeat_timeout": "never"}, "heartbeat_timeout", "'never'"),
    ("ec2", {"instance_type": "m5.huge"}, "instance_type", "'m5.huge'"),
    ("ec2", {"instance_type": "m5.64xlarge"}, "instance_type", "'m5.64xlarge'"),
    ("ec2", {"instance_type": "n1-standard-4"}, "instance_type", "'n1-standard-4'"),
    ("gce", {"instance_type": "m5.xlarge"}, "instance_type", "'m5.xlarge'"),
    ("ec2", {"instance_type": "t3.micro", "gpus": 1}, "instance_type", "'t3.micro'"),
    ("ec2", {"instance_type": "p3.2xlarge", "gpu_type": "A100"}, "instance_type", "'p3.2xlarge'"),
    ("ec2", {"instance_type": "t3.micro", "cpus": 8}, "instance_type", "'t3.micro'"),
    ("ec2", {"instance_type": "t3.micro", "ram": "16g"}, "instance_type", "'t3.micro'"),
    ("ec2", {"instance_type": "g6e.xlarge", "region": "eu-west-1"}, "instance_type", "'g6e.xlarge'"),
    ("ec2", {"instance_type": 42}, "instance_type", "42"),
    ("gce", {"instance_type": "custom-3-4096"}, "instance_type", "'custom-3-4096'"),
    ("gce", {"instance_type": "custom-2-1024"}, "instance_type", "'custom-2-1024'"),
    ("gce", {"instance_type": "n2-custom-4-65536"}, "instance_type", "'n2-custom-4-65536'"),
    ("gce", {"instance_type": "custom-4-10000"}, "instance_type", "'custom-4-10000'"),
    ("gce", {"instance_type": "n2-custom-2-4096", "gpus": 1}, "instance_type", "'n2-custom-2-4096'"),
    (
        "gce",
        {"instance_type": "n1-standard-8", "gpus": 1, "gpu_type": "L4"},
        "instance_type",
        "'n1-standard-8'",
    ),
    ("ec2", {"region": "mars-1"}, "region", "'mars-1'"),
    ("ec2", {"region": "us-central1"}, "region", "'us-central1'"),
    ("gce", {"region": "us-east-1"}, "region", "'us-east-1'"),
    ("ec2", {"zone": "us-east-1z"}, "zone", "'us-east-1z'"),
    ("gce", {"zone": "us-central1-z"}, "zone", "'us-central1-z'"),
    ("ec2", {"zone": "us-west-2a", "region": "us-east-1"}, "zone", "'us-west-2a'"),
    ("ec2", {"zone": "us-central1-a"}, "zone", "'us-central1-a'"),
    ("ec2", {"zone": "Bad Zone"}, "zone", "'Bad Zone'"),
    ("gce", {"zone": "us-east1-b", "region": "us-central1"}, "zone", "'us-east1-b'"),
    ("ec2", {"image": "not an image!"}, "image", "'not an image!'"),
    ("ec2", {"provisioning": "spot"}, "provisioning", "'spot'"),
    ("gce", {"provisioning": "preemptible"}, "provisioning", "'preemptible'"),
    ("gcspot", {"provisioning": "cheap"}, "provisioning", "'cheap'"),
    ("ec2", {"max_launch_attempts": 0}, "max_launch_attempts", "0"),
    ("ec2", {"max_launch_attempts": -1}, "max_launch_attempts", "-1"),
    ("ec2", {"max_launch_attempts": 2.5}, "max_launch_attempts", "2.5"),
    ("ec2", {"max_launch_attempts": True}, "max_launch_attempts", "True"),
    ("ec2", {"security_group_ids": "sg-123"}, "security_group_ids", "'sg-123'"),
    ("ec2", {"security_group_ids": ["default"]}, "security_group_ids", "['default']"),
    ("ec2", {"tags": {"aws:team": "x"}}, "tags", "'aws:team'"),
    ("ec2", {"tags": {"team": 1}}, "tags", "1"),
    ("ec2", {"tags": {"cloudtrain-run": "x"}}, "tags", "'cloudtrain-run'"),
    ("ec2", {"tags": ["a"]}, "tags", "['a']"),
    ("ec2", {"volume_id": "disk-1"}, "volume_id", "'disk-1'"),
    ("gce", {"volume_id": "vol-0123abcd"}, "volume_id", "'vol-0123abcd'"),
    ("gce", {"key_name": "mykey"}, "key_name", "'mykey'"),
    ("gce", {"iam_instance_profile": "trainer"}, "iam_instance_profile", "'trainer'"),
    ("gce", {"image_id": "ami-0123456789abcdef0"}, "image_id", "'ami-0123456789abcdef0'"),
    ("ec2", {"image_id": "projects/debian-cloud/global/images/family/debian-12"}, "image_id", "debian-12"),
    ("ec2", {"image_id": "ubuntu"}, "image_id", "'ubuntu'"),
    ("gce", {"subnet_id": "subnet-0123abcd"}, "subnet_id", "'subnet-0123abcd'"),
    ("ec2", {"service_account": "t@p.iam.gserviceaccount.com"}, "service_account", "'t@p.iam"),
    ("gce", {"service_account": "not-an-email"}, "service_account", "'not-an-email'"),
    ("ec2", {"deferrable": "yes"}, "deferrable", "'yes'"),
    ("ec2", {"deferrable": 1}, "deferrable", "1"),
    ("ec2", {"live_prices": "false"}, "live_prices", "'false'"),
    ("gce", {"tags": {"Team Name": "x"}}, "tags", "'Team Name'"),
    ("ec2", {"aws_conn_id": 5}, "aws_conn_id", "5"),
    ("gce", {"gcp_conn_id": None}, "gcp_conn_id", "None"),
    ("gce", {"project_id": "My Project"}, "project_id", "'My Project'"),
    # --- CheckpointResumeOperator ----------------------------------------------------------------
    ("resume", {"max_restarts": -1}, "max_restarts", "-1"),
    ("resume", {"checkpoint_interval": NAN}, "checkpoint_interval", "nan"),
    ("resume", {"policy": "cheapest"}, "policy", "'cheapest'"),
    ("resume", {"stop_grace": 300}, "stop_grace", "300"),
    ("resume", {"resume_from": "yesterday"}, "resume_from", "'yesterday'"),
    ("resume", {"resume_from": "gs://bkt/runs/x"}, "resume_from", "'gs://bkt/runs/x'"),
    ("resume", {"on_demand_after": 0}, "on_demand_after", "0"),
    ("resume", {"ram": 1}, "ram", "1"),
    ("resume", {"zone": "us-east-1z"}, "zone", "'us-east-1z'"),
    ("resume", {"idle_timeout": INF}, "idle_timeout", "inf"),
    # --- SpotFleetOperator -----------------------------------------------------------------------
    ("fleet", {"cloud": "gcspot"}, "cloud", "'gcspot'"),
    ("fleet", {"num_workers": 0}, "num_workers", "0"),
    ("fleet", {"num_workers": 2, "max_workers": 1}, "max_workers", "1"),
    ("fleet", {"work_items": []}, "work_items", "[]"),
    ("fleet", {"work_items": "not json"}, "work_items", "'not json'"),
    ("fleet", {"lease_timeout": 5}, "lease_timeout", "5"),
    ("fleet", {"allow_failed_items": "yes"}, "allow_failed_items", "'yes'"),
    ("fleet", {"max_item_attempts": 0}, "max_item_attempts", "0"),
    ("fleet", {"env": {"A": 1}}, "env", "1"),
    ("fleet", {"security_group_ids": "sg-123"}, "security_group_ids", "'sg-123'"),
    ("fleet", {"checkpoint_interval": NAN}, "checkpoint_interval", "nan"),
    # --- PreemptibleGroupOperator ----------------------------------------------------------------
    ("group", {"cloud": "ec2spot"}, "cloud", "'ec2spot'"),
    ("group", {"bid": "0.5"}, "bid", "'0.5'"),
    ("group", {"max_workers": 3}, "max_workers", "3"),
    ("group", {"lease_timeout": 700}, "lease_timeout", "700"),
    ("group", {"key_name": "k"}, "key_name", "'k'"),
    ("group", {"gpu_type": "A10G"}, "gpu_type", "'A10G'"),
    ("group", {"zone": "us-east-1a"}, "zone", "'us-east-1a'"),
    # --- MLEngineTrainOperator -------------------------------------------------------------------
    ("ml", {"region": "US"}, "region", "'US'"),
    ("ml", {"bucket": "s3://x/y"}, "bucket", "'s3://x/y'"),
    ("ml", {"code": "/does/not/exist"}, "code", "'/does/not/exist'"),
    ("ml", {"code": "gs://b/trainer.py"}, "code", "'gs://b/trainer.py'"),
    ("ml", {"env": {"A": 1}}, "env", "1"),
    ("ml", {"spot": "sometimes"}, "spot", "'sometimes'"),
    ("ml", {"max_runtime": NAN}, "max_runtime", "nan"),
    ("ml", {"job_id": "1bad"}, "job_id", "'1bad'"),
    ("ml", {"service_account": "not-an-email"}, "service_account", "'not-an-email'"),
    ("ml", {"scale_tier": "GIANT"}, "scale_tier", "'GIANT'"),
    ("ml", {"deferrable": "yes"}, "deferrable", "'yes'"),
    ("ml", {"poll_interval": NAN}, "poll_interval", "nan"),
    ("ml", {"python_module": "trainer-task"}, "python_module", "'trainer-task'"),
    ("ml", {"python_module": None, "code": None, "image": "not an image!"}, "image", "'not an image!'"),
    # --- InstanceStatusSensor --------------------------------------------------------------------
    ("iss", {"cloud": "azure"}, "cloud", "'azure'"),
    ("iss", {"instance_ids": "i-1,i-2"}, "instance_ids", "'i-1,i-2'"),
    ("iss", {"instance_ids": [1, 2]}, "instance_ids", "[1, 2]"),
    ("iss", {"instance_ids": {"a": I1}}, "instance_ids", "{'a':"),
    ("iss", {"instance_ids": ["vm-1"]}, "instance_ids", "'vm-1'"),
    ("iss", {"instance_ids": 5}, "instance_ids", "5"),
    ("iss", {"instance_ids": []}, "instance_ids", None),
    ("iss_gce", {"instance_ids": ["VM_1"]}, "instance_ids", "'VM_1'"),
    ("iss", {"instance_ids": None, "run_id": "run-1"}, "run_id", "'run-1'"),
    ("iss", {"run_id": "ct-0123456789ab"}, "run_id", "'ct-0123456789ab'"),
    ("iss", {"target_state": "up"}, "target_state", "'up'"),
    ("iss", {"region": "mars-1"}, "region", "'mars-1'"),
    ("iss", {"region": "us-central1"}, "region", "'us-central1'"),
    ("iss_gce", {"zone": None}, "zone", None),
    ("iss_gce", {"zone": "us-central1-z"}, "zone", "'us-central1-z'"),
    ("iss_gce", {"zone": "us-east1-b", "region": "us-central1"}, "zone", "'us-east1-b'"),
    ("iss", {"deferrable": "no"}, "deferrable", "'no'"),
    ("iss", {"missing_as_terminated": "yes"}, "missing_as_terminated", "'yes'"),
    # --- QueueDepthSensor ------------------------------------------------------------------------
    ("qds", {"queue": ""}, "queue", "''"),
    ("qds", {"queue": "projects/p/topics/t"}, "queue", "'projects/p/topics/t'"),
    ("qds", {"queue": "has spaces"}, "queue", "'has spaces'"),
    ("qds", {"max_depth": -1}, "max_depth", "-1"),
    ("qds", {"max_depth": 1.5}, "max_depth", "1.5"),
    ("qds", {"poll_interval": NAN}, "poll_interval", "nan"),
    ("qds", {"poll_interval": INF}, "poll_interval", "inf"),
    ("qds", {"deferrable": "yes"}, "deferrable", "'yes'"),
    ("qds", {"count_in_flight": "no"}, "count_in_flight", "'no'"),
    ("qds", {"region": "mars"}, "region", "'mars'"),
    ("qds", {**ABSENT("max_depth")}, "max_depth", None),
    ("qds", {"min_depth": 5}, "min_depth", "5"),
    # gangs (issue 25)
    ("ec2", {"num_nodes": 0}, "num_nodes", "0"),
    ("ec2", {"num_nodes": True}, "num_nodes", "True"),
    ("ec2", {"num_nodes": 2.5}, "num_nodes", "2.5"),
    ("ec2", {"num_nodes": 65}, "max_num_nodes", "65"),
    ("gce", {"placement": "spread"}, "placement", "'spread'"),
    ("ec2", {"placement": "cluster", "instance_type": "t3.large"}, "placement", "'t3.large'"),
    ("ec2", {"num_nodes": 2, "log_nodes": "tail"}, "log_nodes", "'tail'"),
    ("resume", {"num_nodes": 0}, "num_nodes", "0"),
    ("resume", {"num_nodes": 3, "checkpoint_ranks": "every"}, "checkpoint_ranks", "'every'"),
    ("resume", {"checkpoint_ranks": "HEAD"}, "checkpoint_ranks", "'HEAD'"),
    ("fleet", {"num_nodes": 3}, "num_workers", "3"),
    ("group", {"num_nodes": 3}, "num_workers", "3"),
]

# (base, changes): legal values at the edges of what is accepted
VALID: list[tuple[str, dict[str, Any]]] = [
    ("resume", {"num_nodes": 3, "checkpoint_ranks": "all"}),
    ("resume", {"checkpoint_ranks": "all"}),  # one node: a no-op
    ("ec2", {"ram": 512}),
    ("ec2", {"ram": "0.5g"}),
    ("ec2", {"hdd": 65536}),
    ("ec2", {"hdd": "10GiB"}),
    ("ec2", {"zone": "us-west-2d"}),
    ("ec2", {"zone": "us-east-1f"}),
    ("ec2", {"region": "us-east-1", "zone": "us-east-1a"}),
    ("ec2", {"instance_type": "t3.nano"}),
    ("ec2", {"instance_type": "g5.xlarge", "gpu_type": "a10g", "gpus": 1}),
    ("ec2", {"env": {}, "setup_cmds": []}),
    ("ec2", {"max_runtime": "unlimited"}),
    ("ec2", {"max_runtime": timedelta(hours=2), "poll_interval": 0.5}),
    ("ec2", {"image_id": "resolve:ssm:/aws/service/ecs/optimized-ami/amazon-linux-2/recommended/image_id"}),
    (
        "ec2",
        {"tags": {"team": "ml"}, "security_group_ids": ["sg-0123456789abcdef0"], "subnet_id": "subnet-0a1b"},
    ),
    ("ec2", {"code": CODE_DIR, "deferrable": True, "live_prices": False}),
    ("ec2", {"code": Path(CODE_DIR)}),
    ("ec2", {"code": "s3://bkt/code.tgz", "max_launch_attempts": 1}),
    ("ec2", {"cloud": "ec2spot", "bid": "100%"}),
    ("ec2", {"cloud": "EC2Spot", "bid": "$0.45"}),
    ("gce", {"instance_type": "custom-1-1024"}),
    ("gce", {"instance_type": "n2-custom-36-36864"}),
    ("gce", {"instance_type": "n1-standard-8", "gpus": 1, "gpu_type": "T4"}),
    ("gce", {"zone": "us-central1-a", "region": "us-central1"}),
    (
        "gce",
        {"image_id": "projects/debian-cloud/global/images/family/debian-12", "service_account": "default"},
    ),
    ("gcspot", {"provisioning": "preemptible"}),
    (
        "resume",
        {"policy": "deadline", "deadline": "6h", "expected_duration": "1h", "resume_from": "ct-0123456789ab"},
    ),
    ("fleet", {"work_items": '{{ ti.xcom_pull("list") }}', "num_workers": 1, "max_workers": 10_000}),
    ("group", {"cloud": "gcloud", "num_workers": 3}),
    ("ml", {"code": "gs://bkt/pkg/trainer-0.1.tar.gz", "spot": True, "max_runtime": "unlimited"}),
    ("iss", {"instance_ids": I1}),
    ("iss", {"instance_ids": "{{ ti.xcom_pull('train')['instance_id'] }}"}),
    ("iss", {"instance_ids": None, "run_id": "ct-0123456789ab", "target_state": "terminated"}),
    ("iss_gce", {"region": "us-central1", "missing_as_terminated": True}),
    (
        "qds",
        {
            "poll_interval": 0.5,
            "queue": "https://sqs.us-east-1.amazonaws.com/123456789012/q",
            "region": "us-east-1",
        },
    ),
    ("qds", {"max_depth": None, "min_depth": 0, "queue": "projects/p/subscriptions/s"}),
]


def _changes(changes: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    absent = changes.get("__absent__", ())
    return absent, {k: v for k, v in changes.items() if k != "__absent__"}


def _build(base: str, changes: dict[str, Any]) -> Any:
    absent, rest = _changes(changes)
    cls, args = BASES[base]
    merged = {k: v for k, v in {**args, **rest}.items() if k not in absent}
    return cls(task_id="t", **merged)


def test_the_table_is_as_large_as_the_issue_asks() -> None:
    assert len(BAD) >= 120 and len(VALID) >= 20
    covered = {BASES[b][0] for b, *_ in BAD}
    assert covered == {cls for cls, _ in BASES.values()}  # every operator and sensor


@pytest.mark.parametrize(("base", "changes", "field", "value"), BAD, ids=lambda x: None)
def test_bad_input_fails_at_parse_time_naming_field_and_value(
    base: str, changes: dict[str, Any], field: str, value: str | None
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # some also warn first (a bid on ec2)
        with pytest.raises(ValueError) as err:
            _build(base, changes)
    message = str(err.value)
    assert type(err.value) is ValueError, message  # not a TypeError/KeyError from deep inside
    assert field in message, message
    if value is not None:
        assert value in message, message
    assert len(message) > len(field) + 20, message  # says what is accepted, not just the name


@pytest.mark.parametrize(("base", "changes"), VALID)
def test_legal_edge_input_is_accepted(base: str, changes: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # legal and meaningful: no warning either
        _build(base, changes)


# --- warnings: legal but pointless --------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "changes", "words"),
    [
        ("ec2", {"bid": "0.5"}, ["bid='0.5'", "no effect on cloud='ec2'"]),
        ("ec2", {"instance_type": "x9.large"}, ["instance_type='x9.large'", "not in the catalog"]),
        ("ec2", {"cloud": "ec2spot", "bid": "150%"}, ["bid='150%'", "above 100%"]),
        ("iss", {"zone": "us-east-1a"}, ["zone='us-east-1a'", "no effect on cloud='ec2'"]),
        (
            "qds",
            {"queue": "projects/p/subscriptions/s", "region": "us-east-1"},
            ["region='us-east-1'", "Pub/Sub"],
        ),
    ],
)
def test_legal_but_pointless_input_warns(base: str, changes: dict[str, Any], words: list[str]) -> None:
    with pytest.warns(UserWarning) as record:
        _build(base, changes)
    text = " ".join(str(w.message) for w in record)
    assert all(word in text for word in words), text
    assert record[0].filename == __file__  # shown at the DAG file's line, not inside the package


def test_bid_on_gcspot_says_why_in_the_users_terms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(select_mod, "_warned_gcspot_bid", False)
    with pytest.warns(UserWarning) as record:
        build("gcspot", bid="0.5")
    text = str(record[0].message)
    assert "bid='0.5' has no effect on cloud='gcspot'" in text
    assert "no bid" in text and "Google sets the Spot price" in text
    assert "capacity back" in text and "ec2spot" in text and "studio tool" not in text


# --- templated fields: each known field is still checked ---------------------------------------


@pytest.mark.parametrize(
    ("base", "changes", "field"),
    [
        ("ec2", {"cpus": "{{ params.cpus }}", "ram": 1}, "ram"),
        ("ec2", {"ram": "{{ params.ram }}", "cpus": 0}, "cpus"),
        ("ec2", {"command": "{{ params.command }}", "env": {"A": 1}}, "env"),
        ("ec2", {"bucket": "{{ params.bucket }}", "max_runtime": NAN}, "max_runtime"),
        ("ec2", {"cloud": "{{ params.cloud }}", "zone": "us-east-1z"}, "zone"),
        ("ec2", {"cloud": "{{ params.cloud }}", "bucket": "ftp://x"}, "bucket"),
        ("ec2", {"cloud": "{{ params.cloud }}", "gpu_type": "RTX9090"}, "gpu_type"),
        ("ec2", {"cloud": "{{ params.cloud }}", "instance_type": "m5.huge"}, "instance_type"),
        ("ec2", {"cloud": "{{ params.cloud }}", "security_group_ids": "sg-1"}, "security_group_ids"),
        ("ec2", {"region": "{{ params.region }}", "setup_cmds": "pip install x"}, "setup_cmds"),
        ("ec2", {"zone": "{{ params.zone }}", "region": "mars-1"}, "region"),
        ("ec2", {"instance_type": "{{ params.type }}", "hdd": 95 * 1024**2}, "hdd"),
        ("ec2", {"env": "{{ params.env }}", "bid": "x"}, "bid"),
        ("ec2", {"env": {"A": "{{ params.a }}", "B": 2}}, "env"),
        ("resume", {"cloud": "{{ params.cloud }}", "max_restarts": -1}, "max_restarts"),
        ("fleet", {"work_items": "{{ params.items }}", "num_workers": 0}, "num_workers"),
        ("ml", {"region": "{{ params.region }}", "env": {"A": 1}}, "env"),
        ("ml", {"scale_tier": "{{ params.tier }}", "job_id": "1bad"}, "job_id"),
        ("iss", {"instance_ids": "{{ params.ids }}", "target_state": "up"}, "target_state"),
        ("iss", {"target_state": "{{ params.state }}", "instance_ids": [5]}, "instance_ids"),
    ],
)
def test_a_templated_field_does_not_stop_the_others_being_checked(
    base: str, changes: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        _build(base, changes)


def test_templated_values_wait_for_rendering() -> None:
    op = build("ec2", cloud="{{ params.cloud }}", cpus="{{ params.cpus }}", ram="{{ params.ram }}")
    assert (op.cloud, op.cpus, op.ram) == ("{{ params.cloud }}", "{{ params.cpus }}", "{{ params.ram }}")


def test_combinations_are_checked_once_rendered() -> None:
    # a known key_name with a templated cloud: legal for ec2, so it waits; rendered to gcloud it fails
    op = build("ec2", cloud="{{ params.cloud }}", bucket="{{ params.bucket }}", key_name="trainer-key")
    op.render_template_fields({"params": {"cloud": "gcloud", "bucket": "gs://bkt/p"}})
    with pytest.raises(ValueError, match="key_name='trainer-key' is not valid with cloud='gcloud'"):
        op._config()
    # a templated zone in the wrong region of a known region
    op = build("ec2", region="us-east-1", zone="{{ params.zone }}")
    op.render_template_fields({"params": {"zone": "us-west-2a"}})
    with pytest.raises(ValueError, match="zone='us-west-2a' is not in region='us-east-1'"):
        op._config()
    # the instance type chosen in the form lacks the GPUs asked for
    op = build("ec2", instance_type="{{ params.type }}", gpus=1)
    op.render_template_fields({"params": {"type": "t3.micro"}})
    with pytest.raises(ValueError, match="instance_type='t3.micro' has 0 GPUs"):
        op._config()
    # rendered values that are fine give the config
    op = build("ec2", cpus="{{ params.cpus }}", ram="{{ params.ram }}")
    op.render_template_fields({"params": {"cpus": "4", "ram": "8g"}})
    config = op._config()
    assert (config.hardware.cpus, config.hardware.ram_mib) == (4, 8192)


def test_a_rendered_bad_value_fails_naming_it() -> None:
    op = build("ec2", ram="{{ params.ram }}")
    op.render_template_fields({"params": {"ram": "1"}})
    with pytest.raises(ValueError, match="ram='1' is 1 MiB, too small"):
        op._config()


def test_sensor_instance_ids_template_stays_a_template_until_rendered() -> None:
    sensor = build("iss", instance_ids="{{ params.ids }}")
    assert sensor.instance_ids == "{{ params.ids }}"  # not ['{{ params.ids }}']
    sensor.render_template_fields({"params": {"ids": [I1, "i-0fedcba9876543210"]}})
    assert sensor._ids() == [I1, "i-0fedcba9876543210"]
    sensor = build("iss", instance_ids="{{ params.ids }}")
    sensor.render_template_fields({"params": {"ids": "not-an-id"}})
    with pytest.raises(ValueError, match="instance_ids='not-an-id'"):
        sensor._ids()


def test_sensor_target_state_and_region_are_checked_once_rendered() -> None:
    sensor = build("iss", target_state="{{ params.state }}", region="{{ params.region }}")
    sensor.render_template_fields({"params": {"state": "up", "region": "us-east-1"}})
    with pytest.raises(ValueError, match="target_state='up'"):
        sensor._ids()
    sensor = build("iss", target_state="{{ params.state }}", region="{{ params.region }}")
    sensor.render_template_fields({"params": {"state": "running", "region": "mars-1"}})
    with pytest.raises(ValueError, match="region='mars-1'"):
        sensor._ids()


def test_mlengine_combinations_wait_for_their_fields() -> None:
    # image and python_module exclusive: checked when both are known, at render otherwise
    with pytest.raises(ValueError, match="exclusive"):
        build("ml", image="us-docker.pkg.dev/p/r/t:1")
    op = build("ml", python_module="{{ params.module }}", image="us-docker.pkg.dev/p/r/t:1")
    op.render_template_fields({"params": {"module": "trainer.task"}})
    from airflow_cloudtrain.operators.mlengine_config import parse_job_config

    with pytest.raises(ValueError, match="exclusive"):
        parse_job_config(op._args())


def test_a_templated_list_renders_to_its_text_and_is_read_back() -> None:
    op = build("ec2", setup_cmds="{{ params.cmds }}")
    op.render_template_fields({"params": {"cmds": ["pip install -r requirements.txt", "echo ready"]}})
    assert op._config().setup_cmds == ["pip install -r requirements.txt", "echo ready"]
    op = build("ec2", setup_cmds="{{ params.cmds }}")
    op.render_template_fields({"params": {"cmds": "pip install x"}})
    with pytest.raises(ValueError, match="setup_cmds='pip install x' is not valid"):
        op._config()
