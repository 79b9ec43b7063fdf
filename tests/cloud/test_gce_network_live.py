"""``network``/``subnetwork``/``external_ip`` on the emulated Compute Engine: a VM and a group's instance
template, each read back with the real ``compute_v1`` clients as a user would in the console."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from google.cloud import compute_v1

from airflow_cloudtrain.catalog import choose_offer
from airflow_cloudtrain.clouds.gcp.fleet import GcpFleet
from airflow_cloudtrain.clouds.gcp.gce import gcp_cloud, zones_of
from airflow_cloudtrain.contract.runs import RunKey
from airflow_cloudtrain.core.cloud import LaunchRequest
from airflow_cloudtrain.emulator import GCP_PROJECT
from airflow_cloudtrain.emulator.gcp.gce import compute_client_kwargs
from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook
from airflow_cloudtrain.spec import Hardware

REGION, ZONE = "us-central1", "us-central1-b"
KEY = RunKey("dag", "network", "manual__2026-11-25T00:00:00+00:00", 1)
PRIVATE = {
    "network": "projects/cloudtrain-emulated/global/networks/train-vpc",
    "subnetwork": "train-sub",
    "external_ip": False,
}


def request(zone: str | None, **kw: Any) -> LaunchRequest:
    return LaunchRequest(
        offer=choose_offer("gcspot", Hardware(cpus=2), zone=ZONE),
        zone=zone,
        user_data="#!/bin/bash\ntrue\n",
        tags=KEY.tags(),
        client_token=f"{KEY.digest}-1-{uuid.uuid4().int % 10**6}",
        disk_gib=20,
        provisioning="spot",
        **kw,
    )


@pytest.mark.parametrize(
    ("kw", "network", "subnetwork", "public"),
    [
        ({}, "global/networks/default", "", True),
        (PRIVATE, "global/networks/train-vpc", f"regions/{REGION}/subnetworks/train-sub", False),
        (
            {"subnetwork": f"projects/{GCP_PROJECT}/regions/{REGION}/subnetworks/s2"},
            "",
            "subnetworks/s2",
            True,
        ),
    ],
    ids=["default", "private", "subnetwork-only"],
)
def test_the_vm_has_the_asked_network_interface(
    emu, kw: dict[str, Any], network: str, subnetwork: str, public: bool
) -> None:
    cloud = gcp_cloud(CloudTrainGcpHook(), REGION, ZONE)
    inst = cloud.launch(request(ZONE, **kw))
    try:
        client = compute_v1.InstancesClient(**compute_client_kwargs(emu.gce_endpoint))
        (nic,) = client.get(project=GCP_PROJECT, zone=ZONE, instance=inst.id).network_interfaces
        assert nic.network.endswith(network)
        assert nic.subnetwork.endswith(subnetwork) if subnetwork else not nic.subnetwork
        configs = [(c.type_, bool(c.nat_i_p)) for c in nic.access_configs]
        assert configs == ([("ONE_TO_ONE_NAT", True)] if public else [])
    finally:
        cloud.terminate([inst.id])


def test_a_group_s_instance_template_has_no_access_config_without_external_ip(emu) -> None:
    hook = CloudTrainGcpHook()
    fleet = GcpFleet(hook, GCP_PROJECT, REGION, ZONE, zones_of(REGION))
    name = f"ct-net-{uuid.uuid4().hex[:8]}"
    fleet.create_template(name, request(None, **PRIVATE))
    try:
        client = compute_v1.InstanceTemplatesClient(**compute_client_kwargs(emu.gce_endpoint))
        (nic,) = client.get(project=GCP_PROJECT, instance_template=name).properties.network_interfaces
        assert nic.network.endswith("global/networks/train-vpc")
        assert nic.subnetwork.endswith(f"regions/{REGION}/subnetworks/train-sub")
        assert list(nic.access_configs) == []
    finally:
        fleet.delete_template(name)
