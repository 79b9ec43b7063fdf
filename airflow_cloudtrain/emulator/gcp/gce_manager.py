"""The group manager of the emulated Compute Engine: the state of instance templates and zonal managed
instance groups (MIGs), and ``reconcile``, which keeps every group at its target size as the real
manager does. The API's calls on them are ``gce_groups``.

Instances need no background thread (``gce_state`` computes their statuses from timestamps); groups
do: a group acts on its own while nobody asks it anything (a worker group runs for hours with no
client polling it), so ``reconcile`` runs on a daemon thread every ``reconcile_s`` (0.2 s) once the
server is started, and also at the end of each group request, so that the members an insert or a
resize asked for are listed (CREATING) in its answer.

What the group manager does, as the real one does:

- Members are named ``<baseInstanceName>-<4 random [a-z0-9]>`` and made from the template in the
  group's zone, with the template's labels and metadata plus the items the real API adds:
  ``created-by`` (the group as ``projects/P/zones/Z/instanceGroupManagers/G``; the real API writes the
  project number where the emulator writes the project id) and ``instance-template``. A member is
  CREATING until its VM is RUNNING, then NONE.
- A member whose VM ends other than through the group (``instances.delete``, a preemption and Spot's
  deletion after it, a guest power-off, ``instances.stop``, ``maxRunDuration``) is repaired: a
  TERMINATED VM is deleted, and ``recreate_s`` after the VM is gone the group creates it again under
  the same name (a new VM id); RECREATING meanwhile. So a worker must leave through ``deleteInstances``.
- ``resize`` down and ``deleteInstances`` delete members: STOPPING (the guest still runs), gone
  ``delete_after_s`` later, DELETING meanwhile. Resize down takes members that are not running first,
  then the newest. ``deleteInstances`` lowers ``targetSize`` by the number it deletes, so nothing
  replaces them. Deleting the group deletes every member.
- A VM the group cannot create (``fail_capacity``/``fail_quota`` faults, a machine type the zone
  lacks) leaves its member CREATING with no VM and the error in ``lastAttempt``; the group tries again
  on every reconcile, as the real one keeps trying.
"""

from __future__ import annotations

import logging
import secrets
import string
import threading
from dataclasses import dataclass, field
from typing import Any

from airflow_cloudtrain.emulator.gcp import gce_templates as tpl
from airflow_cloudtrain.emulator.gcp import gce_validate as v
from airflow_cloudtrain.emulator.gcp.gce_api import ApiError
from airflow_cloudtrain.emulator.gcp.gce_state import ComputeState, Instance

log = logging.getLogger(__name__)
ACTIONS = (
    "abandoning",
    "creating",
    "creatingWithoutRetries",
    "deleting",
    "none",
    "recreating",
    "refreshing",
    "restarting",
    "resuming",
    "starting",
    "stopping",
    "suspending",
    "verifying",
)
_SUFFIX = string.ascii_lowercase + string.digits
_ATTEMPT_CODE = {  # lastAttempt error codes for the synchronous errors an insert would have raised
    "invalid": "INVALID_FIELD_VALUE",
    "required": "REQUIRED_FIELD_MISSING",
    "badRequest": "BAD_REQUEST",
    "quotaExceeded": "QUOTA_EXCEEDED",
    "notFound": "RESOURCE_NOT_FOUND",
    "alreadyExists": "RESOURCE_ALREADY_EXISTS",
}


@dataclass
class Member:
    name: str
    created_at: float
    action: str = "CREATING"  # currentAction: CREATING, NONE, RECREATING, DELETING
    vm_id: str | None = None  # the id of the VM the group made for it, while that VM exists
    gone_since: float = 0.0  # when its VM was found gone: made again recreate_s later
    error: dict[str, Any] | None = None  # lastAttempt.errors of the last failed creation


@dataclass
class Group:
    res: dict[str, Any]  # the resource as GET shows it, less what changes (sizes, actions, status)
    zone: str
    template: str
    target: int
    members: dict[str, Member] = field(default_factory=dict)


class GroupManager(ComputeState):
    """Templates and groups, and the group manager that plays them; every method takes the lock itself."""

    def __init__(
        self,
        project: str,
        op_delay: float,
        provision_s: float,
        boot_s: float,
        delete_after_s: float,
        recreate_s: float = 1.0,
        reconcile_s: float = 0.2,
    ) -> None:
        super().__init__(project, op_delay, provision_s, boot_s, delete_after_s)
        self.recreate_s, self.reconcile_s = recreate_s, reconcile_s
        self._templates: dict[str, dict[str, Any]] = {}
        self._groups: dict[tuple[str, str], Group] = {}
        self._halt = threading.Event()
        self._manager: threading.Thread | None = None

    # --- inspection (tests) and the group manager's thread ---------------------------------------

    def templates(self) -> list[str]:
        """Names of the instance templates."""
        with self._lock:
            return sorted(self._templates)

    def group(self, zone: str, name: str) -> dict[str, Any] | None:
        """The group as ``instanceGroupManagers.get`` shows it, with ``managedInstances`` as
        ``listManagedInstances`` lists them; None if there is no such group."""
        with self._lock:
            now = self._advance()
            found = self._groups.get((zone, name))
            return (
                {**self._show_group(found), "managedInstances": self._managed(found, now)} if found else None
            )

    def start_manager(self) -> None:
        if self._manager is None:
            self._halt.clear()
            self._manager = threading.Thread(target=self._manage, name="gce-group-manager", daemon=True)
            self._manager.start()

    def stop_manager(self) -> None:
        self._halt.set()
        if self._manager is not None:
            self._manager.join(timeout=5)
            self._manager = None

    def _manage(self) -> None:
        while not self._halt.wait(self.reconcile_s):
            try:
                self.reconcile()
            except Exception:  # the groups must go on being managed whatever one pass hits
                log.exception("emulated group manager: reconcile failed")

    def reconcile(self) -> None:
        """One pass of the group manager over every group (module doc)."""
        with self._lock:
            now = self._advance()
            for group in list(self._groups.values()):
                self._reconcile(group, now)

    # --- groups: what GET and listManagedInstances show -------------------------------------------

    def _show_group(self, group: Group) -> dict[str, Any]:
        actions = dict.fromkeys(ACTIONS, 0)
        for member in group.members.values():
            actions[member.action.lower()] += 1
        stable = len(group.members) == group.target and actions["none"] == group.target
        return {
            **group.res,
            "versions": [{"instanceTemplate": group.res["instanceTemplate"]}],
            "targetSize": group.target,
            "targetStoppedSize": 0,
            "targetSuspendedSize": 0,
            "currentActions": actions,
            "status": {
                "isStable": stable,
                "versionTarget": {"isReached": True},
                "allInstancesConfig": {"effective": True},
                "stateful": {"hasStatefulConfig": False, "perInstanceConfigs": {"allEffective": True}},
            },
        }

    def _managed(self, group: Group, now: float) -> list[dict[str, Any]]:
        out = []
        for member in sorted(group.members.values(), key=lambda m: m.name):
            item: dict[str, Any] = {
                "instance": f"{group.res['zone']}/instances/{member.name}",
                "name": member.name,
                "currentAction": member.action,
                "version": {"instanceTemplate": group.res["instanceTemplate"]},
            }
            if (inst := self._vm(group, member)) is not None:
                item.update(id=inst.res["id"], instanceStatus=self._status(inst, now))
            if member.error:
                item["lastAttempt"] = {"errors": member.error}
            out.append(item)
        return out

    # --- the group manager -----------------------------------------------------------------------

    def _reconcile(self, group: Group, now: float) -> None:
        for member in list(group.members.values()):
            inst = self._vm(group, member)
            if member.action == "DELETING":
                if inst is None:
                    del group.members[member.name]
                continue
            if inst is None:
                if member.vm_id is not None:  # its VM ended outside the group: repaired
                    member.action, member.vm_id, member.gone_since = "RECREATING", None, now
                if now >= member.gone_since + self.recreate_s:
                    self._create(group, member, now)
                continue
            status = self._status(inst, now)
            if status == "TERMINATED":  # preempted, stopped or powered off: deleted, then made again
                member.action = "RECREATING"
                if inst.gone_at is None:
                    self._remove_vm(inst, now)
            elif status == "RUNNING" and member.action != "NONE":
                member.action, member.error = "NONE", None
        live = [m for m in group.members.values() if m.action != "DELETING"]
        for _ in range(group.target - len(live)):
            member = Member(self._new_name(group), now)
            group.members[member.name] = member
            self._create(group, member, now)

        def running(m: Member) -> bool:
            inst = self._vm(group, m)
            return m.action == "NONE" and inst is not None and self._status(inst, now) == "RUNNING"

        excess = len(live) - group.target
        for member in sorted(live, key=lambda m: (running(m), -m.created_at))[: max(0, excess)]:
            self._drop(group, member, now)

    def _create(self, group: Group, member: Member, now: float) -> None:
        """Make the member's VM from the template, or record why it cannot be made (lastAttempt)."""
        metadata = {
            tpl.CREATED_BY: f"projects/{self.project}/zones/{group.zone}/instanceGroupManagers/{group.res['name']}",
            tpl.INSTANCE_TEMPLATE: f"projects/{self.project}/global/instanceTemplates/{group.template}",
        }
        props = self._templates[group.template]["properties"]
        error: dict[str, Any] | None
        try:
            res, spot, items = v.build_instance(
                self.project, group.zone, tpl.instance_body(props, group.zone, member.name, metadata)
            )
            if (group.zone, member.name) in self._instances:
                path = f"projects/{self.project}/zones/{group.zone}/instances/{member.name}"
                raise ApiError(409, "alreadyExists", f"The resource '{path}' already exists")
            error = self._fault(group.zone, res["machineType"].rsplit("/", 1)[-1], res, spot)
        except ApiError as exc:
            code = _ATTEMPT_CODE.get(exc.reason, exc.reason.upper())
            error = {"error": {"errors": [{"code": code, "message": exc.message}]}}
        if error is not None:
            member.error = error["error"]
            return
        self._launch(group.zone, res, spot, items, now)
        member.vm_id, member.error = res["id"], None
        self._new_op(group.zone, "insert", res, now, done_at=now).res["user"] = self._agent()

    def _drop(self, group: Group, member: Member, now: float) -> None:
        """The group deletes this member: its VM goes (DELETING until then); without one, it is gone."""
        inst = self._vm(group, member)
        if inst is None:
            del group.members[member.name]
            return
        member.action = "DELETING"
        self._remove_vm(inst, now)

    def _remove_vm(self, inst: Instance, now: float) -> None:
        """Delete a VM as the group does: the guest shuts down, gone ``delete_after_s`` from now."""
        done = now + self.delete_after_s
        if self._status(inst, now) != "TERMINATED":
            inst.stopping_since = inst.stopping_since or now
            inst.stopped_at = min(inst.stopped_at or done, done)
        inst.gone_at = min(inst.gone_at or done, done)
        self._new_op(inst.zone, "delete", inst, now, done_at=done).res["user"] = self._agent()

    def _vm(self, group: Group, member: Member) -> Instance | None:
        """The member's VM: the instance of its name that the group made (not a stranger's)."""
        inst = self._instances.get((group.zone, member.name))
        return inst if inst is not None and inst.res["id"] == member.vm_id else None

    def _new_name(self, group: Group) -> str:
        taken = {n for z, n in self._instances if z == group.zone}
        taken |= {n for g in self._groups.values() if g.zone == group.zone for n in g.members}
        while True:
            name = f"{group.res['baseInstanceName']}-{''.join(secrets.choice(_SUFFIX) for _ in range(4))}"
            if name not in taken:
                return name

    def _agent(self) -> str:
        """Who the operations the group makes on its VMs name as their user (Google's service agent)."""
        return f"{self.project}@cloudservices.gserviceaccount.com"
