"""``placement`` of a gang at parse time (``catalog.rules.check_placement``): the field, the value and
what is accepted are named; ``"cluster"`` only where the instance family can use it."""

from __future__ import annotations

import pytest

from airflow_cloudtrain.catalog.rules import check_placement


@pytest.mark.parametrize(
    ("cloud", "instance_type"),
    [
        ("ec2", "p4d.24xlarge"),
        ("ec2spot", "c5n.18xlarge"),
        ("ec2", "m4.large"),
        ("gcloud", "a2-highgpu-1g"),
        ("gcspot", "n2-standard-8"),
        ("gcloud", "c2d-standard-4"),
        ("ec2", None),
        ("gcloud", None),
    ],
)
def test_cluster_where_the_family_supports_it(cloud: str, instance_type: str | None) -> None:
    assert check_placement("cluster", cloud, instance_type) == "cluster"
    assert check_placement(None, cloud, instance_type) is None


@pytest.mark.parametrize("value", ["spread", "CLUSTER", "", 1, True])
def test_unknown_placement_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(ValueError, match=r"placement=.* is not a placement; use None .* or \"cluster\""):
        check_placement(value, "ec2", "p4d.24xlarge")


@pytest.mark.parametrize(
    ("cloud", "instance_type", "hint"),
    [
        ("ec2", "t3.micro", "burstable"),
        ("ec2", "mac1.metal", "Mac"),
        ("ec2", "m7i-flex.large", "flex"),
        ("ec2", "m3.medium", "current-generation"),
        ("gcloud", "e2-standard-4", "N2"),
        ("gcspot", "n1-standard-4", "C2"),
        ("gcloud", "custom-4-8192", "A2"),
    ],
)
def test_cluster_on_a_family_that_cannot_use_it_is_refused(cloud: str, instance_type: str, hint: str) -> None:
    with pytest.raises(ValueError) as err:
        check_placement("cluster", cloud, instance_type)
    message = str(err.value)
    assert message.startswith(f'placement="cluster" cannot be used with instance_type={instance_type!r}')
    assert hint in message and "placement=None" in message
