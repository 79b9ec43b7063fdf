"""The GCP half of what the instances' side sees: which Compute Engine VMs boot our agent, read from the
emulated API's state in process (``GceServer.alive``).

A VM runs an agent when its ``startup-script`` metadata item is our bootstrap (``emulator.userdata``),
whatever its labels. The cloud's own hard stop (``scheduling.maxRunDuration``) is the API server's
business (``gce_state``); a ``CT_HARD_STOP_S`` in the script is the guest powering itself off.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from airflow_cloudtrain.emulator.gcp.gce import GceServer
from airflow_cloudtrain.emulator.metadata import MetadataServer
from airflow_cloudtrain.emulator.runner import Seen
from airflow_cloudtrain.emulator.userdata import parse_bootstrap


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

    def managed(self) -> list[dict[str, Any]]:
        """Live VMs of ours (``cloudtrain-managed=true``), as ``Emulator.running_instances`` lists them."""
        from airflow_cloudtrain.runs import TAG_MANAGED

        return [
            {
                "cloud": "gcp",
                "id": i["name"],
                "instance_type": i["machine_type"],
                "zone": i["zone"],
                "spot": i["spot"],
                "group": None,
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
            if boot.hard_stop_s and time.time() >= inst["created_at"] + boot.hard_stop_s * hard_stop_scale:
                self.power_off(name)  # the runner kills the agent: the guest is off
                continue
            env = {
                "GCE_METADATA_HOST": self.metadata.gce_host_for(name),
                "STORAGE_EMULATOR_HOST": self.gcs_endpoint,
                **self.extra_env,
            }
            out.append(Seen("gcp", name, boot.run_uri, inst["machine_type"], inst["zone"], inst["spot"], env))
        return out

    def knows(self, name: str) -> bool:
        return self.zone_of(name) is not None

    def zone_of(self, name: str) -> str | None:
        if name not in self.zones:
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
