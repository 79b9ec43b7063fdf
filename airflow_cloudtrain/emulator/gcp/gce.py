"""The emulated Compute Engine: a local HTTP server speaking the Compute v1 REST subset we use.

The real ``google-cloud-compute`` clients talk to it unchanged. An ``http://`` ``api_endpoint`` works
as is (the REST transport keeps an explicit scheme; ``url_scheme`` only matters for a bare host)::

    server = GceServer(); endpoint = server.start()          # "http://127.0.0.1:PORT"
    client = compute_v1.InstancesClient(credentials=AnonymousCredentials(),
                                        client_options={"api_endpoint": endpoint})
    # == compute_v1.InstancesClient(**compute_client_kwargs(endpoint)); the same for
    # ZoneOperationsClient, ZonesClient, MachineTypesClient, AcceleratorTypesClient,
    # InstanceTemplatesClient, InstanceGroupManagersClient and GlobalOperationsClient.

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
* ``scheduling.maxRunDuration`` (a Duration, ``{"seconds": "N"}``, 30 s to 120 days, and only with an
  ``instanceTerminationAction``) is the cloud's hard stop: N seconds after creation the VM is
  TERMINATED (STOP) or deleted (DELETE), whatever its guest does. No system-event operation is
  recorded for it. ``hard_stop_scale`` (tests) shortens it: it runs out after N * scale seconds.
* Throttling (``throttle.set(rate, api)``, see ``emulator.faults``): HTTP 429 ``rateLimitExceeded``
  (status RESOURCE_EXHAUSTED), before anything is done.
* Requests are counted per API method (``instances.list``, ...; ``throttled:instances.list`` for
  those refused as throttled), except those whose user agent carries ``cloudtrain-emulator``: the
  emulator's own polling. The REST transport sends ``gapic_v1.client_info.ClientInfo(user_agent=...)``
  in ``x-goog-api-client`` (``User-Agent`` stays python-requests'), so both headers are read.

Instance templates and managed instance groups (``gce_groups``: the calls; ``gce_manager``: the group
manager; ``gce_templates``: the template rules), for worker groups that the cloud keeps at a size:

* ``InstanceTemplatesClient`` (global): insert, get, list, delete; ``GlobalOperationsClient`` get,
  wait, list for their operations. ``properties`` are checked as ``instances.insert`` checks a body,
  with zonal types by bare name (``machineType: n1-standard-4``); 409 for a duplicate name; deleting a
  template a group uses is refused (400 ``resourceInUseByAnotherResource``), as on the real API.
* ``InstanceGroupManagersClient`` (zonal): insert (``instanceTemplate`` as a URL; unknown: 404),
  get (``targetSize``, ``currentActions``, ``status.isStable``), list, resize, deleteInstances,
  listManagedInstances (``currentAction``, ``instanceStatus``, ``lastAttempt``), delete.
* The group manager runs on a daemon thread (every ``reconcile_s``, 0.2 s) and after each group call,
  never only when asked: a worker group runs with nobody polling it. It creates members from the
  template (``<baseInstanceName>-xxxx``, metadata ``created-by`` = the group), so the instances' side
  starts their agents as for any VM; it repairs a member whose VM ended other than through the group
  (``instances.delete``, a preemption, a power-off: the VM is made again under the same name,
  ``recreate_s`` after the old one is gone; RECREATING meanwhile) -- which is why workers leave with
  ``deleteInstances``, which deletes them and lowers ``targetSize``; resize down deletes the members
  not running, then the newest; deleting a group deletes its members. A VM the group cannot create
  (``fail_capacity``, ``fail_quota``) leaves its member CREATING without a VM, the error in
  ``lastAttempt``, retried on every pass.
* For tests: ``server.templates()`` (names), ``server.group(zone, name)`` (the GET resource plus its
  ``managedInstances``; None if there is none), ``server.reconcile()`` (one pass now).

Timestamps are RFC 3339 with a -07:00 offset, as the real API writes them (Pacific time, never "Z").
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from typing import Any

from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from airflow_cloudtrain.emulator.faults import EMULATOR_USER_AGENT, Throttle, is_own
from airflow_cloudtrain.emulator.gcp import gce_api as api
from airflow_cloudtrain.emulator.gcp import gce_catalog as cat
from airflow_cloudtrain.emulator.gcp.gce_api import API, ApiError
from airflow_cloudtrain.emulator.gcp.gce_groups import GroupApi, group_rules
from airflow_cloudtrain.emulator.gcp.gce_state import GLOBAL
from airflow_cloudtrain.emulator.serving import InThread

__all__ = ["EMULATOR_USER_AGENT", "GceServer", "compute_client_kwargs"]

_THROTTLED = (
    "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute' of service "
    "'compute.googleapis.com'. Rate Limit Exceeded"
)


def compute_client_kwargs(endpoint: str) -> dict[str, Any]:
    """Keyword arguments that point any ``google.cloud.compute_v1`` client at the emulator."""
    from google.auth.credentials import AnonymousCredentials

    return {"credentials": AnonymousCredentials(), "client_options": {"api_endpoint": endpoint}}


class GceServer(GroupApi):
    """Compute Engine v1 REST subset on 127.0.0.1 (random port) in a daemon thread; see the module doc."""

    def __init__(
        self,
        project: str = "cloudtrain-emulated",
        op_delay: float = 0.0,
        provision_s: float = 0.1,
        boot_s: float = 0.1,
        delete_after_s: float = 0.5,
        throttle: Throttle | None = None,
        recreate_s: float = 1.0,
    ) -> None:
        super().__init__(project, op_delay, provision_s, boot_s, delete_after_s, recreate_s)
        self.throttle = throttle or Throttle()
        self.endpoint = ""
        self._counts: Counter[str] = Counter()
        self._serving: InThread | None = None
        p = "/compute/v1/projects/<project>"
        z = f"{p}/zones/<zone>"
        self._routes = Map(
            [
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
                Rule(
                    f"{p}/aggregated/operations", endpoint="globalOperations.aggregatedList", methods=["GET"]
                ),
                Rule(f"{z}/machineTypes", endpoint="machineTypes.list", methods=["GET"]),
                Rule(f"{z}/machineTypes/<name>", endpoint="machineTypes.get", methods=["GET"]),
                Rule(f"{z}/acceleratorTypes", endpoint="acceleratorTypes.list", methods=["GET"]),
                Rule(f"{z}/acceleratorTypes/<name>", endpoint="acceleratorTypes.get", methods=["GET"]),
                *group_rules(p, z),
            ]
        )

    # --- lifecycle and counts --------------------------------------------------------------------

    def start(self) -> str:
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request drowns the task log
        self._serving = InThread(make_server("127.0.0.1", 0, self._wsgi, threaded=True), "gce-emulator")
        self.endpoint = self._serving.endpoint
        self.start_manager()
        return self.endpoint

    def stop(self) -> None:
        self.stop_manager()
        if self._serving is not None:
            self._serving.stop()
            self._serving = None

    def clear_faults(self) -> None:
        """No capacity, quota or throttling faults any more."""
        super().clear_faults()
        self.throttle.clear()

    def counts(self) -> dict[str, int]:
        """Requests per API method (``instances.list``, ...) since start or reset, the emulator's excluded;
        ``throttled:<method>`` counts those of them refused as throttled."""
        with self._lock:
            return dict(self._counts)

    def reset_counts(self) -> None:
        with self._lock:
            self._counts.clear()

    # --- HTTP ------------------------------------------------------------------------------------

    def _wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        try:
            endpoint, args = self._routes.bind_to_environ(environ).match()
            if not is_own(request.headers.get("User-Agent"), request.headers.get("x-goog-api-client")):
                hit = self.throttle.hit("compute", endpoint)
                with self._lock:
                    self._counts[endpoint] += 1
                    if hit:
                        self._counts[f"throttled:{endpoint}"] += 1
                if hit:
                    raise ApiError(429, "rateLimitExceeded", _THROTTLED, domain="usageLimits")
            if (project := args.pop("project")) != self.project:
                raise api.not_found(f"projects/{project}")
            if "zone" in args and args["zone"] not in cat.catalog().zones:
                if endpoint == "zones.get":
                    raise api.not_found(f"projects/{self.project}/zones/{args['zone']}")
                raise api.invalid("zone", args["zone"], "Unknown zone.")
            handler = getattr(self, "_h_" + endpoint.replace(".", "_"))
            status, body = 200, handler(request, **args)
        except ApiError as exc:
            status, body = exc.code, exc.body()
        except HTTPException as exc:
            status, body = (
                exc.code or 404,
                ApiError(exc.code or 404, "notFound", exc.description or "").body(),
            )
        payload = json.dumps(body).encode()
        return Response(payload, status, content_type="application/json; charset=UTF-8")(
            environ, start_response
        )

    def _list(self, kind: str, self_link: str, items: list[dict[str, Any]], req: Request) -> dict[str, Any]:
        return api.listing(kind, self_link, items, req.args)

    def _aggregated(
        self, kind: str, key: str, per_zone: dict[str, list[dict[str, Any]]], req: Request
    ) -> dict[str, Any]:
        predicate = api.compile_filter(req.args.get("filter"))
        flat = [
            (z, r)
            for z in sorted(per_zone)
            for r in sorted(per_zone[z], key=lambda r: r["name"])
            if predicate(r)
        ]
        chunk, token = api.page(flat, req.args.get("maxResults"), req.args.get("pageToken"))
        items: dict[str, Any] = {}
        for zone in ([GLOBAL] if GLOBAL in per_zone else []) + sorted(cat.catalog().zones):
            found = [r for z, r in chunk if z == zone]
            scope = GLOBAL if zone == GLOBAL else f"zones/{zone}"
            items[scope] = (
                {key: found}
                if found
                else {
                    "warning": {
                        "code": "NO_RESULTS_ON_PAGE",
                        "message": f"There are no results for scope '{scope}' on this page.",
                        "data": [{"key": "scope", "value": scope}],
                    }
                }
            )
        link = f"{API}/projects/{self.project}/aggregated/{key}"
        out = {
            "kind": kind,
            "id": f"projects/{self.project}/aggregated/{key}",
            "items": items,
            "selfLink": link,
        }
        return {**out, "nextPageToken": token} if token else out

    # --- handlers: one per API method (the route endpoint name) ------------------------------------

    def _h_instances_insert(self, req: Request, zone: str) -> dict[str, Any]:
        return self._insert(zone, req.get_json(force=True, silent=True) or {}, req.args.get("requestId"))

    def _h_instances_get(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        with self._lock:
            now = self._advance()
            return self._show(self._get_instance(zone, name), now)

    def _h_instances_delete(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        return self._stop_or_delete(zone, name, "delete", req.args.get("requestId"))

    def _h_instances_stop(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        return self._stop_or_delete(zone, name, "stop", req.args.get("requestId"))

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

    def _h_zoneOperations_get(self, req: Request, zone: str, op: str) -> dict[str, Any]:
        with self._lock:
            return self._show_op(self._get_op(zone, op), time.time())

    def _h_zoneOperations_wait(self, req: Request, zone: str, op: str) -> dict[str, Any]:
        return self._wait_op(zone, op)

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
        items = [cat.zone_resource(self.project, z) for z in cat.catalog().zones]
        return self._list("compute#zoneList", f"{API}/projects/{self.project}/zones", items, req)

    def _h_zones_get(self, req: Request, zone: str) -> dict[str, Any]:
        return cat.zone_resource(self.project, zone)

    def _h_machineTypes_list(self, req: Request, zone: str) -> dict[str, Any]:
        items = [
            cat.machine_type_resource(self.project, zone, s)
            for s in cat.catalog().machines.get(zone, {}).values()
        ]
        link = f"{API}/projects/{self.project}/zones/{zone}/machineTypes"
        return self._list("compute#machineTypeList", link, items, req)

    def _h_machineTypes_get(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        shape = cat.catalog().machines.get(zone, {}).get(name)
        try:
            shape = shape or cat.catalog().custom(zone, name, name)
        except ApiError:
            shape = None
        if shape is None:
            raise api.not_found(f"projects/{self.project}/zones/{zone}/machineTypes/{name}")
        return cat.machine_type_resource(self.project, zone, shape)

    def _h_acceleratorTypes_list(self, req: Request, zone: str) -> dict[str, Any]:
        types = cat.catalog().accelerators.get(zone, {})
        items = [cat.accelerator_type_resource(self.project, zone, n, c) for n, c in types.items()]
        link = f"{API}/projects/{self.project}/zones/{zone}/acceleratorTypes"
        return self._list("compute#acceleratorTypeList", link, items, req)

    def _h_acceleratorTypes_get(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        cards = cat.catalog().accelerators.get(zone, {}).get(name)
        if cards is None:
            raise api.not_found(f"projects/{self.project}/zones/{zone}/acceleratorTypes/{name}")
        return cat.accelerator_type_resource(self.project, zone, name, cards)
