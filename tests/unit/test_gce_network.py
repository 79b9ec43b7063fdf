"""GCE networking: ``network``/``subnetwork``/``external_ip`` checked at parse time (naming the field) and
turned into the VM's network interface, for a single VM (zonal insert) and a group's instance template."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_cloudtrain.catalog import choose_offer
from airflow_cloudtrain.clouds.gcp.gce import instance_properties
from airflow_cloudtrain.contract.errors import InvalidRequest
from airflow_cloudtrain.core.cloud import LaunchRequest
from airflow_cloudtrain.operators import (
    CheckpointResumeOperator,
    CloudTrainOperator,
    PreemptibleGroupOperator,
    SpotFleetOperator,
)
from airflow_cloudtrain.spec import Hardware

NAT = [{"name": "External NAT", "type_": "ONE_TO_ONE_NAT"}]
SUB_PATH = "projects/my-proj/regions/us-central1/subnetworks/train-sub"
URL = "https://www.googleapis.com/compute/v1/"


def request(zone: str | None = "us-central1-b", **kw: Any) -> LaunchRequest:
    offer = choose_offer("gcspot", Hardware(cpus=2), zone="us-central1-b")
    return LaunchRequest(offer, zone, "#!/bin/bash\n", {}, "d-1-0", 50, **kw)


@pytest.mark.parametrize(
    ("kw", "nic"),
    [
        ({}, {"network": "global/networks/default", "access_configs": NAT}),
        ({"external_ip": False}, {"network": "global/networks/default"}),
        (
            {"network": "global/networks/vpc", "subnetwork": "train-sub", "external_ip": False},
            {"network": "global/networks/vpc", "subnetwork": "regions/us-central1/subnetworks/train-sub"},
        ),
        ({"subnetwork": SUB_PATH}, {"subnetwork": SUB_PATH, "access_configs": NAT}),
        (
            {"network": "projects/host-proj/global/networks/shared"},
            {"network": "projects/host-proj/global/networks/shared", "access_configs": NAT},
        ),
    ],
)
@pytest.mark.parametrize("zone", ["us-central1-b", None])  # a VM, and a group's instance template
def test_network_interface_for_each_setting(
    kw: dict[str, Any], nic: dict[str, Any], zone: str | None
) -> None:
    assert instance_properties(request(zone, **kw), zone)["network_interfaces"] == [nic]


def test_a_subnetwork_of_another_region_is_refused_at_launch() -> None:
    with pytest.raises(InvalidRequest, match="not in region 'us-central1'"):
        instance_properties(request(subnetwork="regions/us-east1/subnetworks/s"), "us-central1-b")


def make(**kw: Any) -> CloudTrainOperator:
    kw.setdefault("bucket", "gs://bkt/runs")
    return CloudTrainOperator(task_id="t", command="true", cloud=kw.pop("cloud", "gcspot"), **kw)


@pytest.mark.parametrize(
    ("network", "expected"),
    [
        ("my-vpc", "global/networks/my-vpc"),
        ("projects/my-proj/global/networks/my-vpc", "projects/my-proj/global/networks/my-vpc"),
        (f"{URL}projects/my-proj/global/networks/my-vpc", f"{URL}projects/my-proj/global/networks/my-vpc"),
    ],
)
def test_accepted_network_forms(network: str, expected: str) -> None:
    assert make(network=network).launch_options.network == expected


@pytest.mark.parametrize(
    "subnetwork", ["train-sub", SUB_PATH, f"{URL}{SUB_PATH}", "regions/us-central1/subnetworks/train-sub"]
)
def test_accepted_subnetwork_forms(subnetwork: str) -> None:
    op = make(subnetwork=subnetwork, region="us-central1", external_ip=False)
    assert op.launch_options.subnetwork == subnetwork and op.launch_options.external_ip is False


def test_a_subnetwork_path_chooses_the_region_when_none_is_given() -> None:
    assert make(subnetwork="projects/my-proj/regions/europe-west4/subnetworks/s").region == "europe-west4"
    assert make(subnetwork="s").region is None  # a bare name goes wherever the run goes


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"network": "My_VPC"}, ["network='My_VPC'", "projects/PROJECT/global/networks/NAME"]),
        ({"network": "projects/p/networks/x"}, ["network=", "global/networks/NAME"]),
        ({"network": 42}, ["network=42"]),
        ({"subnetwork": "projects/my-proj/subnetworks/s"}, ["subnetwork=", "regions/REGION/subnetworks"]),
        ({"subnetwork": "Sub!"}, ["subnetwork='Sub!'"]),
        (
            {"subnetwork": "projects/my-proj/regions/us-east1/subnetworks/s", "region": "us-central1"},
            ["subnetwork=", "region='us-central1'", "'us-east1'"],
        ),
        (
            {"subnetwork": "regions/us-east1/subnetworks/s", "zone": "europe-west4-a"},
            ["zone='europe-west4-a'", "'us-east1'"],
        ),
        (
            {"network": "projects/proj-a/global/networks/n", "subnetwork": SUB_PATH, "region": "us-central1"},
            ["different projects"],
        ),
        ({"external_ip": "false"}, ["external_ip='false'", "Cloud NAT"]),
        ({"external_ip": None}, ["external_ip=None"]),
        (
            {"cloud": "ec2", "bucket": "s3://bkt/r", "network": "vpc"},
            ["network='vpc'", "cloud='ec2'", "subnet_id"],
        ),
        ({"cloud": "ec2spot", "bucket": "s3://bkt/r", "subnetwork": "s"}, ["subnetwork='s'", "subnet_id"]),
        (
            {"cloud": "ec2", "bucket": "s3://bkt/r", "external_ip": False},
            ["external_ip=False", "cloud='ec2'"],
        ),
    ],
)
def test_bad_values_fail_at_parse_time_naming_the_field(kw: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        make(**kw)
    for word in words:
        assert word in str(err.value)


def test_a_templated_cloud_or_region_skips_only_the_checks_that_need_it() -> None:
    make(cloud="{{ params.cloud }}", network="vpc")
    make(region="{{ params.region }}", subnetwork=SUB_PATH)
    with pytest.raises(ValueError, match="network="):
        make(cloud="{{ params.cloud }}", network="Bad Net")


def test_a_templated_cloud_is_checked_once_rendered() -> None:
    op = make(cloud="{{ params.cloud }}", bucket="{{ params.bucket }}", network="vpc")
    op.cloud, op.bucket = "gcspot", "gs://bkt/r"
    assert op._config().cloud == "gcspot"
    op.cloud, op.bucket = "ec2", "s3://bkt/r"
    with pytest.raises(ValueError, match="network='global/networks/vpc' is not valid with cloud='ec2'"):
        op._config()


def test_every_gce_operator_takes_the_arguments() -> None:
    resume = CheckpointResumeOperator(
        task_id="r", command="true", cloud="gcspot", bucket="gs://bkt/r", network="vpc", external_ip=False
    )
    group = PreemptibleGroupOperator(
        task_id="g", command="true", bucket="gs://bkt/r", work_items=["a"], subnetwork="s", external_ip=False
    )
    assert (resume.launch_options.network, resume.launch_options.external_ip) == (
        "global/networks/vpc",
        False,
    )
    assert (group.launch_options.subnetwork, group.launch_options.external_ip) == ("s", False)
    with pytest.raises(ValueError, match="external_ip=False is not valid with cloud='ec2spot'"):
        SpotFleetOperator(
            task_id="f", command="true", bucket="s3://bkt/r", work_items=["a"], external_ip=False
        )
