"""SpotFleetOperator's and PreemptibleGroupOperator's bad input fails when the DAG file is parsed, naming the field."""

from __future__ import annotations

import pytest

from airflow_cloudtrain.operators import PreemptibleGroupOperator, SpotFleetOperator
from airflow_cloudtrain.operators.fleet_config import parse_work_items

BASE = {
    "task_id": "sweep",
    "command": "python train.py",
    "bucket": "s3://my-bucket/sweeps",
    "work_items": ["a"],
}


def make(**changes: object) -> SpotFleetOperator:
    return SpotFleetOperator(**{**BASE, **changes})


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"work_items": []}, "work_items=[]"),
        ({"work_items": "not json"}, "work_items="),
        ({"work_items": {"a": 1}}, "work_items="),
        ({"work_items": ["ok", {"x": object()}]}, "work_items[1]"),
        ({"work_items": [{"x": float("nan")}]}, "work_items[0]"),
        ({"work_items": ["x" * 300_000]}, "work_items[0]"),
        ({"num_workers": 4, "max_workers": 2}, "max_workers=2"),
        ({"num_workers": 0}, "num_workers=0"),
        ({"max_item_attempts": 0}, "max_item_attempts=0"),
        ({"lease_timeout": 5}, "lease_timeout=5"),
        ({"item_timeout": "soon"}, "item_timeout="),
        ({"cloud": "ec2", "bid": "60%"}, "bid='60%'"),
        ({"cloud": "gcspot"}, "cloud='gcspot'"),
        ({"bucket": "gs://my-bucket/x"}, "bucket="),
    ],
)
def test_bad_input_fails_at_parse_time_naming_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        make(**changes)


def test_items_are_strings_or_sorted_json() -> None:
    assert parse_work_items(["a", {"lr": 0.1, "b": 2}]) == ["a", '{"b": 2, "lr": 0.1}']
    assert parse_work_items('["x", {"y": 1}]') == ["x", '{"y": 1}']


def test_templated_and_upstream_items_are_checked_when_the_task_runs() -> None:
    op = make(work_items="{{ ti.xcom_pull('make_sweep') }}", num_workers=2, max_workers=8, bid="60%")
    assert "work_items" in op.template_fields
    assert op.fleet_args["max_workers"] == 8


GCE_BASE = {**BASE, "bucket": "gs://my-bucket/sweeps", "region": "us-central1"}


def make_group(**changes: object) -> PreemptibleGroupOperator:
    return PreemptibleGroupOperator(**{**GCE_BASE, **changes})


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"work_items": []}, "work_items=[]"),
        ({"num_workers": 0}, "num_workers=0"),
        ({"max_workers": 4}, "max_workers=4"),
        ({"bid": "60%"}, "bid='60%'"),
        ({"cloud": "ec2spot"}, "cloud='ec2spot'"),
        ({"lease_timeout": 900}, "lease_timeout=900"),
        ({"lease_timeout": 5}, "lease_timeout=5"),
        ({"max_item_attempts": 0}, "max_item_attempts=0"),
        ({"provisioning": "cheap"}, "provisioning='cheap'"),
        ({"bucket": "s3://my-bucket/x"}, "bucket="),
    ],
)
def test_group_bad_input_fails_at_parse_time_naming_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        make_group(**changes)


def test_group_defaults_to_spot_vms_and_takes_preemptible() -> None:
    op = make_group(num_workers=3)
    assert op.cloud == "gcspot" and op.fleet_args["num_workers"] == 3
    assert op.launch_options.provisioning == "spot"
    assert make_group(provisioning="preemptible").launch_options.provisioning == "preemptible"
    assert make_group(cloud="gcloud").launch_options.provisioning is None
