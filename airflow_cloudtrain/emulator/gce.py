"""The emulated Compute Engine: a local HTTP server speaking the Compute v1 REST subset we use.

The real ``google-cloud-compute`` clients talk to it unchanged. An ``http://`` ``api_endpoint`` works
as is (the REST transport keeps an explicit scheme; ``url_scheme`` only matters for a bare host)::

    server = GceServer(); endpoint = server.start()          # "http://127.0.0.1:PORT"
    client = compute_v1.InstancesClient(credentials=AnonymousCredentials(),
                                        client_options={"api_endpoint": endpoint})
    # == compute_v1.InstancesClient(**compute_client_kwargs(endpoint)); the same for
    # ZoneOperationsClient, ZonesClient, MachineTypesClient and AcceleratorTypesClient.

What is mimicked, and why (the product's control plane must meet the answers it meets in production):

* ``instances.insert`` is validated as the real API validates it (``gce_validate``): synchronous
  errors in Google's JSON shape (400 invalid/required/badRequest, 404 notFound, 409 alreadyExists).
  An unknown zone on a zonal call is 400 "Unknown zone." as on the real API; ``zones.get`` of an
  unknown zone and any unknown project are 404.
* Mutating calls return a ``compute#operation``, RUNNING for ``op_delay`` seconds, then DONE (``get``,
  ``wait``, ``list``); a replayed ``requestId`` returns the same operation and does nothing twice.
  ``op_delay`` defaults to 0 (DONE in the first answer) because of a client-library limitation: the
  ``ExtendedOperation`` that ``InstancesClient.insert/delete/stop`` return polls through a
  ZoneOperationsClient that the transport builds *without* the client's ``client_options``, i.e.
  against compute.googleapis.com; ``.result()`` works against an emulator only when the first answer
  is DONE. Code that polls with its own ``ZoneOperationsClient(...).get/wait`` works with any delay.
* Capacity stockouts are not HTTP errors: the insert is accepted and its operation ends DONE with
  ``error.errors[0].code`` ZONE_RESOURCE_POOL_EXHAUSTED and ``httpErrorStatusCode`` 503 "SERVICE
  UNAVAILABLE" (``insert(...).result()`` raises ``ServiceUnavailable``); no instance remains. Quota
  faults end the same way with QUOTA_EXCEEDED and 403 "FORBIDDEN" (``Forbidden``), or, with
  ``fail_quota(synchronous=True)``, fail the insert itself with HTTP 403 reason ``quotaExceeded``:
  the real API does both, depending on the quota.
* Instances are PROVISIONING for ``provision_s``, STAGING for ``boot_s``, then RUNNING. A preemption
  records a system-event operation of type ``compute.instances.preempted`` in the zone's operations
  (the signal the real API exposes: ``operations list --filter=operationType=compute.instances.
  preempted``), leaves the instance STOPPING for ``grace_s`` and then TERMINATED, and with
  ``instanceTerminationAction: DELETE`` deletes it ``delete_after_s`` later, as Spot VMs are. A guest
  power-off leaves it TERMINATED with a ``compute.instances.guestTerminate`` event.
* Requests are counted per API method (``instances.list``, ...), except those whose user agent
  carries ``cloudtrain-emulator``: the emulator's own polling. The REST transport sends
  ``gapic_v1.client_info.ClientInfo(user_agent=...)`` in ``x-goog-api-client`` (``User-Agent`` stays
  python-requests'), so both headers are read.

Timestamps are RFC 3339 with a -07:00 offset, as the real API writes them (Pacific time, never "Z").
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from airflow_cloudtrain.emulator import gce_validate as v
from airflow_cloudtrain.emulator.gce_validate import API, numeric_id, rfc3339
from airflow_cloudtrain.emulator.serving import InThread

EMULATOR_USER_AGENT = "cloudtrain-emulator"
_ALIVE = ("PROVISIONING", "STAGING", "RUNNING", "STOPPING")  # STOPPING: the guest still runs (grace)
_HELP = {"help": {"links": [{"description": "Troubleshooting documentation",
                             "url": "https://cloud.google.com/compute/docs/resource-error"}]}}  # fmt: skip


def compute_client_kwargs(endpoint: str) -> dict[str, Any]:
    """Keyword arguments that point any ``google.cloud.compute_v1`` client at the emulator."""
    from google.auth.credentials import AnonymousCredentials

    return {"credentials": AnonymousCredentials(), "client_options": {"api_endpoint": endpoint}}


@dataclass
class _Instance:
    res: dict[str, Any]  # the resource as GET shows it, less what time changes (status, timestamps)
    zone: str
    spot: bool
    metadata: dict[str, str]
    ready_at: float  # PROVISIONING -> STAGING
    stopping_since: float | None = None
    stopped_at: float | None = None  # STOPPING -> TERMINATED
    gone_at: float | None = None  # removed from the zone (deleted)


@dataclass
class _Operation:
    res: dict[str, Any]
    done_at: float
    error: dict[str, Any] | None = None  # error + httpError* fields once DONE


class GceServer:
    """Compute Engine v1 REST subset on 127.0.0.1 (random port) in a daemon thread; see the module doc."""

    def __init__(self, project: str = "cloudtrain-emulated", op_delay: float = 0.0, provision_s: float = 0.1,
                 boot_s: float = 0.1, delete_after_s: float = 0.5) -> None:  # fmt: skip
        self.project = project
        self.op_delay, self.provision_s, self.boot_s = op_delay, provision_s, boot_s
        self.delete_after_s = delete_after_s
        self.endpoint = ""
        self._lock = threading.RLock()
        self._instances: dict[tuple[str, str], _Instance] = {}
        self._ops: dict[tuple[str, str], _Operation] = {}
        self._requests: dict[tuple[str, str, str], str] = {}  # (zone, method, requestId) -> op name
        self._capacity: set[tuple[str, str | None]] = set()
        self._quota: dict[tuple[str | None, str | None], tuple[str | None, bool]] = {}
        self._counts: Counter[str] = Counter()
        self._serving: InThread | None = None
        p = "/compute/v1/projects/<project>"
        z = f"{p}/zones/<zone>"
        self._routes = Map([
            Rule(f"{p}/zones", endpoint="zones.list", methods=["GET"]),
            Rule(z, endpoint="zones.get", methods=["GET"]),
            Rule(f"{z}/instances", endpoint="instances.list", methods=["GET"]),
            Rule(f"{z}/instances", endpoint="instances.insert", methods=["POST"]),
            Rule(f"{z}/instances/<name>", endpoint="instances.get", methods=["GET"]),
            Rule(f"{z}/instances/<name>", endpoint="instances.delete", methods=["DELETE"]),
            Rule(f"{z}/instances/<name>/stop", endpoint="instances.stop", methods=["POST"]),
            Rule(f"{p}/aggregated/instances", endpoint="instances.aggregatedList", methods=["GET"]),
            Rule(f"{z}/operations", endpoint="zoneOperations.list", methods=["GET"]),
            Rule(f"{z}/operations/<op>", endpoint="zoneOperations.get", methods=["GET"]),
            Rule(f"{z}/operations/<op>/wait", endpoint="zoneOperations.wait", methods=["POST"]),
            Rule(f"{p}/aggregated/operations", endpoint="globalOperations.aggregatedList", methods=["GET"]),
            Rule(f"{z}/machineTypes", endpoint="machineTypes.list", methods=["GET"]),
            Rule(f"{z}/machineTypes/<name>", endpoint="machineTypes.get", methods=["GET"]),
            Rule(f"{z}/acceleratorTypes", endpoint="acceleratorTypes.list", methods=["GET"]),
            Rule(f"{z}/acceleratorTypes/<name>", endpoint="acceleratorTypes.get", methods=["GET"]),
        ])  # fmt: skip

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> str:
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request drowns the task log
        self._serving = InThread(make_server("127.0.0.1", 0, self._wsgi, threaded=True), "gce-emulator")
        self.endpoint = self._serving.endpoint
        return self.endpoint

    def stop(self) -> None:
        if self._serving is not None:
            self._serving.stop()
            self._serving = None

    # --- the testing / cloud-side API ------------------------------------------------------------

    def fail_capacity(self, machine_type: str, zone: str | None = None) -> None:
        """From now on inserts of this type (in this zone, or anywhere) end in ZONE_RESOURCE_POOL_EXHAUSTED."""
        with self._lock:
            self._capacity.add((machine_type, zone))

    def fail_quota(self, machine_type: str | None = None, zone: str | None = None, metric: str | None = None,
                   synchronous: bool = False) -> None:  # fmt: skip
        """Inserts (of this type / in this zone; None = any) exceed a quota: QUOTA_EXCEEDED in the
        operation, or with ``synchronous`` an HTTP 403 ``quotaExceeded`` on the insert itself."""
        with self._lock:
            self._quota[(machine_type, zone)] = (metric, synchronous)

    def clear_faults(self) -> None:
        with self._lock:
            self._capacity.clear()
            self._quota.clear()

    def counts(self) -> dict[str, int]:
        """Requests per API method (``instances.list``, ...) since start or reset, the emulator's excluded."""
        with self._lock:
            return dict(self._counts)

    def reset_counts(self) -> None:
        with self._lock:
            self._counts.clear()

    def alive(self) -> list[dict[str, Any]]:
        """Every instance whose guest runs (PROVISIONING/STAGING/RUNNING, and STOPPING: a preemption's
        grace period or a stop/delete in progress), ours or not (``labels`` tell), for the runner."""
        with self._lock:
            now = self._advance()
            return [
                {"name": i.res["name"], "id": i.res["id"], "zone": i.zone, "status": self._status(i, now),
                 "labels": dict(i.res.get("labels", {})),
                 "machine_type": i.res["machineType"].rsplit("/", 1)[-1], "spot": i.spot,
                 "metadata": dict(i.metadata)}
                for i in self._instances.values() if self._status(i, now) in _ALIVE
            ]  # fmt: skip

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

    def _end(self, zone: str, name: str, event: str, message: str, grace_s: float) -> _Instance:
        now = self._advance()
        inst = self._instances.get((zone, name))
        if inst is None or self._status(inst, now) == "TERMINATED":
            raise KeyError(f"no live instance {name} in {zone}")
        inst.stopping_since, inst.stopped_at = inst.stopping_since or now, now + grace_s
        op = self._new_op(zone, event, inst, now, done_at=now, name_prefix="systemevent")
        op.res.update({"user": "system", **({"statusMessage": message} if message else {})})
        return inst

    # --- state -----------------------------------------------------------------------------------

    def _advance(self) -> float:
        """Drop instances whose deletion has completed; the clock every state is computed from."""
        now = time.time()
        for key in [k for k, i in self._instances.items() if i.gone_at is not None and i.gone_at <= now]:
            del self._instances[key]
        return now

    def _status(self, inst: _Instance, now: float) -> str:
        if inst.stopped_at is not None and now >= inst.stopped_at:
            return "TERMINATED"
        if inst.stopping_since is not None:
            return "STOPPING"
        if now < inst.ready_at:
            return "PROVISIONING"
        return "STAGING" if now < inst.ready_at + self.boot_s else "RUNNING"

    def _show(self, inst: _Instance, now: float) -> dict[str, Any]:
        status = self._status(inst, now)
        out = {**inst.res, "status": status}
        if now >= inst.ready_at + self.boot_s:
            out["lastStartTimestamp"] = rfc3339(inst.ready_at + self.boot_s)
        if status == "TERMINATED":
            out["lastStopTimestamp"] = rfc3339(inst.stopped_at)  # type: ignore[arg-type]
        return out

    def _new_op(self, zone: str, kind: str, inst: _Instance | dict[str, Any], now: float, done_at: float,
                name_prefix: str = "operation") -> _Operation:  # fmt: skip
        res = inst.res if isinstance(inst, _Instance) else inst
        name = f"{name_prefix}-{int(now * 1000)}-{secrets.token_hex(7)[:13]}-{secrets.token_hex(4)}-{secrets.token_hex(4)}"
        link = f"{API}/projects/{self.project}/zones/{zone}"
        op = _Operation({"kind": "compute#operation", "id": numeric_id(), "name": name, "zone": link,
                         "operationType": kind, "targetLink": res["selfLink"], "targetId": res["id"],
                         "user": "cloudtrain-emulator@example.iam.gserviceaccount.com", "insertTime": rfc3339(now),
                         "startTime": rfc3339(now), "selfLink": f"{link}/operations/{name}"}, done_at)  # fmt: skip
        self._ops[(zone, name)] = op
        return op

    def _show_op(self, op: _Operation, now: float) -> dict[str, Any]:
        if now < op.done_at:
            return {**op.res, "status": "RUNNING", "progress": 0}
        return {
            **op.res,
            "status": "DONE",
            "progress": 100,
            "endTime": rfc3339(op.done_at),
            **(op.error or {}),
        }

    # --- HTTP ------------------------------------------------------------------------------------

    def _wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        try:
            endpoint, args = self._routes.bind_to_environ(environ).match()
            agent = request.headers.get("User-Agent", "") + request.headers.get("x-goog-api-client", "")
            if EMULATOR_USER_AGENT not in agent:
                with self._lock:
                    self._counts[endpoint] += 1
            if (project := args.pop("project")) != self.project:
                raise v.not_found(f"projects/{project}")
            if "zone" in args and args["zone"] not in v.catalog().zones:
                if endpoint == "zones.get":
                    raise v.not_found(f"projects/{self.project}/zones/{args['zone']}")
                raise v.invalid("zone", args["zone"], "Unknown zone.")
            handler = getattr(self, "_h_" + endpoint.replace(".", "_"))
            status, body = 200, handler(request, **args)
        except v.ApiError as exc:
            status, body = exc.code, exc.body()
        except HTTPException as exc:
            status, body = (
                exc.code or 404,
                v.ApiError(exc.code or 404, "notFound", exc.description or "").body(),
            )
        payload = json.dumps(body).encode()
        return Response(payload, status, content_type="application/json; charset=UTF-8")(
            environ, start_response
        )

    def _list(self, kind: str, self_link: str, items: list[dict[str, Any]], req: Request) -> dict[str, Any]:
        items = sorted(filter(v.compile_filter(req.args.get("filter")), items), key=lambda r: r["name"])
        chunk, token = v.page(items, req.args.get("maxResults"), req.args.get("pageToken"))
        out: dict[str, Any] = {
            "kind": kind,
            "id": self_link.split("/compute/v1/", 1)[-1],
            "selfLink": self_link,
        }
        if chunk:
            out["items"] = chunk
        if token:
            out["nextPageToken"] = token
        return out

    def _aggregated(
        self, kind: str, key: str, per_zone: dict[str, list[dict[str, Any]]], req: Request
    ) -> dict[str, Any]:
        predicate = v.compile_filter(req.args.get("filter"))
        flat = [
            (z, r)
            for z in sorted(per_zone)
            for r in sorted(per_zone[z], key=lambda r: r["name"])
            if predicate(r)
        ]
        chunk, token = v.page(flat, req.args.get("maxResults"), req.args.get("pageToken"))
        items: dict[str, Any] = {}
        for zone in sorted(v.catalog().zones):
            found = [r for z, r in chunk if z == zone]
            scope = f"zones/{zone}"
            items[scope] = {key: found} if found else {"warning": {
                "code": "NO_RESULTS_ON_PAGE", "message": f"There are no results for scope '{scope}' on this page.",
                "data": [{"key": "scope", "value": scope}]}}  # fmt: skip
        link = f"{API}/projects/{self.project}/aggregated/{key}"
        out = {
            "kind": kind,
            "id": f"projects/{self.project}/aggregated/{key}",
            "items": items,
            "selfLink": link,
        }
        return {**out, "nextPageToken": token} if token else out

    def _replay(self, req: Request, zone: str, method: str) -> tuple[str | None, dict[str, Any] | None]:
        """The requestId, and the operation it already started (same id, same op, nothing done twice)."""
        request_id = req.args.get("requestId")
        v.check_request_id(request_id)
        name = self._requests.get((zone, method, request_id)) if request_id else None
        return request_id, self._show_op(self._ops[(zone, name)], time.time()) if name else None

    # --- handlers: one per API method (the route endpoint name) ------------------------------------

    def _h_instances_insert(self, req: Request, zone: str) -> dict[str, Any]:
        body = req.get_json(force=True, silent=True) or {}
        with self._lock:
            request_id, replay = self._replay(req, zone, "insert")
            if replay:
                return replay
            now = self._advance()
            res, spot, metadata = v.build_instance(self.project, zone, body)
            if (zone, res["name"]) in self._instances:
                raise v.ApiError(409, "alreadyExists", f"The resource 'projects/{self.project}/zones/{zone}/"
                                 f"instances/{res['name']}' already exists")  # fmt: skip
            mtype = res["machineType"].rsplit("/", 1)[-1]
            error = self._fault(zone, mtype, res, spot)
            op = self._new_op(zone, "insert", res, now, done_at=now + self.op_delay)
            if error:
                op.error = error
            else:
                self._instances[(zone, res["name"])] = _Instance(
                    res, zone, spot, metadata, now + self.provision_s
                )
            if request_id:
                self._requests[(zone, "insert", request_id)] = op.res["name"]
            return self._show_op(op, now)

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
            return {"error": {"errors": [{"code": "QUOTA_EXCEEDED", "message": message, "errorDetails": [_HELP]}]},
                    "httpErrorStatusCode": 403, "httpErrorMessage": "FORBIDDEN"}  # fmt: skip
        if (mtype, None) in self._capacity or (mtype, zone) in self._capacity:
            message = (f"The zone 'projects/{self.project}/zones/{zone}' does not have enough resources available "
                       "to fulfill the request.  Try a different zone, or try again later.")  # fmt: skip
            local = {"localizedMessage": {"locale": "en-US", "message": message}}
            return {"error": {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": message,
                                          "errorDetails": [_HELP, local]}]},
                    "httpErrorStatusCode": 503, "httpErrorMessage": "SERVICE UNAVAILABLE"}  # fmt: skip
        return None

    def _get_instance(self, zone: str, name: str) -> _Instance:
        inst = self._instances.get((zone, name))
        if inst is None:
            raise v.not_found(f"projects/{self.project}/zones/{zone}/instances/{name}")
        return inst

    def _h_instances_get(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        with self._lock:
            now = self._advance()
            return self._show(self._get_instance(zone, name), now)

    def _h_instances_delete(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        return self._stop_or_delete(req, zone, name, "delete")

    def _h_instances_stop(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        return self._stop_or_delete(req, zone, name, "stop")

    def _stop_or_delete(self, req: Request, zone: str, name: str, kind: str) -> dict[str, Any]:
        with self._lock:
            request_id, replay = self._replay(req, zone, kind)
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

    def _h_instances_list(self, req: Request, zone: str) -> dict[str, Any]:
        with self._lock:
            now = self._advance()
            items = [self._show(i, now) for i in self._instances.values() if i.zone == zone]
        link = f"{API}/projects/{self.project}/zones/{zone}/instances"
        return self._list("compute#instanceList", link, items, req)

    def _h_instances_aggregatedList(self, req: Request) -> dict[str, Any]:
        with self._lock:
            now = self._advance()
            per_zone: dict[str, list[dict[str, Any]]] = {}
            for inst in self._instances.values():
                per_zone.setdefault(inst.zone, []).append(self._show(inst, now))
        return self._aggregated("compute#instanceAggregatedList", "instances", per_zone, req)

    def _get_op(self, zone: str, op: str) -> _Operation:
        found = self._ops.get((zone, op))
        if found is None:
            raise v.not_found(f"projects/{self.project}/zones/{zone}/operations/{op}")
        return found

    def _h_zoneOperations_get(self, req: Request, zone: str, op: str) -> dict[str, Any]:
        with self._lock:
            return self._show_op(self._get_op(zone, op), time.time())

    def _h_zoneOperations_wait(self, req: Request, zone: str, op: str) -> dict[str, Any]:
        """Like the real ``wait``: returns when the operation is DONE or after two minutes at most."""
        with self._lock:
            done_at = self._get_op(zone, op).done_at
        time.sleep(max(0.0, min(done_at - time.time(), 120.0)))
        with self._lock:
            return self._show_op(self._get_op(zone, op), time.time())

    def _h_zoneOperations_list(self, req: Request, zone: str) -> dict[str, Any]:
        with self._lock:
            now = time.time()
            items = [self._show_op(o, now) for (z, _), o in self._ops.items() if z == zone]
        link = f"{API}/projects/{self.project}/zones/{zone}/operations"
        return self._list("compute#operationList", link, items, req)

    def _h_globalOperations_aggregatedList(self, req: Request) -> dict[str, Any]:
        with self._lock:
            now = time.time()
            per_zone: dict[str, list[dict[str, Any]]] = {}
            for (zone, _), op in self._ops.items():
                per_zone.setdefault(zone, []).append(self._show_op(op, now))
        return self._aggregated("compute#operationAggregatedList", "operations", per_zone, req)

    # --- the catalog side ------------------------------------------------------------------------

    def _h_zones_list(self, req: Request) -> dict[str, Any]:
        items = [v.zone_resource(self.project, z) for z in v.catalog().zones]
        return self._list("compute#zoneList", f"{API}/projects/{self.project}/zones", items, req)

    def _h_zones_get(self, req: Request, zone: str) -> dict[str, Any]:
        return v.zone_resource(self.project, zone)

    def _h_machineTypes_list(self, req: Request, zone: str) -> dict[str, Any]:
        items = [
            v.machine_type_resource(self.project, zone, s)
            for s in v.catalog().machines.get(zone, {}).values()
        ]
        link = f"{API}/projects/{self.project}/zones/{zone}/machineTypes"
        return self._list("compute#machineTypeList", link, items, req)

    def _h_machineTypes_get(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        shape = v.catalog().machines.get(zone, {}).get(name)
        try:
            shape = shape or v.catalog().custom(zone, name, name)
        except v.ApiError:
            shape = None
        if shape is None:
            raise v.not_found(f"projects/{self.project}/zones/{zone}/machineTypes/{name}")
        return v.machine_type_resource(self.project, zone, shape)

    def _h_acceleratorTypes_list(self, req: Request, zone: str) -> dict[str, Any]:
        types = v.catalog().accelerators.get(zone, {})
        items = [v.accelerator_type_resource(self.project, zone, n, c) for n, c in types.items()]
        link = f"{API}/projects/{self.project}/zones/{zone}/acceleratorTypes"
        return self._list("compute#acceleratorTypeList", link, items, req)

    def _h_acceleratorTypes_get(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        cards = v.catalog().accelerators.get(zone, {}).get(name)
        if cards is None:
            raise v.not_found(f"projects/{self.project}/zones/{zone}/acceleratorTypes/{name}")
        return v.accelerator_type_resource(self.project, zone, name, cards)
