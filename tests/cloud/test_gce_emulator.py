"""The emulated Compute Engine and Cloud Storage, driven by the real google-cloud clients.

What the product's GCE code will meet in emulation must be what it meets in production: the same
client calls work, the same requests are rejected with the same exception classes and messages,
capacity errors arrive in the operation, and a preemption leaves the same traces.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.api_core.gapic_v1.client_info import ClientInfo
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1, storage
from waiting import wait_for

from airflow_cloudtrain.emulator.gcp.gce import EMULATOR_USER_AGENT, GceServer, compute_client_kwargs
from airflow_cloudtrain.emulator.gcp.gcs import GcsServer

ZONE = "us-central1-a"
IMAGE = "projects/debian-cloud/global/images/family/debian-12"


class Gce:
    """The server and the clients a hook would build against it."""

    def __init__(self, server: GceServer) -> None:
        self.server, self.project = server, server.project
        kwargs = compute_client_kwargs(server.endpoint)
        self.instances = compute_v1.InstancesClient(**kwargs)
        self.ops = compute_v1.ZoneOperationsClient(**kwargs)
        self.kwargs = kwargs

    def body(
        self,
        name: str,
        machine: str = "n1-standard-4",
        zone: str = ZONE,
        spot: bool = False,
        action: str | None = None,
        gpus: tuple[str, int] | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """An insert body as JSON-shaped dict (what the hook sends), overridable field by field."""
        scheduling: dict[str, Any] = {"onHostMaintenance": "TERMINATE", "automaticRestart": False}
        if spot:
            scheduling.update(provisioningModel="SPOT", instanceTerminationAction=action or "DELETE")
        body: dict[str, Any] = {
            "name": name,
            "machineType": f"zones/{zone}/machineTypes/{machine}",
            "disks": [
                {
                    "boot": True,
                    "autoDelete": True,
                    "initializeParams": {
                        "sourceImage": IMAGE,
                        "diskSizeGb": "80",
                        "diskType": f"zones/{zone}/diskTypes/pd-balanced",
                    },
                }
            ],
            "networkInterfaces": [
                {"network": "global/networks/default", "accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}
            ],
            "labels": {"cloudtrain-managed": "true", "cloudtrain-run": "ct-test"},
            "metadata": {"items": [{"key": "startup-script", "value": "#!/bin/sh\necho hello"}]},
            "serviceAccounts": [
                {"email": "default", "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}
            ],
            "scheduling": scheduling,
        }
        if gpus:
            body["guestAccelerators"] = [
                {"acceleratorType": f"zones/{zone}/acceleratorTypes/{gpus[0]}", "acceleratorCount": gpus[1]}
            ]
        body.update(fields)
        return {k: x for k, x in body.items() if x is not None}

    def insert(self, body: dict[str, Any], zone: str = ZONE, request_id: str | None = None) -> Any:
        request = compute_v1.InsertInstanceRequest(
            project=self.project,
            zone=zone,
            request_id=request_id,
            instance_resource=compute_v1.Instance.from_json(json.dumps(body)),
        )
        return self.instances.insert(request=request)

    def wait(self, operation: Any, zone: str = ZONE) -> compute_v1.Operation:
        return self.ops.wait(project=self.project, zone=zone, operation=operation.name)

    def get(self, name: str, zone: str = ZONE) -> compute_v1.Instance:
        return self.instances.get(project=self.project, zone=zone, instance=name)

    def until(self, name: str, status: str, zone: str = ZONE, timeout: float = 60.0) -> compute_v1.Instance:
        return wait_for(
            lambda: (inst := self.get(name, zone)).status == status and inst,
            timeout=timeout,
            message=f"{name} to be {status}",
        )

    def gone(self, name: str, zone: str = ZONE, timeout: float = 60.0) -> None:
        """Wait until the VM no longer exists (the emulator deletes on its own clock)."""

        def absent() -> bool:
            try:
                self.get(name, zone)
            except gexc.NotFound:
                return True
            return False

        wait_for(absent, timeout=timeout, message=f"{name} to be deleted")

    def names(self, zone: str = ZONE, flt: str = "", page_size: int | None = None) -> list[str]:
        request = compute_v1.ListInstancesRequest(
            project=self.project, zone=zone, filter=flt, max_results=page_size
        )
        return [i.name for i in self.instances.list(request=request)]

    def delete(self, name: str, zone: str = ZONE) -> None:
        self.wait(self.instances.delete(project=self.project, zone=zone, instance=name), zone)


@pytest.fixture(scope="module")
def gce() -> Iterator[Gce]:
    server = GceServer(delete_after_s=0.3)
    server.start()
    yield Gce(server)
    server.stop()


@pytest.fixture
def unique() -> Callable[[str], str]:
    return lambda prefix: f"{prefix}-{uuid.uuid4().hex[:8]}"


# --- instances -----------------------------------------------------------------------------------


def test_insert_get_list_delete_round_trip(gce: Gce, unique: Callable[[str], str]) -> None:
    run = unique("ct")
    names = sorted(unique("vm") for _ in range(3))
    for i, name in enumerate(names):
        op = gce.insert(
            gce.body(name, labels={"cloudtrain-managed": "true", "cloudtrain-run": run if i < 2 else "other"})
        )
        done = gce.wait(op)
        assert done.status == compute_v1.Operation.Status.DONE and done.operation_type == "insert"
        assert done.target_link.endswith(f"/zones/{ZONE}/instances/{name}") and not done.error.errors
    first = gce.get(names[0])
    assert first.status in ("PROVISIONING", "STAGING", "RUNNING")
    inst = gce.until(names[0], "RUNNING")
    assert inst.id > 0 and inst.machine_type.endswith(f"/zones/{ZONE}/machineTypes/n1-standard-4")
    assert inst.zone.endswith(f"/zones/{ZONE}") and inst.self_link.endswith(f"/instances/{names[0]}")
    assert datetime.fromisoformat(inst.creation_timestamp).tzinfo is not None
    assert inst.labels["cloudtrain-run"] == run
    assert {i.key: i.value for i in inst.metadata.items}["startup-script"].startswith("#!/bin/sh")
    assert inst.disks[0].boot and inst.disks[0].disk_size_gb == 80
    assert inst.service_accounts[0].email == "default" and inst.network_interfaces[0].network_i_p
    assert inst.scheduling.on_host_maintenance == "TERMINATE" and not inst.scheduling.preemptible
    for name in names:
        gce.until(name, "RUNNING")

    assert gce.names(flt=f"labels.cloudtrain-run = {run}") == names[:2]
    assert gce.names(flt=f'labels.cloudtrain-run="{run}" AND status = RUNNING') == names[:2]
    assert gce.names(flt=f"(labels.cloudtrain-run = {run}) (name != {names[0]})") == names[1:2]
    assert gce.names(flt="labels.cloudtrain-run = nothing-like-this") == []
    # maxResults pages: the pager follows nextPageToken, one instance per page
    request = compute_v1.ListInstancesRequest(
        project=gce.project, zone=ZONE, max_results=1, filter="labels.cloudtrain-managed = true"
    )
    pages = list(gce.instances.list(request=request).pages)
    assert len(pages) >= 3 and all(len(p.items) == 1 for p in pages)
    assert set(names) <= {p.items[0].name for p in pages}
    aggregated = compute_v1.AggregatedListInstancesRequest(
        project=gce.project, filter=f"labels.cloudtrain-run={run}"
    )
    found = {
        (scope, i.name)
        for scope, scoped in gce.instances.aggregated_list(request=aggregated)
        for i in scoped.instances
    }
    assert found == {(f"zones/{ZONE}", n) for n in names[:2]}

    op = gce.instances.delete(project=gce.project, zone=ZONE, instance=names[0])
    assert gce.wait(op).operation_type == "delete"
    with pytest.raises(gexc.NotFound, match="was not found"):
        gce.get(names[0])
    assert gce.names(flt=f"labels.cloudtrain-run = {run}") == names[1:2]
    for name in names[1:]:
        gce.delete(name)


def test_request_id_makes_insert_idempotent(gce: Gce, unique: Callable[[str], str]) -> None:
    name, request_id = unique("vm"), str(uuid.uuid4())
    first = gce.insert(gce.body(name), request_id=request_id)
    again = gce.insert(gce.body(name), request_id=request_id)  # a retried request: same operation
    assert again.name == first.name
    assert gce.names(flt=f"name = {name}") == [name]
    with pytest.raises(gexc.Conflict, match=f"instances/{name}' already exists"):
        gce.insert(gce.body(name), request_id=str(uuid.uuid4()))
    with pytest.raises(gexc.BadRequest, match="requestId"):
        gce.insert(gce.body(unique("vm")), request_id="not-a-uuid")
    gce.delete(name)


def test_operations_run_then_finish_and_wait_returns_done(unique: Callable[[str], str]) -> None:
    delay = 3.0
    server = GceServer(op_delay=delay)
    server.start()
    try:
        gce = Gce(server)
        name = unique("vm")
        began = time.monotonic()

        def running() -> bool:
            """Still inside the operation's delay (a busy machine may answer later than that:
            what the answer then says is not the point of this test)."""
            return time.monotonic() - began < delay

        op = gce.insert(gce.body(name))
        assert op.status == compute_v1.Operation.Status.RUNNING or not running()
        vm = gce.get(name)
        # visible while its insert runs: PROVISIONING for its first 0.1 s, then STAGING and RUNNING on
        # the clock while the operation (3 s) still runs; which one depends on how fast the answer came
        assert vm.status in ("PROVISIONING", "STAGING", "RUNNING") or not running()
        polled = gce.ops.get(project=gce.project, zone=ZONE, operation=op.name)
        assert polled.status == compute_v1.Operation.Status.RUNNING or not running()
        done = gce.wait(op)
        assert done.status == compute_v1.Operation.Status.DONE and done.progress == 100 and done.end_time
        with pytest.raises(gexc.NotFound, match="operations/operation-nope"):
            gce.ops.get(project=gce.project, zone=ZONE, operation="operation-nope")
    finally:
        server.stop()


def _without(key: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda b: {k: x for k, x in b.items() if k != key}


def _with(**fields: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda b: {**b, **fields}


def _disk(**params: Any) -> list[dict[str, Any]]:
    return [{"boot": True, "initializeParams": {"sourceImage": IMAGE, **params}}]


def _mt(machine: str) -> str:
    return f"zones/{ZONE}/machineTypes/{machine}"


def _gpu(name: str, count: int = 1) -> list[dict[str, Any]]:
    return [{"acceleratorType": f"zones/{ZONE}/acceleratorTypes/{name}", "acceleratorCount": count}]


BAD = gexc.BadRequest
REJECTED = [
    ("no name", _without("name"), BAD, "Required field 'resource.name' not specified"),
    ("uppercase name", _with(name="Bad_Name"), BAD, "Invalid value for field 'resource.name'"),
    ("name too long", _with(name="a" * 64), BAD, "Invalid value for field 'resource.name'"),
    ("no machine type", _without("machineType"), BAD, "Required field 'resource.machineType'"),
    ("bare machine type", _with(machineType="n1-standard-4"), BAD, "The URL is malformed"),
    (
        "unknown machine type",
        _with(machineType=_mt("n1-standard-3")),
        BAD,
        f"Machine type with name 'n1-standard-3' does not exist in zone '{ZONE}'",
    ),
    ("odd N1 custom vCPUs", _with(machineType=_mt("custom-3-4096")), BAD, "Invalid number of vCPUs 3"),
    (
        "custom memory not 256 MiB",
        _with(machineType=_mt("custom-2-2000")),
        BAD,
        "Memory should be a multiple of 256MiB, while 2000MiB is requested",
    ),
    (
        "N1 custom too much memory",
        _with(machineType=_mt("custom-2-16384")),
        BAD,
        "Memory should be between 2048MiB and 13312MiB for 2 CPUs",
    ),
    (
        "N2 custom too little memory",
        _with(machineType=_mt("n2-custom-4-1024")),
        BAD,
        "Memory should be between 2048MiB and 32768MiB for 4 CPUs",
    ),
    (
        "T4 on g2",
        _with(machineType=_mt("g2-standard-4"), guestAccelerators=_gpu("nvidia-tesla-t4")),
        BAD,
        "[nvidia-tesla-t4, g2-standard-4] features are not compatible",
    ),
    (
        "L4 attached to n1",
        _with(guestAccelerators=_gpu("nvidia-l4")),
        BAD,
        "[nvidia-l4, n1-standard-4] features are not compatible",
    ),
    (
        "T4 with live migration",
        _with(scheduling={"onHostMaintenance": "MIGRATE"}, guestAccelerators=_gpu("nvidia-tesla-t4")),
        BAD,
        "Instances with guest accelerators do not support live migration",
    ),
    (
        "g2 with default maintenance",
        _with(scheduling={}, machineType=_mt("g2-standard-4")),
        BAD,
        "Instances with guest accelerators do not support live migration",
    ),
    ("three T4", _with(guestAccelerators=_gpu("nvidia-tesla-t4", 3)), BAD, "must be one of [1, 2, 4]"),
    (
        "V100 on too many vCPUs",
        _with(machineType=_mt("n1-standard-16"), guestAccelerators=_gpu("nvidia-tesla-v100")),
        BAD,
        "At most 12 vCPUs can be used along with 1 accelerator cards",
    ),
    ("no boot disk", _with(disks=[]), BAD, "Boot disk must be specified"),
    (
        "boot disk second",
        _with(disks=[{"initializeParams": {"diskSizeGb": "10"}}, *_disk()]),
        BAD,
        "Boot disk must be the first disk",
    ),
    (
        "boot disk without image",
        _with(disks=[{"boot": True, "initializeParams": {"diskSizeGb": "10"}}]),
        BAD,
        "initializeParams.sourceImage",
    ),
    (
        "bare disk type",
        _with(disks=_disk(diskType="pd-ssd")),
        BAD,
        "'resource.disks[0].initializeParams.diskType': 'pd-ssd'. The URL is malformed",
    ),
    (
        "pd-standard on g2",
        _with(machineType=_mt("g2-standard-4"), disks=_disk(diskType=f"zones/{ZONE}/diskTypes/pd-standard")),
        BAD,
        "[pd-standard, g2-standard-4] features are not compatible",
    ),
    (
        "uppercase label value",
        _with(labels={"cloudtrain-run": "CT-1"}),
        BAD,
        "Label value 'CT-1' violates format constraints",
    ),
    ("label value too long", _with(labels={"k": "v" * 64}), BAD, "violates format constraints"),
    ("label key with a digit first", _with(labels={"1k": "v"}), BAD, "Label key '1k' violates"),
    (
        "termination action on a standard VM",
        _with(scheduling={"instanceTerminationAction": "DELETE"}),
        BAD,
        "instanceTerminationAction",
    ),
    (
        "spot with live migration",
        _with(scheduling={"provisioningModel": "SPOT", "onHostMaintenance": "MIGRATE"}),
        BAD,
        "OnHostMaintenance isn't TERMINATE",
    ),
    (
        "oversized startup script",
        _with(metadata={"items": [{"key": "startup-script", "value": "x" * 262145}]}),
        BAD,
        "'resource.metadata' is too large",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "exc", "message"), [r[1:] for r in REJECTED], ids=[r[0] for r in REJECTED]
)
def test_insert_rejected_like_the_real_api(
    gce: Gce, unique: Callable[[str], str], mutate: Any, exc: type, message: str
) -> None:
    name = unique("vm")
    body = mutate(gce.body(name))
    with pytest.raises(exc) as info:
        gce.insert(body)
    assert message in str(info.value)
    assert info.value.errors and info.value.errors[0]["domain"] == "global"
    assert gce.names(flt=f"name = {name}") == []


def test_machine_type_must_exist_in_the_zone(gce: Gce, unique: Callable[[str], str]) -> None:
    with pytest.raises(gexc.BadRequest, match="'g2-standard-4' does not exist in zone 'us-central1-f'"):
        gce.insert(gce.body(unique("vm"), "g2-standard-4", zone="us-central1-f"), zone="us-central1-f")
    t4 = ("nvidia-tesla-t4", 1)
    with pytest.raises(gexc.BadRequest, match="'nvidia-tesla-t4' does not exist in zone 'us-east1-b'"):
        gce.insert(gce.body(unique("vm"), "n1-standard-4", zone="us-east1-b", gpus=t4), zone="us-east1-b")


def test_unknown_zone_and_project(gce: Gce) -> None:
    with pytest.raises(gexc.BadRequest, match="Unknown zone"):
        gce.insert(gce.body("vm-x", zone="mars-north1-a"), zone="mars-north1-a")
    with pytest.raises(gexc.NotFound, match="projects/someone-else/zones/us-central1-a/instances/vm-x"):
        gce.instances.get(project="someone-else", zone=ZONE, instance="vm-x")  # any project, empty
    with pytest.raises(gexc.NotFound, match="projects/Not_A_Project"):  # no project id at all
        gce.instances.get(project="Not_A_Project", zone=ZONE, instance="vm-x")


def test_any_project_a_dag_names_is_served_with_its_own_state(gce: Gce, unique: Callable[[str], str]) -> None:
    """A user's DAG names its own project (as moto accepts any account): the VM lives there only."""
    mine = Gce(gce.server)
    mine.project = "my-project"
    name = unique("vm")
    op = mine.wait(mine.insert(mine.body(name)))
    assert op.status == compute_v1.Operation.Status.DONE and not op.error.errors
    inst = mine.until(name, "RUNNING")
    assert inst.self_link.endswith(f"/projects/my-project/zones/{ZONE}/instances/{name}")
    assert name in mine.names() and name not in gce.names()  # state per project
    with pytest.raises(gexc.NotFound, match=f"projects/{gce.project}/zones/{ZONE}/instances/{name}"):
        gce.get(name)
    # the same name may exist in two projects, each its own VM
    gce.wait(gce.insert(gce.body(name)))
    assert gce.get(name).id != mine.get(name).id
    gce.delete(name)
    assert mine.get(name).status == "RUNNING"
    # the emulator's own view: the VM's project, and the testing calls that name it
    alive = [i for i in gce.server.alive() if i["name"] == name]
    assert [i["project"] for i in alive] == ["my-project"]
    assert gce.server.instance(ZONE, name, project="my-project")["status"] == "RUNNING"
    assert gce.server.instance(ZONE, name) is None
    gce.server.shutdown(ZONE, name)  # found in the project that holds it
    assert mine.get(name).status == "TERMINATED"
    mine.delete(name)
    mine.gone(name)


def test_capacity_faults_reach_every_project(gce: Gce, unique: Callable[[str], str]) -> None:
    mine = Gce(gce.server)
    mine.project = f"fault-{uuid.uuid4().hex[:6]}"  # a project first used after the fault was set
    gce.server.fail_capacity("n1-standard-2", ZONE)
    try:
        op = mine.wait(mine.insert(mine.body(unique("vm"), "n1-standard-2")))
        assert op.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
        assert f"projects/{mine.project}/zones/{ZONE}" in op.error.errors[0].message
    finally:
        gce.server.clear_faults()


@pytest.mark.parametrize("machine", ["custom-1-1024", "custom-2-13312", "custom-8-30720", "n2-custom-4-8192"])
def test_custom_shapes_inside_the_family_rules_are_accepted(
    gce: Gce, unique: Callable[[str], str], machine: str
) -> None:
    name = unique("vm")
    gce.wait(gce.insert(gce.body(name, machine)))
    assert gce.get(name).machine_type.endswith(f"/machineTypes/{machine}")
    gce.delete(name)


def test_gpus_attach_to_n1_and_come_with_g2(gce: Gce, unique: Callable[[str], str]) -> None:
    n1, g2 = unique("vm"), unique("vm")
    gce.wait(gce.insert(gce.body(n1, "n1-standard-8", gpus=("nvidia-tesla-t4", 1))))
    gce.wait(gce.insert(gce.body(g2, "g2-standard-4")))
    attached = gce.get(n1).guest_accelerators[0]
    assert attached.accelerator_type.endswith(f"/zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4")
    assert attached.accelerator_count == 1
    bundled = gce.get(g2).guest_accelerators[0]
    assert bundled.accelerator_type.endswith("/nvidia-l4") and bundled.accelerator_count == 1
    gce.delete(n1)
    gce.delete(g2)


# --- injected failures ---------------------------------------------------------------------------


def test_capacity_error_arrives_in_the_operation(gce: Gce, unique: Callable[[str], str]) -> None:
    gce.server.fail_capacity("g2-standard-8", zone=ZONE)
    try:
        name = unique("vm")
        op = gce.insert(gce.body(name, "g2-standard-8"))  # accepted: no HTTP error
        done = gce.wait(op)
        assert done.status == compute_v1.Operation.Status.DONE
        assert done.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
        assert f"zones/{ZONE}' does not have enough resources" in done.error.errors[0].message
        assert done.http_error_status_code == 503
        with pytest.raises(gexc.NotFound):
            gce.get(name)
        # The client's extended-operation API surfaces it as an exception when waited on.
        with pytest.raises(gexc.ServiceUnavailable) as info:
            gce.insert(gce.body(unique("vm"), "g2-standard-8")).result(timeout=120)
        assert info.value.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
        # Another zone still has the type.
        other = unique("vm")
        gce.wait(
            gce.insert(gce.body(other, "g2-standard-8", zone="us-central1-b"), zone="us-central1-b"),
            "us-central1-b",
        )
        gce.delete(other, "us-central1-b")
    finally:
        gce.server.clear_faults()
    name = unique("vm")
    gce.insert(gce.body(name, "g2-standard-8")).result(timeout=120)
    gce.delete(name)


def test_quota_errors_in_the_operation_or_at_once(gce: Gce, unique: Callable[[str], str]) -> None:
    gce.server.fail_quota("n1-standard-8")
    tried = [unique("vm") for _ in range(3)]
    try:
        done = gce.wait(
            gce.insert(gce.body(tried[0], "n1-standard-8", spot=True, gpus=("nvidia-tesla-t4", 1)))
        )
        assert done.error.errors[0].code == "QUOTA_EXCEEDED" and done.http_error_status_code == 403
        assert "Quota 'PREEMPTIBLE_NVIDIA_T4_GPUS' exceeded" in done.error.errors[0].message
        with pytest.raises(gexc.Forbidden, match="Quota 'CPUS' exceeded"):
            gce.insert(gce.body(tried[1], "n1-standard-8")).result(timeout=120)
        gce.server.fail_quota(zone=ZONE, metric="CPUS", synchronous=True)
        with pytest.raises(gexc.Forbidden) as info:
            gce.insert(gce.body(tried[2], "n1-standard-2"))
        assert info.value.errors[0]["reason"] == "quotaExceeded"
    finally:
        gce.server.clear_faults()
    assert not set(tried) & set(gce.names())


def test_list_filter_regex_and_presence(gce: Gce, unique: Callable[[str], str]) -> None:
    name = unique("rx")
    gce.wait(gce.insert(gce.body(name, labels={"team": "ml"})))
    assert gce.names(flt="name eq rx-.*") == [name]
    assert name not in gce.names(flt="name ne rx-.*")
    assert gce.names(flt="labels.team:*") == [name]
    assert gce.names(flt="labels.team = ml OR labels.team = nobody") == [name]
    with pytest.raises(gexc.BadRequest, match="filter"):
        gce.names(flt="labels.team =")
    gce.delete(name)


# --- the cloud's side ----------------------------------------------------------------------------


def test_preempted_spot_vm_is_terminated_then_deleted(unique: Callable[[str], str]) -> None:
    delete_after = 3.0
    server = GceServer(delete_after_s=delete_after)
    server.start()
    try:
        _preempted_spot_vm_is_terminated_then_deleted(Gce(server), unique, delete_after)
    finally:
        server.stop()


def _preempted_spot_vm_is_terminated_then_deleted(
    gce: Gce, unique: Callable[[str], str], delete_after: float
) -> None:
    name = unique("vm")
    gce.wait(gce.insert(gce.body(name, spot=True, action="DELETE")))
    inst = gce.until(name, "RUNNING")
    assert (
        inst.scheduling.provisioning_model == "SPOT"
        and inst.scheduling.instance_termination_action == "DELETE"
    )
    alive = {a["name"]: a for a in gce.server.alive()}
    assert (
        alive[name]["spot"] and alive[name]["zone"] == ZONE and alive[name]["machine_type"] == "n1-standard-4"
    )
    assert alive[name]["metadata"]["startup-script"].startswith("#!") and alive[name]["id"] == str(inst.id)

    gce.server.preempt(ZONE, name)
    preempted = time.monotonic()
    try:
        stopped = gce.get(name)
        assert stopped.status == "TERMINATED" and stopped.last_stop_timestamp
    except gexc.NotFound:  # a busy machine answered after the emulator's delete: only then
        assert time.monotonic() - preempted >= delete_after
    assert name not in {a["name"] for a in gce.server.alive()}
    request = compute_v1.ListZoneOperationsRequest(
        project=gce.project, zone=ZONE, filter='operationType = "compute.instances.preempted"'
    )
    events = [o for o in gce.ops.list(request=request) if o.target_link.endswith(f"/instances/{name}")]
    assert (
        len(events) == 1
        and events[0].status == compute_v1.Operation.Status.DONE
        and events[0].user == "system"
    )
    gce.gone(name)  # Spot VMs with the DELETE action go away


def test_preemption_grace_keeps_the_guest_alive_while_stopping(
    gce: Gce, unique: Callable[[str], str]
) -> None:
    name = unique("vm")
    gce.wait(gce.insert(gce.body(name, spot=True, action="STOP")))
    gce.until(name, "RUNNING")
    grace_s = 3.0
    preempted = time.monotonic()
    gce.server.preempt(ZONE, name, grace_s=grace_s)
    status = gce.get(name).status
    alive = {a["name"]: a["status"] for a in gce.server.alive()}.get(name)
    # what the guest shows inside its grace; a machine too busy to read within 3 s reads its end instead
    if time.monotonic() - preempted < grace_s:
        assert status == "STOPPING" and alive == "STOPPING", (status, alive)
    else:
        assert status in ("STOPPING", "TERMINATED"), status
    gce.until(name, "TERMINATED")
    assert name not in {a["name"] for a in gce.server.alive()}
    gce.delete(name)


def test_preempted_with_stop_action_and_guest_shutdown_stay_terminated(
    gce: Gce, unique: Callable[[str], str]
) -> None:
    spot, normal = unique("vm"), unique("vm")
    gce.wait(gce.insert(gce.body(spot, spot=True, action="STOP")))
    gce.wait(gce.insert(gce.body(normal)))
    gce.until(spot, "RUNNING")
    gce.server.preempt(ZONE, spot)
    gce.server.shutdown(ZONE, normal)
    gce.until(spot, "TERMINATED")
    gce.until(normal, "TERMINATED")
    assert set(gce.names(flt="status = TERMINATED")) >= {spot, normal}
    ops = gce.ops.list(request=compute_v1.ListZoneOperationsRequest(project=gce.project, zone=ZONE))
    kinds = {(o.operation_type, o.target_link.rsplit("/", 1)[-1]) for o in ops}
    assert ("compute.instances.guestTerminate", normal) in kinds
    assert ("compute.instances.preempted", normal) not in kinds
    with pytest.raises(KeyError):
        gce.server.preempt(ZONE, normal)  # already off
    gce.delete(spot)
    gce.delete(normal)


def test_stop_turns_the_instance_off(gce: Gce, unique: Callable[[str], str]) -> None:
    name = unique("vm")
    gce.wait(gce.insert(gce.body(name)))
    gce.wait(gce.instances.stop(project=gce.project, zone=ZONE, instance=name))
    assert gce.get(name).status == "TERMINATED"
    gce.delete(name)


def test_request_counts_leave_out_the_emulators_own_calls(gce: Gce, unique: Callable[[str], str]) -> None:
    name = unique("vm")
    gce.server.reset_counts()
    op = gce.insert(gce.body(name))
    gce.wait(op)
    gce.get(name)
    gce.names()
    own = compute_v1.InstancesClient(client_info=ClientInfo(user_agent=EMULATOR_USER_AGENT), **gce.kwargs)
    own.get(project=gce.project, zone=ZONE, instance=name)
    list(own.aggregated_list(project=gce.project))
    assert gce.server.counts() == {
        "instances.insert": 1,
        "zoneOperations.wait": 1,
        "instances.get": 1,
        "instances.list": 1,
    }
    gce.delete(name)


def test_zones_machine_types_and_accelerator_types(gce: Gce) -> None:
    zones = {z.name: z for z in compute_v1.ZonesClient(**gce.kwargs).list(project=gce.project)}
    assert (
        ZONE in zones and zones[ZONE].region.endswith("/regions/us-central1") and zones[ZONE].status == "UP"
    )
    assert (
        compute_v1.ZonesClient(**gce.kwargs).get(project=gce.project, zone="us-east1-b").name == "us-east1-b"
    )
    with pytest.raises(gexc.NotFound):
        compute_v1.ZonesClient(**gce.kwargs).get(project=gce.project, zone="mars-north1-a")
    types = compute_v1.MachineTypesClient(**gce.kwargs)
    g2 = types.get(project=gce.project, zone=ZONE, machine_type="g2-standard-4")
    assert (g2.guest_cpus, g2.memory_mb) == (4, 16384)
    assert (g2.accelerators[0].guest_accelerator_type, g2.accelerators[0].guest_accelerator_count) == (
        "nvidia-l4",
        1,
    )
    assert "n1-standard-8" in {m.name for m in types.list(project=gce.project, zone=ZONE)}
    assert types.get(project=gce.project, zone=ZONE, machine_type="custom-4-8192").guest_cpus == 4
    accels = {
        a.name: a
        for a in compute_v1.AcceleratorTypesClient(**gce.kwargs).list(project=gce.project, zone=ZONE)
    }
    assert accels["nvidia-tesla-t4"].maximum_cards_per_instance == 4 and "nvidia-l4" in accels


# --- Cloud Storage -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gcs() -> Iterator[GcsServer]:
    server = GcsServer()
    server.start()
    saved = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ.update(server.env())
    yield server
    if saved is None:
        os.environ.pop("STORAGE_EMULATOR_HOST", None)
    else:
        os.environ["STORAGE_EMULATOR_HOST"] = saved
    server.stop()


def test_gcs_serves_a_users_own_project(gcs: GcsServer) -> None:
    client = storage.Client(project="my-project", credentials=AnonymousCredentials())
    bucket = client.create_bucket(f"my-bucket-{uuid.uuid4().hex[:6]}")
    bucket.blob("data/x.txt").upload_from_string(b"mine")
    assert client.bucket(bucket.name).blob("data/x.txt").download_as_bytes() == b"mine"
    assert [b.name for b in client.list_blobs(bucket.name)] == ["data/x.txt"]


def test_a_gcs_write_does_not_rewrite_every_object_s_metadata(gcs: GcsServer) -> None:
    """The package serialized the metadata of every object in memory on each write (O(objects) per
    write: 5 s a write at 10,000 objects). In memory nothing reads it back, so nothing is written."""
    client = storage.Client(project="cloudtrain-emulated", credentials=AnonymousCredentials())
    bucket = client.create_bucket(f"meta-{uuid.uuid4().hex[:6]}")
    for i in range(3):
        bucket.blob(f"runs/{i}.txt").upload_from_string(b"x")
    store = gcs._storage._store._files  # the package's in-memory files
    assert f"{bucket.name}/runs/2.txt" in store and ".meta" not in store
    assert [b.name for b in client.list_blobs(bucket.name)] == [f"runs/{i}.txt" for i in range(3)]


def test_gcs_round_trip_with_the_real_client(gcs: GcsServer) -> None:
    gcs.create_bucket("cloudtrain-emulated")
    gcs.create_bucket("cloudtrain-emulated")  # idempotent
    client = storage.Client(project="cloudtrain-emulated", credentials=AnonymousCredentials())
    bucket = client.get_bucket("cloudtrain-emulated")
    assert client.create_bucket("other-bucket").name == "other-bucket"

    bucket.blob("runs/a/spec.json").upload_from_string('{"v": 1}', content_type="application/json")
    for i in range(5):
        bucket.blob(f"runs/a/logs/{i:06d}.log").upload_from_string(f"line {i}\n")
    big = os.urandom(9 * 1024 * 1024 + 123)
    bucket.blob("runs/a/checkpoints/1/model.bin").upload_from_string(big)
    assert any("uploadType=resumable" in line for line in gcs.requests)  # >8 MiB goes resumable

    assert bucket.blob("runs/a/checkpoints/1/model.bin").download_as_bytes() == big
    assert bucket.blob("runs/a/checkpoints/1/model.bin").download_as_bytes(start=10, end=19) == big[10:20]
    meta = bucket.get_blob("runs/a/spec.json")
    assert meta.size == 8 and meta.content_type == "application/json" and meta.md5_hash
    listing = client.list_blobs("cloudtrain-emulated", prefix="runs/a/", delimiter="/")
    assert [b.name for b in listing] == ["runs/a/spec.json"]
    assert listing.prefixes == {"runs/a/logs/", "runs/a/checkpoints/"}
    logs = [f"runs/a/logs/{i:06d}.log" for i in range(5)]
    pages = list(client.list_blobs("cloudtrain-emulated", prefix="runs/a/logs/", page_size=2).pages)
    assert [b.name for p in pages for b in p] == logs and [p.num_items for p in pages] == [2, 2, 1]
    after = client.list_blobs("cloudtrain-emulated", prefix="runs/a/logs/", start_offset=logs[3])
    assert [b.name for b in after] == logs[3:]
    assert [
        b.name for b in client.list_blobs("cloudtrain-emulated", prefix="runs/a/logs/", max_results=1)
    ] == logs[:1]

    bucket.blob("runs/a/spec.json").delete()
    assert bucket.get_blob("runs/a/spec.json") is None
    with pytest.raises(gexc.NotFound):
        bucket.blob("runs/a/spec.json").download_as_bytes()
    with pytest.raises(gexc.NotFound):
        client.get_bucket("no-such-bucket")


# --- Pub/Sub: any project too ----------------------------------------------------------------------


def test_pubsub_serves_any_project_with_its_own_topics() -> None:
    from google.cloud import pubsub_v1

    from airflow_cloudtrain.emulator.gcp import PubSubServer, pubsub_client_kwargs

    server = PubSubServer(project="cloudtrain-emulated")
    server.start()
    try:
        pub = pubsub_v1.PublisherClient(**pubsub_client_kwargs(server.endpoint))
        sub = pubsub_v1.SubscriberClient(**pubsub_client_kwargs(server.endpoint))
        topic, subscription = "projects/my-project/topics/work", "projects/my-project/subscriptions/workers"
        pub.create_topic(request={"name": topic})
        sub.create_subscription(request={"name": subscription, "topic": topic})
        pub.publish(topic, b"item-1").result(timeout=30)
        deadline = time.monotonic() + 60
        while not (got := sub.pull(subscription=subscription, max_messages=1).received_messages):
            assert time.monotonic() < deadline, "nothing delivered"
        assert got[0].message.data == b"item-1"
        assert [t.name for t in pub.list_topics(project="projects/my-project")] == [topic]
        assert list(pub.list_topics(project="projects/cloudtrain-emulated")) == []  # its own topics
        with pytest.raises(gexc.NotFound):
            pub.get_topic(topic="projects/cloudtrain-emulated/topics/work")
    finally:
        server.stop()
