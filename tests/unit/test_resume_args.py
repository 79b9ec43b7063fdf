"""CheckpointResumeOperator's own arguments: every bad value or combination fails at DAG parse time,
naming the field."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from airflow_cloudtrain.operators import CheckpointResumeOperator

BASE: dict[str, Any] = {
    "task_id": "train",
    "cloud": "ec2spot",
    "command": "python train.py",
    "bucket": "s3://my-bucket/runs",
    "live_prices": False,
}


def make(**extra: Any) -> CheckpointResumeOperator:
    return CheckpointResumeOperator(**{**BASE, **extra})


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"max_restarts": -1}, "max_restarts"),
        ({"max_restarts": "3"}, "max_restarts"),
        ({"max_restarts_on_errors": True}, "max_restarts_on_errors"),
        ({"checkpoint_interval": 0}, "checkpoint_interval"),
        ({"checkpoint_interval": "often"}, "checkpoint_interval"),
        ({"checkpoint_dir": ""}, "checkpoint_dir"),
        ({"policy": "cheapest"}, "policy"),
        ({"on_demand_after": 0}, "on_demand_after"),
        (
            {"policy": "deadline", "on_demand_after": 2, "deadline": "6h", "expected_duration": "1h"},
            "on_demand_after",
        ),
        ({"deadline": timedelta(hours=6)}, "deadline"),
        ({"expected_duration": "1h"}, "expected_duration"),
        ({"policy": "deadline", "expected_duration": "1h"}, "deadline"),
        ({"policy": "deadline", "deadline": "6h"}, "expected_duration"),
        ({"policy": "deadline", "deadline": "soon", "expected_duration": "1h"}, "deadline"),
        ({"policy": "deadline", "deadline": "2h", "expected_duration": "3h"}, "expected_duration"),
        ({"stop_grace": 300}, "stop_grace"),
        ({"stop_grace": -1}, "stop_grace"),
        ({"idle_timeout": "forever"}, "idle_timeout"),
        ({"resume_from": "yesterday"}, "resume_from"),
        ({"resume_from": "gs://other-cloud/runs/x"}, "resume_from"),
    ],
)
def test_bad_arguments_fail_at_parse_time_naming_the_field(extra: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make(**extra)


def test_good_arguments_parse() -> None:
    op = make(
        policy="deadline",
        deadline=datetime(2030, 1, 1, tzinfo=timezone.utc),
        expected_duration="2h",
        stop_grace=20,
        idle_timeout="30m",
        checkpoint_interval="2m",
        resume_from="ct-0123456789ab",
    )
    args = op.resume
    assert (args.expected_duration_s, args.stop_grace_s, args.idle_timeout_s) == (7200, 20, 1800)
    assert args.checkpoint_interval_s == 120
    assert args.deadline_at(0.0) == datetime(2030, 1, 1, tzinfo=timezone.utc).timestamp()
    relative = make(policy="deadline", deadline=timedelta(hours=6), expected_duration=3600).resume
    assert relative.deadline_at(1000.0) == 1000.0 + 6 * 3600
    assert make(resume_from="s3://my-bucket/runs/d/t/r/-1").resume.resume_from.startswith("s3://")
    assert make(resume_from="{{ params.resume }}").resume.resume_from == "{{ params.resume }}"
    assert make(cloud="gcspot", bucket="gs://bkt/x", resume_from="gs://bkt/x/runs/a").resume.resume_from


def test_the_operator_imports_no_cloud_sdk() -> None:
    import subprocess
    import sys

    code = (
        "import sys; import airflow_cloudtrain.operators; "
        "print(sorted(m for m in ('boto3', 'botocore', 'google.cloud.compute_v1') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
