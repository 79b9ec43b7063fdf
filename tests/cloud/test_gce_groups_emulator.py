"""Instance templates and managed instance groups in the emulated Compute Engine, driven by the real
google-cloud-compute clients.

A worker group on GCE lives on what the group manager does by itself: it creates members from the
template, repairs members that end other than through the group (same name, new VM), and lets a
member leave for good only through ``deleteInstances``. These tests hold the emulator to that, and to
the real API's answers (exception classes, messages, resource fields).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import compute_v1
from waiting import wait_for

from airflow_cloudtrain.agent.queue_pubsub import GroupsRest, ManagedInstanceGroup
from airflow_cloudtrain.contract.retry import is_transient
from airflow_cloudtrain.contract.workqueue import WorkerSettings
from airflow_cloudtrain.emulator.gcp.gce import GceServer, compute_client_kwargs
from airflow_cloudtrain.emulator.gcp.instances import GcpInstances
from airflow_cloudtrain.emulator.metadata import MetadataServer

ZONE = "us-central1-a"
IMAGE = "projects/debian-cloud/global/images/family/debian-12"
BOOTSTRAP = "#!/bin/bash\nCT_RUN_URI='gs://bucket/runs/ct-x'\nCT_CLOUD=gcspot\n"


class Gce:
    """The server and the clients a fleet would build against it."""

    def __init__(self, server: GceServer) -> None:
        self.server, self.project = server, server.project
        kwargs = compute_client_kwargs(server.endpoint)
        self.templates = compute_v1.InstanceTemplatesClient(**kwargs)
        self.groups = compute_v1.InstanceGroupManagersClient(**kwargs)
        self.instances = compute_v1.InstancesClient(**kwargs)
        self.zone_ops = compute_v1.ZoneOperationsClient(**kwargs)
        self.global_ops = compute_v1.GlobalOperationsClient(**kwargs)

    @staticmethod
    def properties(spot: bool = False, **fields: Any) -> dict[str, Any]:
        """Template properties as JSON (what the product sends), overridable field by field."""
        scheduling: dict[str, Any] = {"onHostMaintenance": "TERMINATE", "automaticRestart": False}
        if spot:
            scheduling.update(provisioningModel="SPOT", instanceTerminationAction="DELETE")
        props: dict[str, Any] = {
            "machineType": "n1-standard-4",
            "disks": [
                {
                    "boot": True,
                    "autoDelete": True,
                    "initializeParams": {"sourceImage": IMAGE, "diskSizeGb": "50", "diskType": "pd-balanced"},
                }
            ],
            "networkInterfaces": [{"network": "global/networks/default"}],
            "labels": {"cloudtrain-managed": "true", "cloudtrain-run-key": "abc123"},
            "metadata": {"items": [{"key": "startup-script", "value": BOOTSTRAP}]},
            "serviceAccounts": [
                {"email": "default", "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}
            ],
            "scheduling": scheduling,
            "shieldedInstanceConfig": {"enableSecureBoot": True, "enableVtpm": True},
        }
        props.update(fields)
        return props

    def template(self, name: str, request_id: str | None = None, **props: Any) -> compute_v1.Operation:
        body = compute_v1.InstanceTemplate.from_json(
            json.dumps({"name": name, "properties": self.properties(**props)})
        )
        request = compute_v1.InsertInstanceTemplateRequest(
            project=self.project, instance_template_resource=body, request_id=request_id
        )
        op = self.templates.insert(request=request)
        op.result(timeout=120)
        return op

    def group(self, name: str, template: str, size: int, base: str | None = None) -> None:
        body = compute_v1.InstanceGroupManager(
            name=name,
            base_instance_name=base or name,
            instance_template=f"global/instanceTemplates/{template}",
            target_size=size,
        )
        op = self.groups.insert(project=self.project, zone=ZONE, instance_group_manager_resource=body)
        op.result(timeout=120)

    def get(self, group: str) -> compute_v1.InstanceGroupManager:
        return self.groups.get(project=self.project, zone=ZONE, instance_group_manager=group)

    def managed(self, group: str) -> dict[str, compute_v1.ManagedInstance]:
        """listManagedInstances: member name -> entry."""
        found = self.groups.list_managed_instances(
            project=self.project, zone=ZONE, instance_group_manager=group
        )
        return {m.instance.rsplit("/", 1)[-1]: m for m in found}

    def running(self, group: str, count: int) -> dict[str, compute_v1.ManagedInstance]:
        """Wait until the group is stable with ``count`` members, every VM RUNNING."""

        def ready() -> dict[str, compute_v1.ManagedInstance] | None:
            members = self.managed(group)
            settled = all(
                m.current_action == "NONE" and m.instance_status == "RUNNING" for m in members.values()
            )
            return members if len(members) == count and settled and self.get(group).status.is_stable else None

        return wait_for(ready, message=f"{group} never had {count} running members: {self.managed(group)}")

    def vm(self, name: str) -> compute_v1.Instance:
        return self.instances.get(project=self.project, zone=ZONE, instance=name)

    def vm_id(self, name: str) -> int | None:
        """The id of the VM of that name, None while there is none."""
        try:
            return int(self.vm(name).id)
        except gexc.NotFound:
            return None

    def vm_gone(self, name: str) -> bool:
        return self.vm_id(name) is None

    def resize(self, group: str, size: int) -> None:
        self.groups.resize(project=self.project, zone=ZONE, instance_group_manager=group, size=size).result(
            timeout=10
        )

    def delete_instances(self, group: str, names: list[str], skip: bool = False) -> None:
        request = compute_v1.InstanceGroupManagersDeleteInstancesRequest(
            instances=[f"zones/{ZONE}/instances/{n}" for n in names], skip_instances_on_validation_error=skip
        )
        self.groups.delete_instances(
            project=self.project,
            zone=ZONE,
            instance_group_manager=group,
            instance_group_managers_delete_instances_request_resource=request,
        ).result(timeout=120)

    def recreate_instances(self, group: str, names: list[str]) -> None:
        self.groups.recreate_instances(
            project=self.project,
            zone=ZONE,
            instance_group_manager=group,
            instance_group_managers_recreate_instances_request_resource={
                "instances": [f"zones/{ZONE}/instances/{n}" for n in names]
            },
        ).result(timeout=120)

    def two_members(self, template: str, group: str, spot: bool = False) -> tuple[str, int]:
        """A group of two running members of a new template: the first member's name and VM id."""
        self.template(template, spot=spot)
        self.group(group, template, 2)
        name = sorted(self.running(group, 2))[0]
        return name, self.vm(name).id

    def ops(self, kind: str) -> list[compute_v1.Operation]:
        """The zone's operations of that type."""
        request = compute_v1.ListZoneOperationsRequest(
            project=self.project, zone=ZONE, filter=f'operationType = "{kind}"'
        )
        return list(self.zone_ops.list(request=request))

    def drop(self, group: str, template: str) -> None:
        """Delete the group, then its template."""
        self.groups.delete(project=self.project, zone=ZONE, instance_group_manager=group).result(timeout=120)
        self.templates.delete(project=self.project, instance_template=template).result(timeout=120)


@pytest.fixture(scope="module")
def gce() -> Iterator[Gce]:
    server = GceServer(provision_s=0.05, boot_s=0.05, delete_after_s=0.5, recreate_s=0.5)
    server.start()
    yield Gce(server)
    server.stop()


@pytest.fixture
def unique() -> Callable[[str], str]:
    return lambda prefix: f"{prefix}-{uuid.uuid4().hex[:8]}"


# --- instance templates ----------------------------------------------------------------------------


def test_template_insert_get_list_delete(gce: Gce, unique: Callable[[str], str]) -> None:
    name, request_id = unique("tpl"), str(uuid.uuid4())
    op = gce.template(name, request_id=request_id, spot=True)
    assert gce.template(name, request_id=request_id, spot=True).name == op.name  # a replay: same operation
    done = gce.global_ops.wait(project=gce.project, operation=op.name)
    assert done.status == compute_v1.Operation.Status.DONE and done.operation_type == "insert"
    assert done.target_link.endswith(f"/global/instanceTemplates/{name}") and not done.zone
    assert gce.global_ops.get(project=gce.project, operation=op.name).name == op.name

    got = gce.templates.get(project=gce.project, instance_template=name)
    assert got.self_link.endswith(f"/projects/{gce.project}/global/instanceTemplates/{name}")
    props = got.properties
    assert props.machine_type == "n1-standard-4" and props.labels["cloudtrain-run-key"] == "abc123"
    assert props.scheduling.provisioning_model == "SPOT" and props.scheduling.preemptible
    assert props.scheduling.instance_termination_action == "DELETE"
    assert props.metadata.items[0].value == BOOTSTRAP
    assert props.shielded_instance_config.enable_secure_boot
    assert (
        name in {t.name for t in gce.templates.list(project=gce.project)} and name in gce.server.templates()
    )

    with pytest.raises(gexc.Conflict, match=f"instanceTemplates/{name}' already exists"):
        gce.template(name)
    gce.templates.delete(project=gce.project, instance_template=name).result(timeout=120)
    with pytest.raises(gexc.NotFound, match=f"global/instanceTemplates/{name}' was not found"):
        gce.templates.get(project=gce.project, instance_template=name)
    with pytest.raises(gexc.NotFound):
        gce.templates.delete(project=gce.project, instance_template=name)
    with pytest.raises(gexc.NotFound, match="global/operations/operation-nope"):
        gce.global_ops.get(project=gce.project, operation="operation-nope")


T4 = [{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 1}]
REJECTED = [
    (
        "machine type as a URL",
        {"machineType": f"zones/{ZONE}/machineTypes/n1-standard-4"},
        "properties.machineType",
    ),
    ("unknown machine type", {"machineType": "n1-standard-3"}, "'n1-standard-3' does not exist"),
    (
        "accelerator as a URL",
        {"guestAccelerators": [{**T4[0], "acceleratorType": f"zones/{ZONE}/acceleratorTypes/x"}]},
        "acceleratorType",
    ),
    ("T4 on g2", {"machineType": "g2-standard-4", "guestAccelerators": T4}, "features are not compatible"),
    (
        "run duration without an action",
        {"scheduling": {"onHostMaintenance": "TERMINATE", "maxRunDuration": {"seconds": "3600"}}},
        "Required field 'resource.properties.scheduling.instanceTerminationAction'",
    ),
    ("no boot disk", {"disks": []}, "Boot disk must be specified"),
    ("uppercase label", {"labels": {"k": "V"}}, "Label value 'V' violates format constraints"),
    (
        "two service accounts",
        {"serviceAccounts": [{"email": "a"}, {"email": "b"}]},
        "resource.properties.serviceAccounts",
    ),
    ("scope alias", {"serviceAccounts": [{"email": "default", "scopes": ["cloud-platform"]}]}, "scopes[0]"),
]


@pytest.mark.parametrize(("fields", "message"), [r[1:] for r in REJECTED], ids=[r[0] for r in REJECTED])
def test_template_rejected_like_an_instance(
    gce: Gce, unique: Callable[[str], str], fields: dict[str, Any], message: str
) -> None:
    name = unique("tpl")
    with pytest.raises(gexc.BadRequest) as info:
        gce.template(name, **fields)
    assert message in str(info.value)
    assert name not in gce.server.templates()


# --- groups: creation, size, members ----------------------------------------------------------------


def test_group_insert_errors(gce: Gce, unique: Callable[[str], str]) -> None:
    template = unique("tpl")
    gce.template(template)
    with pytest.raises(gexc.NotFound, match="global/instanceTemplates/no-such-template' was not found"):
        gce.group(unique("g"), "no-such-template", 1)
    with pytest.raises(gexc.BadRequest, match="The URL is malformed"):
        body = compute_v1.InstanceGroupManager(
            name=unique("g"), base_instance_name="w", instance_template=template, target_size=1
        )
        gce.groups.insert(project=gce.project, zone=ZONE, instance_group_manager_resource=body)
    with pytest.raises(gexc.BadRequest, match="resource.targetSize"):
        gce.group(unique("g"), template, -1)
    with pytest.raises(gexc.NotFound, match="instanceGroupManagers/nope' was not found"):
        gce.get("nope")
    with pytest.raises(gexc.NotFound):
        gce.resize("nope", 1)
    name = unique("g")
    gce.group(name, template, 0)
    with pytest.raises(gexc.Conflict):
        gce.group(name, template, 0)
    with pytest.raises(gexc.BadRequest, match="'size': '-1'"):
        gce.resize(name, -1)
    gce.drop(name, template)


def test_group_reaches_its_size_with_members_made_from_the_template(
    gce: Gce, unique: Callable[[str], str]
) -> None:
    template, group = unique("tpl"), unique("g")
    gce.template(template)
    gce.group(group, template, 3, base="worker")
    first = gce.managed(group)  # the insert's answer already has them, CREATING
    assert len(first) == 3 and {m.current_action for m in first.values()} <= {"CREATING", "NONE"}
    members = gce.running(group, 3)
    for name, entry in members.items():
        assert name.startswith("worker-") and len(name) == len("worker-") + 4
        vm = gce.vm(name)
        assert entry.id == vm.id and entry.instance == vm.self_link
        assert vm.labels["cloudtrain-managed"] == "true" and vm.labels["cloudtrain-run-key"] == "abc123"
        items = {i.key: i.value for i in vm.metadata.items}
        assert items["startup-script"] == BOOTSTRAP
        assert items["created-by"] == f"projects/{gce.project}/zones/{ZONE}/instanceGroupManagers/{group}"
        assert items["instance-template"].endswith(f"/global/instanceTemplates/{template}")
        assert vm.machine_type.endswith(f"/zones/{ZONE}/machineTypes/n1-standard-4")
        assert vm.disks[0].disk_size_gb == 50 and vm.shielded_instance_config.enable_secure_boot
    got = gce.get(group)
    assert got.target_size == 3 and got.base_instance_name == "worker" and got.status.is_stable
    assert got.current_actions.none == 3 and got.current_actions.creating == 0
    assert got.instance_template.endswith(f"/global/instanceTemplates/{template}")
    assert got.self_link.endswith(f"/zones/{ZONE}/instanceGroupManagers/{group}")
    assert group in {g.name for g in gce.groups.list(project=gce.project, zone=ZONE)}
    assert gce.server.group(ZONE, group)["targetSize"] == 3

    with pytest.raises(gexc.BadRequest) as info:  # the real API refuses while a group uses it
        gce.templates.delete(project=gce.project, instance_template=template)
    assert info.value.errors[0]["reason"] == "resourceInUseByAnotherResource"
    assert (
        f"is already being used by 'projects/{gce.project}/zones/{ZONE}/instanceGroupManagers/{group}'"
        in str(info.value)
    )
    gce.drop(group, template)


def test_resize_up_then_down_deletes_the_newest(gce: Gce, unique: Callable[[str], str]) -> None:
    template, group = unique("tpl"), unique("g")
    gce.template(template)
    gce.group(group, template, 2)
    old = set(gce.running(group, 2))
    gce.resize(group, 4)
    assert gce.get(group).target_size == 4
    new = set(gce.running(group, 4)) - old
    assert len(new) == 2
    gce.resize(group, 2)
    assert {m.current_action for n, m in gce.managed(group).items() if n in new} == {"DELETING"}
    assert set(gce.running(group, 2)) == old
    wait_for(lambda: all(gce.vm_gone(n) for n in new))
    assert (
        sum(o.target_link.endswith(f"/{group}") for o in gce.ops("compute.instanceGroupManagers.resize")) == 2
    )
    gce.drop(group, template)


def test_delete_instances_lowers_the_target_and_is_not_undone(gce: Gce, unique: Callable[[str], str]) -> None:
    template, group = unique("tpl"), unique("g")
    gce.template(template)
    gce.group(group, template, 3)
    names = sorted(gce.running(group, 3))
    leaving = names[0]
    with pytest.raises(gexc.BadRequest, match="is not a member"):
        gce.delete_instances(group, ["not-a-member"])
    gce.delete_instances(group, ["not-a-member"], skip=True)  # skipped: nothing happens
    assert gce.get(group).target_size == 3
    with pytest.raises(gexc.BadRequest, match="The URL is malformed"):
        gce.groups.delete_instances(
            project=gce.project,
            zone=ZONE,
            instance_group_manager=group,
            instance_group_managers_delete_instances_request_resource={"instances": [leaving]},
        )

    gce.delete_instances(group, [leaving])
    assert gce.get(group).target_size == 2
    assert gce.managed(group)[leaving].current_action == "DELETING"
    assert gce.vm(leaving).status in ("STOPPING", "TERMINATED")  # the guest shuts down first
    wait_for(lambda: gce.vm_gone(leaving))
    assert set(gce.running(group, 2)) == set(names[1:])
    gce.server.reconcile()  # one more pass of the group manager: nothing to make again
    assert leaving not in gce.managed(group) and gce.vm_gone(leaving)
    gce.drop(group, template)


def test_a_worker_leaves_its_group_with_one_rest_call(
    gce: Gce, unique: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker agent's ``ManagedInstanceGroup`` over ``GroupsRest`` (google-auth and one POST, no
    ``google.cloud.compute_v1`` on the VM): out of the group with the target one less, the project and
    zone from the metadata server, a second call a no-op, a throttled call tried again, a missing group
    a permanent ``NotFound``."""
    template, group = unique("tpl"), unique("g")
    gce.template(template)
    gce.group(group, template, 3)
    names = sorted(gce.running(group, 3))
    asked: list[str] = []

    def metadata(path: str) -> str:
        asked.append(path)
        return {"project/project-id": gce.project, "instance/zone": f"projects/123/zones/{ZONE}"}[path]

    monkeypatch.setattr("airflow_cloudtrain.agent.queue_pubsub._metadata", metadata)
    settings = WorkerSettings("gcp", "projects/p/subscriptions/s", "projects/p/topics/t-dlq", group=group)
    member = ManagedInstanceGroup(settings, names[0], client=GroupsRest(gce.server.endpoint))
    member.protect()  # a group of constant size never scales in: nothing to call
    gce.server.reset_counts()
    member.unprotect_and_leave()
    assert sorted(asked) == ["instance/zone", "project/project-id"]  # the settings had neither
    assert (
        gce.get(group).target_size == 2 and gce.server.counts()["instanceGroupManagers.deleteInstances"] == 1
    )
    wait_for(lambda: gce.vm_gone(names[0]), message=f"{names[0]} to be deleted")
    member.unprotect_and_leave()  # again, as a retry after a lost answer would: nothing happens
    assert gce.get(group).target_size == 2

    # throttled (429): tried again until it goes through
    second = ManagedInstanceGroup(settings, names[1], client=GroupsRest(gce.server.endpoint))
    gce.server.throttle.set(1.0, "instanceGroupManagers.deleteInstances")
    leaving = threading.Thread(target=second.unprotect_and_leave)
    try:
        leaving.start()
        wait_for(lambda: gce.server.counts().get("throttled:instanceGroupManagers.deleteInstances", 0) >= 1)
    finally:
        gce.server.throttle.clear()
    leaving.join(timeout=120)
    assert not leaving.is_alive() and gce.get(group).target_size == 1

    gone = WorkerSettings("gcp", "s", "t", group=unique("no-group"), project=gce.project, zone=ZONE)
    with pytest.raises(gexc.NotFound) as err:
        ManagedInstanceGroup(gone, names[2], client=GroupsRest(gce.server.endpoint)).unprotect_and_leave()
    assert not is_transient(err.value)
    gce.drop(group, template)


def test_recreate_instances_makes_the_vm_again_under_its_name_and_keeps_the_target(
    gce: Gce, unique: Callable[[str], str]
) -> None:
    template, group = unique("tpl"), unique("g")
    name, old_id = gce.two_members(template, group)
    with pytest.raises(gexc.BadRequest, match="is not a member"):
        gce.recreate_instances(group, ["not-a-member"])
    gce.recreate_instances(group, [name])
    assert gce.managed(group)[name].current_action == "RECREATING" and gce.get(group).target_size == 2
    wait_for(lambda: gce.vm_id(name) not in (None, old_id))  # deleted, then made again
    assert name in gce.running(group, 2) and gce.get(group).target_size == 2
    gce.drop(group, template)


# --- groups: what the cloud does to members -----------------------------------------------------------


def test_member_deleted_outside_the_group_is_recreated_with_its_name(
    gce: Gce, unique: Callable[[str], str]
) -> None:
    template, group = unique("tpl"), unique("g")
    name, old_id = gce.two_members(template, group)
    gce.instances.delete(project=gce.project, zone=ZONE, instance=name).result(timeout=120)
    seen = {gce.managed(group)[name].current_action}  # repaired: RECREATING until it runs again
    members = wait_for(lambda: (seen.add(gce.managed(group)[name].current_action), gce.running(group, 2))[1])
    assert "RECREATING" in seen
    assert name in members and gce.vm(name).id != old_id and gce.get(group).target_size == 2
    gce.drop(group, template)


def test_preempted_spot_member_is_recreated(
    gce: Gce, unique: Callable[[str], str], metadata: MetadataServer
) -> None:
    template, group = unique("tpl"), unique("g")
    name, old_id = gce.two_members(template, group, spot=True)
    assert gce.vm(name).scheduling.provisioning_model == "SPOT"
    gcp = GcpInstances(gce.server, metadata, "")
    assert gcp.knows(name) and gcp.zone_of(name) == ZONE  # members made after the side started
    assert {i["id"]: i["group"] for i in gcp.managed()}[name] == group
    gcp.notice(name, 0.1)
    gcp.reclaim(name)  # what Emulator.interrupt does
    assert gce.vm(name).status == "TERMINATED"
    assert any(o.target_link.endswith(f"/instances/{name}") for o in gce.ops("compute.instances.preempted"))
    wait_for(lambda: gce.managed(group)[name].current_action == "RECREATING")
    wait_for(lambda: gce.vm_id(name) != old_id)  # Spot with DELETE: deleted, then made again
    assert name in gce.running(group, 2) and gce.vm(name).id != old_id
    gce.drop(group, template)


def test_deleting_the_group_deletes_every_member(gce: Gce, unique: Callable[[str], str]) -> None:
    template, group = unique("tpl"), unique("g")
    gce.template(template)
    gce.group(group, template, 3)
    names = list(gce.running(group, 3))
    op = gce.groups.delete(project=gce.project, zone=ZONE, instance_group_manager=group)
    op.result(timeout=120)
    with pytest.raises(gexc.NotFound):
        gce.get(group)
    assert gce.server.group(ZONE, group) is None
    wait_for(lambda: all(gce.vm_gone(n) for n in names), message="members outlived their group")
    gce.templates.delete(project=gce.project, instance_template=template).result(timeout=120)  # unused now


def test_members_without_capacity_stay_creating(gce: Gce, unique: Callable[[str], str]) -> None:
    template, group = unique("tpl"), unique("g")
    gce.template(template, machineType="n1-standard-8")
    gce.server.fail_capacity("n1-standard-8", ZONE)
    try:
        gce.group(group, template, 1)
        entry = next(iter(gce.managed(group).values()))
        assert entry.current_action == "CREATING" and not entry.id and not entry.instance_status
        assert entry.last_attempt.errors.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
        assert not gce.get(group).status.is_stable and gce.get(group).current_actions.creating == 1
    finally:
        gce.server.clear_faults()
    gce.running(group, 1)  # the group kept trying
    gce.drop(group, template)


def test_group_calls_are_counted_and_throttled(gce: Gce, unique: Callable[[str], str]) -> None:
    template, group = unique("tpl"), unique("g")
    gce.template(template)
    gce.group(group, template, 0)
    gce.server.reset_counts()
    gce.resize(group, 0)
    gce.get(group)
    gce.server.throttle.set(1.0, "instanceGroupManagers.resize")
    try:
        with pytest.raises(gexc.TooManyRequests):
            gce.resize(group, 1)
    finally:
        gce.server.throttle.clear()
    counts = gce.server.counts()
    assert (
        counts["instanceGroupManagers.resize"] == 2 and counts["throttled:instanceGroupManagers.resize"] == 1
    )
    assert counts["instanceGroupManagers.get"] == 1 and gce.get(group).target_size == 0
    gce.drop(group, template)


# --- the instances' side: a recreated VM boots afresh -------------------------------------------------


class _Runner:
    """The parts of the emulator's InstanceRunner that the instances' side consults."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.agents: dict[str, object] = {}
        self.shutting_down: set[str] = set()
        self.machines: set[str] = set()
        self.finished: set[str] = set()


def test_recreated_member_gets_an_agent_once_the_old_machine_is_down(
    gce: Gce, unique: Callable[[str], str], metadata: MetadataServer
) -> None:
    template, group = unique("tpl"), unique("g")
    gce.template(template)
    gce.group(group, template, 1)
    (name,) = gce.running(group, 1)
    gcp, runner = GcpInstances(gce.server, metadata, ""), _Runner()
    gcp.runner = runner  # type: ignore[assignment]
    assert [s.id for s in gcp.seen() if s.id == name] == [name]
    runner.agents[name], runner.machines = object(), {name}
    old_id = gce.vm(name).id
    metadata.set_preempted(name)
    gce.instances.delete(project=gce.project, zone=ZONE, instance=name).result(timeout=120)
    wait_for(lambda: gce.vm_id(name) not in (None, old_id), message="not recreated")
    assert name not in {s.id for s in gcp.seen()}  # the old machine still runs here: held back
    del runner.agents[name]
    runner.machines.clear()
    runner.finished.add(name)
    assert name in {s.id for s in gcp.seen()} and name not in runner.finished
    path = f"/{name}/computeMetadata/v1/instance/preempted"
    assert metadata.answer("GET", path, {"metadata-flavor": "Google"})[2] == "FALSE"
    gce.drop(group, template)
