"""``ssh_source_ranges`` checked at parse time (naming the field and the accepted forms), and the GCE
launch shape every run gets: the run's network tag on the VM (and on a group's template), and the
firewall rules of the run (a deny-all-ingress rule above the default network's allow rules; an SSH
allow rule above it only when ranges are given)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_cloudtrain.catalog import choose_offer
from airflow_cloudtrain.clouds.gcp.firewall import (
    DENY_PRIORITY,
    SSH_PRIORITY,
    digest_of,
    network_tag,
    rule_bodies,
)
from airflow_cloudtrain.clouds.gcp.gce import instance_properties
from airflow_cloudtrain.contract.runs import RunKey
from airflow_cloudtrain.core.cloud import LaunchRequest
from airflow_cloudtrain.core.ledger import Resource, _reverse_kinds
from airflow_cloudtrain.operators import (
    CheckpointResumeOperator,
    CloudTrainOperator,
    PreemptibleGroupOperator,
    SpotFleetOperator,
)
from airflow_cloudtrain.spec import Hardware

KEY = RunKey("dag", "train", "manual__2026-11-26T00:00:00+00:00", 1)


def make(**kw: Any) -> CloudTrainOperator:
    kw.setdefault("bucket", "gs://bkt/runs")
    return CloudTrainOperator(task_id="t", command="true", cloud=kw.pop("cloud", "gcspot"), **kw)


def test_no_ssh_by_default() -> None:
    assert make().launch_options.ssh_source_ranges == []


def test_ranges_are_normalised_and_deduplicated() -> None:
    op = make(ssh_source_ranges=["203.0.113.7/24", "198.51.100.1", "2001:db8::/32", "203.0.113.0/24"])
    assert op.launch_options.ssh_source_ranges == ["203.0.113.0/24", "198.51.100.1/32", "2001:db8::/32"]


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("203.0.113.0/24", ["ssh_source_ranges='203.0.113.0/24'", "a list of IPv4 or IPv6 CIDR ranges"]),
        (["203.0.113.0/33"], ["'203.0.113.0/33' is not an IP range", "35.235.240.0/20"]),
        (["my-office"], ["'my-office' is not an IP range"]),
        ([""], ["'' is not an IP range"]),
        ([22], ["22 is not an IP range"]),
        ({"office": "203.0.113.0/24"}, ["ssh_source_ranges={'office'"]),
    ],
)
def test_bad_ranges_fail_at_parse_time_naming_the_field(value: Any, words: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        make(ssh_source_ranges=value)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize("cloud", ["ec2", "ec2spot"])
def test_on_ec2_it_fails_naming_what_ec2_uses(cloud: str) -> None:
    with pytest.raises(ValueError) as err:
        make(cloud=cloud, bucket="s3://bkt/r", ssh_source_ranges=["203.0.113.0/24"])
    for word in (
        "ssh_source_ranges=['203.0.113.0/24']",
        f"cloud={cloud!r}",
        "key_name",
        "security_group_ids",
    ):
        assert word in str(err.value)
    with pytest.raises(ValueError, match="key_name"):
        SpotFleetOperator(
            task_id="f",
            command="true",
            bucket="s3://bkt/r",
            work_items=["a"],
            ssh_source_ranges=["10.0.0.0/8"],
        )


def test_a_templated_cloud_is_checked_once_rendered() -> None:
    op = make(cloud="{{ params.cloud }}", bucket="{{ params.bucket }}", ssh_source_ranges=["10.0.0.0/8"])
    op.cloud, op.bucket = "ec2", "s3://bkt/r"
    with pytest.raises(ValueError, match="ssh_source_ranges=.*cloud='ec2'"):
        op._config()


def test_every_gce_operator_takes_it() -> None:
    resume = CheckpointResumeOperator(
        task_id="r", command="true", cloud="gcspot", bucket="gs://bkt/r", ssh_source_ranges=["10.0.0.0/8"]
    )
    group = PreemptibleGroupOperator(
        task_id="g", command="true", bucket="gs://bkt/r", work_items=["a"], ssh_source_ranges=["10.0.0.0/8"]
    )
    assert resume.launch_options.ssh_source_ranges == group.launch_options.ssh_source_ranges == ["10.0.0.0/8"]


@pytest.mark.parametrize("zone", ["us-central1-b", None])  # a VM, and a group's instance template
def test_the_vm_carries_the_run_s_network_tag(zone: str | None) -> None:
    offer = choose_offer("gcspot", Hardware(cpus=2), zone="us-central1-b")
    request = LaunchRequest(offer, zone, "#!/bin/bash\n", KEY.tags(), f"{KEY.digest}-1-0", 50)
    assert instance_properties(request, zone)["tags"] == {"items": [f"ct-{KEY.digest}"]}


def test_the_rules_of_a_run() -> None:
    (deny,) = rule_bodies(KEY.digest, "global/networks/default", [])
    assert deny["name"] == f"ct-{KEY.digest}-deny" and deny["target_tags"] == [network_tag(KEY.digest)]
    assert deny["priority"] == DENY_PRIORITY < 65534  # above default-allow-ssh/-rdp/-icmp
    assert (deny["direction"], deny["source_ranges"], deny["denied"]) == (
        "INGRESS",
        ["0.0.0.0/0"],
        [{"I_p_protocol": "all"}],
    )
    assert KEY.digest in deny["description"]
    _, ssh, ssh6 = rule_bodies(KEY.digest, "global/networks/vpc", ["203.0.113.0/24", "2001:db8::/32"])
    assert ssh["priority"] == ssh6["priority"] == SSH_PRIORITY < DENY_PRIORITY  # the allow wins
    assert (ssh["source_ranges"], ssh6["source_ranges"]) == (["203.0.113.0/24"], ["2001:db8::/32"])
    assert ssh["allowed"] == [{"I_p_protocol": "tcp", "ports": ["22"]}]
    assert {digest_of(r["name"]) for r in (deny, ssh, ssh6)} == {KEY.digest}
    assert digest_of(f"ct-{KEY.digest}") is None  # the group/template of the run is not a rule


def test_firewall_rules_are_released_after_every_other_kind() -> None:
    """Even when a sweep found the rule after the instance (a lost store, a trigger's on_kill)."""
    import airflow_cloudtrain.clouds.gcp.backend  # noqa: F401 - registers the kind

    entries = [Resource("instance", "vm", "z"), Resource("firewall", "ct-x-deny", "p")]
    assert _reverse_kinds(entries) == ["instance", "firewall"]
    entries = [Resource("firewall", "ct-x-deny", "p"), Resource("instance_template", "t", None)]
    assert _reverse_kinds(entries) == ["instance_template", "firewall"]
