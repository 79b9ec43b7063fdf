"""The emulated Compute Engine's state: instances and operations on one clock, the faults injected, and
what the cloud does by itself (Spot preemptions, guest shutdowns, ``maxRunDuration`` expiring).

No HTTP here (``gce.py`` serves it). Statuses are computed from timestamps when read, so instances need
no background thread (managed instance groups do: ``gce_manager``): an instance is PROVISIONING for
``provision_s``, STAGING for ``boot_s``, then RUNNING; STOPPING while its guest still runs (a
preemption's grace, a stop or delete in progress); TERMINATED once stopped; gone once its deletion
completed. Each VM's first interface has its own loopback ``networkIP`` (``emulator.addresses``).
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from airflow_cloudtrain.emulator.addresses import ADDRESSES
from airflow_cloudtrain.emulator.gcp import gce_validate as v
from airflow_cloudtrain.emulator.gcp.gce_api import API, numeric_id, rfc3339

ALIVE = ("PROVISIONING", "STAGING", "RUNNING", "STOPPING")  # STOPPING: the guest still runs (grace)
GLOBAL = "global"  # the scope key of global operations (instance templates) in place of a zone
_HELP = {
    "help": {
        "links": [
            {
                "description": "Troubleshooting documentation",
                "url": "https://cloud.google.com/compute/docs/resource-error",
            }
        ]
    }
}


@dataclass
class Instance:
    res: dict[str, Any]  # the resource as GET shows it, less what time changes (status, timestamps)
    zone: str
    spot: bool
    metadata: dict[str, str]
    ready_at: float  # PROVISIONING -> STAGING
    created_at: float = field(default_factory=time.time)
    stopping_since: float | None = None
    stopped_at: float | None = None  # STOPPING -> TERMINATED
    gone_at: float | None = None  # removed from the zone (deleted)

    @property
    def run_for(self) -> float | None:
        """``scheduling.maxRunDuration`` in seconds, if it has one."""
        duration = self.res["scheduling"].get("maxRunDuration")
        return int(duration["seconds"]) + duration.get("nanos", 0) / 1e9 if duration else None


@dataclass
class Operation:
    res: dict[str, Any]
    done_at: float
    error: dict[str, Any] | None = None  # error + httpError* fields once DONE


class ComputeState:
    """Instances, operations and faults of one project; every method takes the lock itself."""

    def __init__(
        self, project: str, op_delay: float, provision_s: float, boot_s: float, delete_after_s: float
    ) -> None:
        self.project = project
        self.op_delay, self.provision_s, self.boot_s = op_delay, provision_s, boot_s
        self.delete_after_s = delete_after_s
        self.hard_stop_scale = 1.0  # tests: maxRunDuration takes this share of its seconds
        self._lock = threading.RLock()
        self._instances: dict[tuple[str, str], Instance] = {}
        self._ops: dict[tuple[str, str], Operation] = {}
        self._requests: dict[tuple[str, str, str], str] = {}  # (zone, method, requestId) -> op name
        self._capacity: set[tuple[str, str | None]] = set()
        self._capacity_after: dict[tuple[str, str | None], int] = {}  # inserts still let through
        self._quota: dict[tuple[str | None, str | None], tuple[str | None, bool]] = {}

    # --- the testing / cloud-side API ------------------------------------------------------------

    def fail_capacity(self, machine_type: str, zone: str | None = None, after: int = 0) -> None:
        """From now on inserts of this type (in this zone, or anywhere) end in ZONE_RESOURCE_POOL_EXHAUSTED;
        with ``after`` the next that many inserts still get a VM first (a zone with room for N)."""
        with self._lock:
            self._capacity.add((machine_type, zone))
            self._capacity_after[(machine_type, zone)] = int(after)

    def _capacity_left(self, mtype: str, zone: str | None) -> bool:
        """Is this insert refused for capacity? (one of the inserts ``after`` lets through is used up)"""
        with self._lock:
            keys = [k for k in ((mtype, zone), (mtype, None)) if k in self._capacity]
            if not keys:
                return False
            if self._capacity_after.get(keys[0], 0) > 0:
                self._capacity_after[keys[0]] -= 1
                return False
            return True

    def fail_quota(
        self,
        machine_type: str | None = None,
        zone: str | None = None,
        metric: str | None = None,
        synchronous: bool = False,
    ) -> None:
        """Inserts (of this type / in this zone; None = any) exceed a quota: QUOTA_EXCEEDED in the
        operation, or with ``synchronous`` an HTTP 403 ``quotaExceeded`` on the insert itself."""
        with self._lock:
            self._quota[(machine_type, zone)] = (metric, synchronous)

    def clear_faults(self) -> None:
        with self._lock:
            self._capacity.clear()
            self._capacity_after.clear()
            self._quota.clear()

    def alive(self) -> list[dict[str, Any]]:
        """Every instance whose guest runs (PROVISIONING/STAGING/RUNNING, and STOPPING: a preemption's
        grace period or a stop/delete in progress), ours or not (``labels`` tell), for the runner."""
        with self._lock:
            now = self._advance()
            return [
                {
                    "name": i.res["name"],
                    "id": i.res["id"],
                    "zone": i.zone,
                    "status": self._status(i, now),
                    "labels": dict(i.res.get("labels", {})),
                    "created_at": i.created_at,
                    "machine_type": i.res["machineType"].rsplit("/", 1)[-1],
                    "spot": i.spot,
                    "metadata": dict(i.metadata),
                    "network_ip": i.res["networkInterfaces"][0]["networkIP"],
                }
                for i in self._instances.values()
                if self._status(i, now) in ALIVE
            ]

    def instance(self, zone: str, name: str) -> dict[str, Any] | None:
        """The instance as ``instances.get`` shows it, or None."""
        with self._lock:
            now = self._advance()
            inst = self._instances.get((zone, name))
            return self._show(inst, now) if inst else None

    def preempt(self, zone: str, name: str, grace_s: float = 0.0) -> None:
        """Compute Engine reclaims a Spot VM: a ``compute.instances.preempted`` event now, STOPPING for
        ``grace_s`` (real: up to 30 s of ACPI soft-off for the guest), then TERMINATED, and deleted
        ``delete_after_s`` later when its termination action is DELETE."""
        with self._lock:
            inst = self._end(zone, name, "compute.instances.preempted", "Instance was preempted.", grace_s)
            if inst.res["scheduling"].get("instanceTerminationAction") == "DELETE":
                inst.gone_at = inst.stopped_at + self.delete_after_s  # type: ignore[operator]

    def shutdown(self, zone: str, name: str) -> None:
        """The guest powered off: TERMINATED (kept, whatever the termination action), not preempted."""
        with self._lock:
            self._end(zone, name, "compute.instances.guestTerminate", "", 0.0)

    def _end(self, zone: str, name: str, event: str, message: str, grace_s: float) -> Instance:
        now = self._advance()
        inst = self._instances.get((zone, name))
        if inst is None or self._status(inst, now) == "TERMINATED":
            raise KeyError(f"no live instance {name} in {zone}")
        inst.stopping_since, inst.stopped_at = inst.stopping_since or now, now + grace_s
        op = self._new_op(zone, event, inst, now, done_at=now, name_prefix="systemevent")
        op.res.update({"user": "system", **({"statusMessage": message} if message else {})})
        return inst

    # --- the clock -------------------------------------------------------------------------------

    def _advance(self) -> float:
        """Play what time does (maxRunDuration running out), drop instances whose deletion has
        completed; the clock every state is computed from."""
        now = time.time()
        for inst in self._instances.values():
            run_for = inst.run_for
            if run_for is None or inst.stopped_at is not None:
                continue
            due = inst.created_at + run_for * self.hard_stop_scale
            if now >= due:  # the cloud's hard stop: STOP -> TERMINATED, DELETE -> gone
                inst.stopping_since = inst.stopped_at = due
                if inst.res["scheduling"].get("instanceTerminationAction") == "DELETE":
                    inst.gone_at = due
        for key in [k for k, i in self._instances.items() if i.gone_at is not None and i.gone_at <= now]:
            del self._instances[key]
        return now

    def _status(self, inst: Instance, now: float) -> str:
        if inst.stopped_at is not None and now >= inst.stopped_at:
            return "TERMINATED"
        if inst.stopping_since is not None:
            return "STOPPING"
        if now < inst.ready_at:
            return "PROVISIONING"
        return "STAGING" if now < inst.ready_at + self.boot_s else "RUNNING"

    def _show(self, inst: Instance, now: float) -> dict[str, Any]:
        status = self._status(inst, now)
        out = {**inst.res, "status": status}
        if now >= inst.ready_at + self.boot_s:
            out["lastStartTimestamp"] = rfc3339(inst.ready_at + self.boot_s)
        if status == "TERMINATED":
            out["lastStopTimestamp"] = rfc3339(inst.stopped_at)  # type: ignore[arg-type]
        return out

    def _new_op(
        self,
        zone: str,
        kind: str,
        inst: Instance | dict[str, Any],
        now: float,
        done_at: float,
        name_prefix: str = "operation",
    ) -> Operation:
        """A new operation in ``zone``'s list, or with ``zone`` GLOBAL a global one (no ``zone`` field)."""
        res = inst.res if isinstance(inst, Instance) else inst
        name = f"{name_prefix}-{int(now * 1000)}-{secrets.token_hex(7)[:13]}-{secrets.token_hex(4)}-{secrets.token_hex(4)}"
        link = f"{API}/projects/{self.project}/" + (GLOBAL if zone == GLOBAL else f"zones/{zone}")
        op = Operation(
            {
                "kind": "compute#operation",
                "id": numeric_id(),
                "name": name,
                **({} if zone == GLOBAL else {"zone": link}),
                "operationType": kind,
                "targetLink": res["selfLink"],
                "targetId": res["id"],
                "user": "cloudtrain-emulator@example.iam.gserviceaccount.com",
                "insertTime": rfc3339(now),
                "startTime": rfc3339(now),
                "selfLink": f"{link}/operations/{name}",
            },
            done_at,
        )
        self._ops[(zone, name)] = op
        return op

    def _show_op(self, op: Operation, now: float) -> dict[str, Any]:
        if now < op.done_at:
            return {**op.res, "status": "RUNNING", "progress": 0}
        return {
            **op.res,
            "status": "DONE",
            "progress": 100,
            "endTime": rfc3339(op.done_at),
            **(op.error or {}),
        }

    # --- mutations the API makes -----------------------------------------------------------------

    def _replay(self, zone: str, method: str, request_id: str | None) -> dict[str, Any] | None:
        """The operation this requestId already started (same id, same op, nothing done twice)."""
        v.check_request_id(request_id)
        name = self._requests.get((zone, method, request_id)) if request_id else None
        return self._show_op(self._ops[(zone, name)], time.time()) if name else None

    def _insert(self, zone: str, body: dict[str, Any], request_id: str | None) -> dict[str, Any]:
        with self._lock:
            replay = self._replay(zone, "insert", request_id)
            if replay:
                return replay
            now = self._advance()
            res, spot, metadata = v.build_instance(self.project, zone, body)
            if (zone, res["name"]) in self._instances:
                raise v.ApiError(
                    409,
                    "alreadyExists",
                    f"The resource 'projects/{self.project}/zones/{zone}/"
                    f"instances/{res['name']}' already exists",
                )
            error = self._fault(zone, res["machineType"].rsplit("/", 1)[-1], res, spot)
            op = self._new_op(zone, "insert", res, now, done_at=now + self.op_delay)
            if error:
                op.error = error
            else:
                self._launch(zone, res, spot, metadata, now)
            if request_id:
                self._requests[(zone, "insert", request_id)] = op.res["name"]
            return self._show_op(op, now)

    def _launch(
        self, zone: str, res: dict[str, Any], spot: bool, metadata: dict[str, str], now: float
    ) -> Instance:
        """The VM exists from now on: PROVISIONING, then STAGING and RUNNING on the clock."""
        inst = Instance(res, zone, spot, metadata, now + self.provision_s, now)
        # its own loopback address (``emulator.addresses``), held until the VM is gone
        res["networkInterfaces"][0]["networkIP"] = ADDRESSES.take(
            lambda: inst.gone_at is None or time.time() < inst.gone_at
        )
        self._instances[(zone, res["name"])] = inst
        return inst

    def _fault(self, zone: str, mtype: str, res: dict[str, Any], spot: bool) -> dict[str, Any] | None:
        """The injected failure for this insert: an operation error, None, or an HTTP 403 raised."""
        quota = next(
            (q for (t, z), q in self._quota.items() if t in (None, mtype) and z in (None, zone)), None
        )
        if quota:
            metric, synchronous = quota
            if metric is None:
                gpus = res.get("guestAccelerators", [])
                gpu = v.GPU_OF_TYPE.get(gpus[0]["acceleratorType"].rsplit("/", 1)[-1], "") if gpus else ""
                metric = f"NVIDIA_{gpu.replace('-', '_')}_GPUS" if gpu else "CPUS"
                metric = f"PREEMPTIBLE_{metric}" if spot else metric
            message = f"Quota '{metric}' exceeded.  Limit: 0.0 in region {v.catalog().zones[zone]}."
            if synchronous:
                raise v.ApiError(403, "quotaExceeded", message)
            return {
                "error": {
                    "errors": [{"code": "QUOTA_EXCEEDED", "message": message, "errorDetails": [_HELP]}]
                },
                "httpErrorStatusCode": 403,
                "httpErrorMessage": "FORBIDDEN",
            }
        if self._capacity_left(mtype, zone):
            message = (
                f"The zone 'projects/{self.project}/zones/{zone}' does not have enough resources available "
                "to fulfill the request.  Try a different zone, or try again later."
            )
            local = {"localizedMessage": {"locale": "en-US", "message": message}}
            return {
                "error": {
                    "errors": [
                        {
                            "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                            "message": message,
                            "errorDetails": [_HELP, local],
                        }
                    ]
                },
                "httpErrorStatusCode": 503,
                "httpErrorMessage": "SERVICE UNAVAILABLE",
            }
        return None

    def _stop_or_delete(self, zone: str, name: str, kind: str, request_id: str | None) -> dict[str, Any]:
        with self._lock:
            replay = self._replay(zone, kind, request_id)
            if replay:
                return replay
            now = self._advance()
            inst = self._get_instance(zone, name)
            op = self._new_op(zone, kind, inst, now, done_at=now + self.op_delay)
            if self._status(inst, now) != "TERMINATED":
                inst.stopping_since = inst.stopping_since or now
                inst.stopped_at = min(inst.stopped_at or op.done_at, op.done_at)
            if kind == "delete":
                inst.gone_at = min(inst.gone_at or op.done_at, op.done_at)
            if request_id:
                self._requests[(zone, kind, request_id)] = op.res["name"]
            return self._show_op(op, now)

    def _get_instance(self, zone: str, name: str) -> Instance:
        inst = self._instances.get((zone, name))
        if inst is None:
            raise v.not_found(f"projects/{self.project}/zones/{zone}/instances/{name}")
        return inst

    def _wait_op(self, zone: str, op: str) -> dict[str, Any]:
        """Like the real ``wait``: returns when the operation is DONE or after two minutes at most."""
        with self._lock:
            done_at = self._get_op(zone, op).done_at
        time.sleep(max(0.0, min(done_at - time.time(), 120.0)))
        with self._lock:
            return self._show_op(self._get_op(zone, op), time.time())

    def _get_op(self, zone: str, op: str) -> Operation:
        found = self._ops.get((zone, op))
        if found is None:
            scope = GLOBAL if zone == GLOBAL else f"zones/{zone}"
            raise v.not_found(f"projects/{self.project}/{scope}/operations/{op}")
        return found
