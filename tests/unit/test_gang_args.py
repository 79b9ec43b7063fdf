"""``num_nodes``, ``placement`` and ``log_nodes`` are checked when the DAG file is parsed (issue 25):
each bad value fails naming the field, the value and what is accepted; the limit of 64 nodes names the
Airflow option that raises it; the fleets, whose instances are independent workers, point to
``num_workers``."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_cloudtrain.operators import (
    CheckpointResumeOperator,
    CloudTrainOperator,
    PreemptibleGroupOperator,
    SpotFleetOperator,
)

BASE: dict[str, Any] = {"task_id": "t", "cloud": "ec2", "command": "python train.py", "bucket": "s3://bkt/p"}


def make(**changes: object) -> CloudTrainOperator:
    return CloudTrainOperator(**{**BASE, **changes})


def test_defaults_are_one_node_and_every_log() -> None:
    op = make()
    assert (op.num_nodes, op.placement, op.log_nodes) == (1, None, None)
    assert "num_nodes" in op.template_fields


@pytest.mark.parametrize(
    ("value", "expected"), [(0, "num_nodes=0"), (-2, "num_nodes=-2"), (True, "num_nodes=True"), ("x", "'x'")]
)
def test_num_nodes_must_be_a_whole_number_from_one(value: object, expected: str) -> None:
    with pytest.raises(ValueError, match=expected) as err:
        make(num_nodes=value)
    assert "at least 1" in str(err.value)


def test_num_nodes_above_the_limit_names_the_option_that_raises_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"num_nodes=65 is above the limit of 64") as err:
        make(num_nodes=65)
    assert "[cloudtrain] max_num_nodes" in str(err.value)
    make(num_nodes=64)
    monkeypatch.setenv("AIRFLOW__CLOUDTRAIN__MAX_NUM_NODES", "128")
    assert make(num_nodes=100).num_nodes == 100


def test_a_params_form_string_and_a_template_are_accepted() -> None:
    assert make(num_nodes="3").num_nodes == "3"  # rendered params come as strings
    make(num_nodes="{{ params.nodes }}")  # checked once rendered
    with pytest.raises(ValueError, match="num_nodes='three'"):
        make(num_nodes="three")


def test_placement_is_none_or_cluster_on_a_family_that_can_use_it() -> None:
    make(num_nodes=2, placement="cluster", instance_type="c5n.large")
    with pytest.raises(ValueError, match="placement='spread'"):
        make(placement="spread")
    with pytest.raises(
        ValueError, match=r"placement=\"cluster\" cannot be used with instance_type='t3.large'"
    ):
        make(placement="cluster", instance_type="t3.large")
    with pytest.raises(ValueError, match="instance_type='e2-standard-4'"):
        make(cloud="gcloud", bucket="gs://bkt/p", placement="cluster", instance_type="e2-standard-4")


def test_log_nodes_is_all_or_head() -> None:
    make(num_nodes=3, log_nodes="head")
    with pytest.raises(ValueError, match="log_nodes='tail'") as err:
        make(num_nodes=3, log_nodes="tail")
    assert "'all'" in str(err.value) and "'head'" in str(err.value)


def test_log_nodes_defaults_to_every_node_up_to_eight() -> None:
    from airflow_cloudtrain.operators.gang_config import parse_gang_args

    assert parse_gang_args(8, None, None, "ec2", None).log_nodes == "all"  # type: ignore[union-attr]
    assert parse_gang_args(9, None, None, "ec2", None).log_nodes == "head"  # type: ignore[union-attr]


def test_checkpoint_resume_takes_a_gang_with_the_same_checks() -> None:
    op = CheckpointResumeOperator(**{**BASE, "cloud": "ec2spot"}, num_nodes=3, log_nodes="head")
    assert op.num_nodes == 3 and op.checkpoint_ranks == "head"
    with pytest.raises(ValueError, match="num_nodes=0"):
        CheckpointResumeOperator(**{**BASE, "cloud": "ec2spot"}, num_nodes=0)
    with pytest.raises(ValueError, match="log_nodes='tail'"):
        CheckpointResumeOperator(**{**BASE, "cloud": "ec2spot"}, num_nodes=3, log_nodes="tail")


@pytest.mark.parametrize(
    ("cls", "bucket"), [(SpotFleetOperator, "s3://bkt/p"), (PreemptibleGroupOperator, "gs://bkt/p")]
)
def test_the_fleets_point_to_num_workers(cls: type, bucket: str) -> None:
    args = {"task_id": "t", "command": "python item.py", "bucket": bucket, "work_items": ["a"]}
    if cls is PreemptibleGroupOperator:
        args["region"] = "us-central1"
    with pytest.raises(ValueError, match="num_nodes=4 is not valid on") as err:
        cls(**args, num_nodes=4)
    assert "num_workers" in str(err.value)


def test_a_gang_takes_no_volume() -> None:
    with pytest.raises(ValueError, match="volume_id='vol-0123abcd' is not valid with num_nodes=2"):
        make(num_nodes=2, volume_id="vol-0123abcd")
    make(num_nodes=1, volume_id="vol-0123abcd")
