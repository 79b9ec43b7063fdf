"""The GCP half of what the instances' side sees: which Compute Engine VMs boot our agent, read from the
emulated API's state in process (``GceServer.alive``).

A VM runs an agent when its ``startup-script`` metadata item is our bootstrap (``emulator.userdata``),
whatever its labels. The cloud's own hard stop (``scheduling.maxRunDuration``) is the API server's
business (``gce_state``); a ``CT_HARD_STOP_S`` in the script is the guest powering itself off.

Managed instance groups (``gce_manager``) make their members like any VM, so a member's agent starts
the same way; ``managed()`` names its group (from the ``created-by`` metadata item the group gives it).
A group also recreates a VM under the name of one that ended (a preempted or deleted member): the
runner knows agents by VM name, so the new VM is held back from ``seen`` until the runner has let go
of the old machine (no agent, not shutting down, its processes gone), then the runner is told to
forget that the name finished and the old VM's metadata notices are cleared: the new VM boots afresh.
That needs ``runner`` (the Emulator's ``InstanceRunner``); without it a recreated VM gets no agent.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.emulator.gcp.gce import GceServer
from airflow_cloudtrain.emulator.metadata import MetadataServer
from airflow_cloudtrain.emulator.runner import Seen
from airflow_cloudtrain.emulator.userdata import parse_bootstrap

if TYPE_CHECKING:
    from airflow_cloudtrain.emulator.runner import InstanceRunner


def group_of(metadata: dict[str, str]) -> str | None:
    """The managed instance group a VM belongs to, from the ``created-by`` item its group gave it
    (``projects/P/zones/Z/instanceGroupManagers/G``); None for any other VM."""
    created_by = metadata.get("created-by") or ""
    path, _, name = created_by.rpartition("/")
    return name if path.endswith("/instanceGroupManagers") and name else None


class GcpInstances:
    def __init__(
        self,
        gce: GceServer,
        metadata: MetadataServer,
        gcs_endpoint: str,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.gce, self.metadata, self.gcs_endpoint = gce, metadata, gcs_endpoint
        self.extra_env = dict(extra_env or {})  # more of the emulated image's environment (endpoints)
        self.zones: dict[str, str] = {}  # instance name -> zone
        self.runner: InstanceRunner | None = None  # set by the Emulator: lets recreated VMs get an agent
        self.incarnations: dict[str, str] = {}  # VM name -> id of the VM the runner was shown by that name

    def managed(self) -> list[dict[str, Any]]:
        """Live VMs of ours (``cloudtrain-managed=true``), as ``Emulator.running_instances`` lists them;
        ``group``: the managed instance group of a member, None otherwise."""
        from airflow_cloudtrain.contract.runs import TAG_MANAGED

        return [
            {
                "cloud": "gcp",
                "id": i["name"],
                "instance_type": i["machine_type"],
                "zone": i["zone"],
                "spot": i["spot"],
                "group": group_of(i["metadata"]),
            }
            for i in self.gce.alive()
            if i["labels"].get(TAG_MANAGED) == "true"
        ]

    def seen(self, hard_stop_scale: float = 1.0) -> list[Seen]:
        """VMs whose agent should run now; powers off those whose script's hard stop has come."""
        out = []
        for inst in self.gce.alive():
            name = inst["name"]
            self.zones[name] = inst["zone"]
            boot = parse_bootstrap(inst["metadata"].get("startup-script"))
            if boot is None:
                continue  # not our bootstrap: nothing would start an agent there
            if not self._fresh(name, inst["id"]):
                continue  # a recreated VM: shown once the runner has let go of the old one
            if boot.hard_stop_s and time.time() >= inst["created_at"] + boot.hard_stop_s * hard_stop_scale:
                self.power_off(name)  # the runner kills the agent: the guest is off
                continue
            self.metadata.describe_vm(name, inst.get("project") or self.gce.project, inst["zone"])
            self.metadata.set_address(name, inst.get("network_ip"))  # network-interfaces/0/ip
            env = {
                "GCE_METADATA_HOST": self.metadata.gce_host_for(name),
                "STORAGE_EMULATOR_HOST": self.gcs_endpoint,
                **self.extra_env,
            }
            out.append(Seen("gcp", name, boot.run_uri, inst["machine_type"], inst["zone"], inst["spot"], env))
        return out

    def _fresh(self, name: str, vm_id: str) -> bool:
        """Whether the runner may be shown this VM now: yes for the first VM of a name; for a later one
        (a group recreated it) only once the runner is done with the earlier machine (module doc)."""
        if self.incarnations.get(name, vm_id) == vm_id:
            self.incarnations[name] = vm_id
            return True
        runner = self.runner
        if runner is None:
            return False
        with runner.lock:
            if name in runner.agents or name in runner.shutting_down or name in runner.machines:
                return False
            runner.finished.discard(name)
        self.metadata.clear(name)  # the old VM's preemption notice is not the new one's
        self.incarnations[name] = vm_id
        return True

    def knows(self, name: str) -> bool:
        return self.zone_of(name) is not None

    def zone_of(self, name: str) -> str | None:
        """The zone of the live VM of that name, else where one of that name was last seen. Looked up
        afresh: groups create VMs at any time, and may recreate a name."""
        self.zones.update({i["name"]: i["zone"] for i in self.gce.alive()})
        return self.zones.get(name)

    def power_off(self, name: str) -> None:
        """The guest shut down: TERMINATED (kept, whatever the termination action)."""
        with contextlib.suppress(KeyError):  # already gone (deleted by the operator, preempted)
            self.gce.shutdown(self.zone_of(name) or "", name)

    def notice(self, name: str, notice_s: float) -> None:
        self.metadata.set_preempted(name)

    def reclaim(self, name: str) -> None:
        with contextlib.suppress(KeyError):  # gone before the notice ran out
            self.gce.preempt(self.zone_of(name) or "", name)
