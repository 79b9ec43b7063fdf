"""The GCP cloud module against the Compute Engine emulator (which rejects what the real API rejects)."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import pytest

from airflow_cloudtrain.catalog import choose_offer
from airflow_cloudtrain.clouds.gcp.gce import gcp_cloud
from airflow_cloudtrain.contract.errors import CapacityUnavailable
from airflow_cloudtrain.contract.runs import RunKey
from airflow_cloudtrain.core.cloud import LaunchRequest
from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook
from airflow_cloudtrain.spec import Hardware
from airflow_cloudtrain.triggers.instances import InstanceStateTrigger

KEY = RunKey("dag", "task", "manual__2026-11-22T03:28:02+00:00", 3)
ZONE = "us-central1-b"
_tokens = iter(range(1000))


def launch_request(cloud_name: str, hw: Hardware, zone: str = ZONE, **kw) -> LaunchRequest:
    return LaunchRequest(
        offer=choose_offer(cloud_name, hw, zone=zone),
        zone=zone,
        user_data="#!/bin/bash\ntrue\n",
        tags=KEY.tags(),
        client_token=f"{KEY.digest}-1-{next(_tokens)}",
        disk_gib=120,
        **kw,
    )


def launch(emu, cloud_name: str, hw: Hardware, zone: str = ZONE, **kw):
    request = launch_request(cloud_name, hw, zone, **kw)
    offer = request.offer
    cloud = gcp_cloud(CloudTrainGcpHook(), "us-central1", zone)
    inst = cloud.launch(request)
    return cloud, inst, emu.gce.instance(zone, inst.id), offer


def test_t4_attaches_to_n1_with_terminate_on_maintenance(emu) -> None:
    cloud, inst, raw, offer = launch(emu, "gcloud", Hardware(cpus=4, gpus=1, gpu_type="T4"))
    try:
        assert offer.attach_gpus and raw["guestAccelerators"][0]["acceleratorType"].endswith(
            "nvidia-tesla-t4"
        )
        assert raw["scheduling"]["onHostMaintenance"] == "TERMINATE"
        assert raw["disks"][0]["diskSizeGb"] in ("120", 120)
        assert raw["labels"]["cloudtrain-run-key"] == KEY.digest
        assert raw["labels"]["cloudtrain-run-id"] == "manual__2026-11-22t03_28_02_00_00"  # label-safe
        assert raw["serviceAccounts"][0]["email"] == "default"
        assert "devstorage" in " ".join(raw["serviceAccounts"][0]["scopes"])
    finally:
        cloud.terminate([inst.id])


def test_l4_comes_with_g2_and_no_guest_accelerators(emu) -> None:
    cloud, inst, raw, offer = launch(emu, "gcloud", Hardware(gpus=1, gpu_type="L4"))
    try:
        # we send no guest accelerators for G2; GCE reports the bundled L4 there itself
        assert offer.instance_type.startswith("g2-") and not offer.attach_gpus
        assert raw["guestAccelerators"][0]["acceleratorType"].endswith("nvidia-l4")
    finally:
        cloud.terminate([inst.id])


@pytest.mark.parametrize(("provisioning", "expected"), [("spot", "SPOT"), ("preemptible", None)])
def test_spot_and_preemptible_provisioning(emu, provisioning: str, expected: str | None) -> None:
    cloud, inst, raw, _ = launch(emu, "gcspot", Hardware(cpus=2), provisioning=provisioning)
    try:
        assert inst.spot
        if expected:
            assert raw["scheduling"]["provisioningModel"] == "SPOT"
            assert raw["scheduling"]["instanceTerminationAction"] == "DELETE"
        else:
            assert raw["scheduling"]["preemptible"] is True
    finally:
        cloud.terminate([inst.id])
    assert cloud.describe([inst.id])[inst.id].state == "terminated"


def test_exhausted_zone_maps_to_capacity_unavailable(emu) -> None:
    offer = choose_offer("gcloud", Hardware(cpus=2), zone=ZONE)
    emu.fail_capacity(offer.instance_type, zone=ZONE)
    with pytest.raises(CapacityUnavailable) as err:
        launch(emu, "gcloud", Hardware(cpus=2))
    assert err.value.code == "ZONE_RESOURCE_POOL_EXHAUSTED"


def test_gce_triggers_share_one_list_per_zone(emu) -> None:
    cloud = None
    names = []
    for _ in range(8):
        cloud, inst, _, _ = launch(emu, "gcloud", Hardware(cpus=1))
        names.append(inst.id)
    try:
        emu.reset_counts()
        triggers = [
            InstanceStateTrigger(
                cloud="gcloud",
                instance_ids=[n],
                target_state="running",
                conn_id="google_cloud_default",
                region=ZONE,
                poll_interval=0.3,
                project_id="cloudtrain-emulated",
            )
            for n in names
        ]

        async def first(trigger):
            async with aclosing(trigger.run()) as events:
                async for event in events:
                    return event.payload

        async def main():
            return await asyncio.gather(*(first(t) for t in triggers))

        assert all(e["status"] == "success" for e in asyncio.run(main()))
        # one list per poll for all 8 (a fresh VM may need a second poll to reach RUNNING); unshared: >= 8
        assert emu.request_counts().get("instances.list") <= 2
    finally:
        cloud.terminate(names)


def test_describe_over_a_region_is_one_aggregated_call_for_every_zone(emu) -> None:
    """A region-wide describe (a gang's poll, a run that moved zones) finds VMs in two zones with one
    ``aggregatedList`` filtered by name, not an ``instances.list`` per zone; a name no zone has is
    reported gone."""
    a = launch(emu, "gcloud", Hardware(cpus=1), zone="us-central1-b")[1]
    b = launch(emu, "gcloud", Hardware(cpus=1), zone="us-central1-c")[1]
    region = gcp_cloud(CloudTrainGcpHook(), "us-central1", None)
    try:
        assert len(region.zones) > 2
        emu.reset_counts()
        found = region.describe([a.id, b.id, "ct-never-launched"])
        assert {n: i.zone for n, i in found.items() if n != "ct-never-launched"} == {
            a.id: "us-central1-b",
            b.id: "us-central1-c",
        }
        assert found[a.id].state in ("pending", "running") and found[b.id].state in ("pending", "running")
        assert found["ct-never-launched"].state == "terminated" and found["ct-never-launched"].missing
        counts = emu.request_counts()
        assert counts.get("instances.aggregatedList") == 1 and not counts.get("instances.list"), counts
    finally:
        region.terminate([a.id, b.id])


class _TakenAfterInsert:
    """The zone operations client, except that the moment an insert's operation is done, Compute Engine
    preempts the new Spot VM and deletes it (its termination action), before the launch reads it back."""

    def __init__(self, operations, emu, instances, project: str) -> None:
        self._operations, self._emu, self._instances, self._project = operations, emu, instances, project
        self.taken: list[str] = []

    def __getattr__(self, name: str):
        return getattr(self._operations, name)

    def wait(self, **kwargs):
        op = self._operations.wait(**kwargs)
        name = op.target_link.rsplit("/", 1)[-1]
        if op.operation_type == "insert" and name not in self.taken:
            self.taken.append(name)
            self._emu.gce.preempt(kwargs["zone"], name)
            self._instances.delete(project=self._project, zone=kwargs["zone"], instance=name)
        return op


def test_a_spot_vm_taken_between_its_insert_and_its_read_is_launched_and_ended(emu) -> None:
    """Fault campaign s110: the read after the insert got a 404 and failed the task. The VM was made,
    so the launch returns it ended and preempted: the wait relaunches from the checkpoint as after any
    preemption."""
    request = launch_request("gcspot", Hardware(cpus=2))
    cloud = gcp_cloud(CloudTrainGcpHook(), "us-central1", ZONE)
    taken = _TakenAfterInsert(cloud.operations, emu, cloud.instances, cloud.project)
    cloud.operations = taken
    inst = cloud.launch(request)
    assert taken.taken == [inst.id]
    assert (inst.state, inst.preempted, inst.spot, inst.zone) == ("terminated", True, True, ZONE)
    assert inst.instance_type == request.offer.instance_type
    assert emu.gce.instance(ZONE, inst.id) is None
