"""``orphan_timeout`` at parse time and once rendered (issue 26): forms, refusals, the warning, None."""

from __future__ import annotations

import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_cloudtrain.contract.lease import DEFAULT_ORPHAN_TIMEOUT_S
from airflow_cloudtrain.contract.runs import RunSpec
from airflow_cloudtrain.operators import (
    CheckpointResumeOperator,
    CloudTrainOperator,
    MLEngineTrainOperator,
    PreemptibleGroupOperator,
    SpotFleetOperator,
)
from airflow_cloudtrain.operators.lease_config import parse_orphan_timeout
from airflow_cloudtrain.spec import RunConfig

ML_CODE = str(Path(__file__).resolve().parents[2] / "example_dags" / "mlengine_code")
EC2 = {"task_id": "t", "cloud": "ec2", "command": "python train.py", "bucket": "s3://bkt/p"}


def _build(**changes: Any) -> CloudTrainOperator:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return CloudTrainOperator(**{**EC2, **changes})


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("45m", 2700.0), (600, 600.0), (90.5, 90.5), (timedelta(hours=1), 3600.0), ("1h30m", 5400.0)],
)
def test_every_duration_form_is_taken(value: Any, seconds: float) -> None:
    assert parse_orphan_timeout(value, poll_interval=10.0) == seconds


def test_default_is_30_minutes_and_none_turns_it_off() -> None:
    op = _build()
    config = op._config()
    assert op._wait_settings(config).orphan_timeout == DEFAULT_ORPHAN_TIMEOUT_S == 1800.0
    off = _build(orphan_timeout=None)
    assert off._wait_settings(off._config()).orphan_timeout is None


@pytest.mark.parametrize("value", ["soon", "1h1h", -5, 0, True, [60], ""])
def test_not_a_duration_is_refused_naming_the_field(value: Any) -> None:
    with pytest.raises(ValueError, match=r"orphan_timeout=.*not a valid duration.*None"):
        _build(orphan_timeout=value)


def test_shorter_than_three_polls_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"orphan_timeout=25 \(25 s\) is shorter than 3 x poll_interval \(10 s\)"
    ):
        _build(orphan_timeout=25, poll_interval=10)
    assert _build(orphan_timeout=30, poll_interval=10).orphan_timeout == 30


def test_the_default_fits_a_long_poll_interval_instead_of_failing() -> None:
    op = _build(poll_interval="15m")
    assert op._wait_settings(op._config()).orphan_timeout == 2700.0


def test_longer_than_max_runtime_warns_that_it_has_no_effect() -> None:
    with pytest.warns(UserWarning, match=r"orphan_timeout='2h' .* longer than max_runtime .* no effect"):
        CloudTrainOperator(**EC2, orphan_timeout="2h", max_runtime="1h")


@pytest.mark.parametrize(
    ("cls", "args"),
    [
        (CloudTrainOperator, EC2),
        (CheckpointResumeOperator, {**EC2, "cloud": "ec2spot"}),
        (SpotFleetOperator, {**EC2, "cloud": "ec2spot", "work_items": ["a"]}),
        (
            PreemptibleGroupOperator,
            {**EC2, "cloud": "gcspot", "bucket": "gs://bkt/p", "work_items": ["a"]},
        ),
        (
            MLEngineTrainOperator,
            {
                "task_id": "t",
                "region": "us-central1",
                "bucket": "gs://bkt/jobs",
                "code": ML_CODE,
                "python_module": "trainer.task",
            },
        ),
    ],
)
def test_every_operator_of_the_family_takes_it_and_templates_it(cls: type, args: dict[str, Any]) -> None:
    assert "orphan_timeout" in cls.template_fields
    with pytest.raises(ValueError, match="orphan_timeout"):
        cls(**args, orphan_timeout="soon")
    op = cls(**args, orphan_timeout="{{ params.t }}")  # checked once rendered
    assert op.orphan_timeout == "{{ params.t }}"


def test_a_rendered_value_is_checked_again() -> None:
    op = _build(orphan_timeout="{{ params.t }}")
    op.orphan_timeout = "nope"  # what the template rendered to
    with pytest.raises(ValueError, match="orphan_timeout='nope'"):
        op._wait_settings(op._config())
    op.orphan_timeout = "5s"  # below 3 polls of 10 s
    with pytest.raises(ValueError, match="shorter than 3 x poll_interval"):
        op._wait_settings(op._config())


def test_the_spec_carries_it_and_an_old_spec_has_none() -> None:
    spec = RunSpec(run_id="r", run_uri="s3://b/r", cloud="ec2", command="x", orphan_timeout_s=600.0)
    assert RunSpec.from_json(spec.to_json()).orphan_timeout_s == 600.0
    old = spec.to_json().replace('"orphan_timeout_s": 600.0', '"unknown_field": 1')
    assert RunSpec.from_json(old).orphan_timeout_s is None  # a release without leases: never orphaned
    assert isinstance(_build()._config(), RunConfig)
