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
  unknown zone is 404.
* Any project a request names is served, as moto serves any account: each project id has its own
  instances, operations, templates and groups (``gce_project``), made empty on first use, so a DAG's
  own ``project_id`` works; a name that is no project id at all is 404.
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
* The Cloud Billing Catalog's ``GET /v1/services/<id>/skus`` is served on the same port, from the price
  snapshot (``billing``), counted as ``services.skus.list`` and throttled as service ``cloudbilling``.
* Requests take the pipeline every emulated Google API shares (``rest``). Throttling
  (``throttle.set(rate, api)``, see ``emulator.faults``): HTTP 429 ``rateLimitExceeded`` (status
  RESOURCE_EXHAUSTED), before anything is done.
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
  recreateInstances (the VM deleted and made again under its name, targetSize kept), listManagedInstances (``currentAction``, ``instanceStatus``, ``lastAttempt``), delete.
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
* For tests: ``server.firewalls()`` (the VPC firewall rules, ``gce_firewalls``: insert, get, list,
  delete, global operations, validated as the real API), ``server.templates()`` (names), ``server.group(zone, name)`` (the GET resource plus its
  ``managedInstances``; None if there is none), ``server.reconcile()`` (one pass now).

Timestamps are RFC 3339 with a -07:00 offset, as the real API writes them (Pacific time, never "Z").
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from werkzeug.exceptions import HTTPException
from werkzeug.routing import Rule
from werkzeug.wrappers import Request

from airflow_cloudtrain.emulator.faults import EMULATOR_USER_AGENT, Throttle
from airflow_cloudtrain.emulator.gcp import billing
from airflow_cloudtrain.emulator.gcp import gce_api as api
from airflow_cloudtrain.emulator.gcp import gce_catalog as cat
from airflow_cloudtrain.emulator.gcp.gce_api import ApiError
from airflow_cloudtrain.emulator.gcp.gce_firewalls import firewall_rules
from airflow_cloudtrain.emulator.gcp.gce_groups import group_rules
from airflow_cloudtrain.emulator.gcp.gce_policies import policy_rules
from airflow_cloudtrain.emulator.gcp.gce_project import GceProject
from airflow_cloudtrain.emulator.gcp.rest import GoogleRestServer

__all__ = ["EMULATOR_USER_AGENT", "GceProject", "GceServer", "compute_client_kwargs"]

log = logging.getLogger(__name__)
_THROTTLED = (
    "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute' of service "
    "'{service}.googleapis.com'. Rate Limit Exceeded"
)


def compute_client_kwargs(endpoint: str) -> dict[str, Any]:
    """Keyword arguments that point any ``google.cloud.compute_v1`` client at the emulator."""
    from google.auth.credentials import AnonymousCredentials

    return {"credentials": AnonymousCredentials(), "client_options": {"api_endpoint": endpoint}}


def _shared(name: str) -> property:
    """A setting every project's state has, set on all of them at once."""

    def get(self: GceServer) -> Any:
        return self._settings[name]

    def put(self: GceServer, value: Any) -> None:
        with self._lock:
            self._settings[name] = value
            for state in self._projects.values():
                setattr(state, name, value)

    return property(get, put)


class GceServer(GoogleRestServer):
    """Compute Engine v1 REST subset on 127.0.0.1 (random port) in a daemon thread; see the module doc.

    Any project id a request names is served, each with its own instances, operations, templates and
    groups (``GceProject``, made on first use), as moto serves any account. ``project`` is the default
    one: the testing calls below act on it unless given ``project=``; faults, throttling, the clock
    settings and the group manager apply to every project."""

    service = "compute"
    services = {"services.skus.list": "cloudbilling"}  # the Billing Catalog shares the port
    thread_name = "gce-emulator"

    op_delay = _shared("op_delay")
    provision_s = _shared("provision_s")
    boot_s = _shared("boot_s")
    delete_after_s = _shared("delete_after_s")
    recreate_s = _shared("recreate_s")
    hard_stop_scale = _shared("hard_stop_scale")
    firewall_op_delay = _shared("firewall_op_delay")

    def __init__(
        self,
        project: str = "cloudtrain-emulated",
        op_delay: float = 0.0,
        provision_s: float = 0.1,
        boot_s: float = 0.1,
        delete_after_s: float = 0.5,
        throttle: Throttle | None = None,
        recreate_s: float = 1.0,
        reconcile_s: float = 0.2,
    ) -> None:
        p = "/compute/v1/projects/<project>"
        super().__init__(_rules(p, f"{p}/zones/<zone>"), throttle)
        self.project = project
        self.reconcile_s = reconcile_s
        self._settings: dict[str, Any] = {
            "op_delay": op_delay,
            "provision_s": provision_s,
            "boot_s": boot_s,
            "delete_after_s": delete_after_s,
            "recreate_s": recreate_s,
            "hard_stop_scale": 1.0,
            "firewall_op_delay": 0.0,
        }
        self._lock = threading.RLock()  # the project map and the faults to replay
        self._projects: dict[str, GceProject] = {}
        self._faults: list[tuple[str, tuple[Any, ...]]] = []  # (method, args): given to new projects too
        self._halt = threading.Event()
        self._manager: threading.Thread | None = None
        self.state(project)

    # --- projects --------------------------------------------------------------------------------

    def state(self, project: str | None = None) -> GceProject:
        """The state of ``project`` (default: ``self.project``), made empty on first use."""
        project = project or self.project
        with self._lock:
            found = self._projects.get(project)
            if found is None:
                s = self._settings
                found = GceProject(
                    project,
                    s["op_delay"],
                    s["provision_s"],
                    s["boot_s"],
                    s["delete_after_s"],
                    s["recreate_s"],
                    self.reconcile_s,
                )
                found.hard_stop_scale = s["hard_stop_scale"]
                found.firewall_op_delay = s["firewall_op_delay"]
                for method, args in self._faults:
                    getattr(found, method)(*args)
                self._projects[project] = found
            return found

    def projects(self) -> list[str]:
        with self._lock:
            return sorted(self._projects)

    def _states(self) -> list[GceProject]:
        with self._lock:
            return list(self._projects.values())

    # --- lifecycle and counts --------------------------------------------------------------------

    def start(self, port: int = 0) -> str:
        """Serve on 127.0.0.1:``port`` (0: a free port), and run the group manager."""
        endpoint = super().start(port)
        if self._manager is None:
            self._halt.clear()
            self._manager = threading.Thread(target=self._manage, name="gce-group-manager", daemon=True)
            self._manager.start()
        return endpoint

    def stop(self) -> None:
        self._halt.set()
        if self._manager is not None:
            self._manager.join(timeout=5)
            self._manager = None
        super().stop()

    def _manage(self) -> None:
        """The group manager of every project (``gce_manager``): groups act with nobody asking."""
        while not self._halt.wait(self.reconcile_s):
            for state in self._states():
                try:
                    state.reconcile()
                except Exception:  # the groups must go on being managed whatever one pass hits
                    log.exception("emulated group manager: reconcile failed")

    # --- faults and the cloud's own acts (every project, or the one named) ------------------------

    def _fault(self, method: str, *args: Any) -> None:
        with self._lock:
            self._faults.append((method, args))
            for state in self._projects.values():
                getattr(state, method)(*args)

    def fail_capacity(self, machine_type: str, zone: str | None = None, after: int = 0) -> None:
        """From now on inserts of this type (in this zone, or anywhere) end in ZONE_RESOURCE_POOL_EXHAUSTED,
        in every project (``after``: the next that many inserts still get a VM)."""
        self._fault("fail_capacity", machine_type, zone, after)

    def fail_quota(
        self,
        machine_type: str | None = None,
        zone: str | None = None,
        metric: str | None = None,
        synchronous: bool = False,
    ) -> None:
        """Inserts exceed a quota, in every project (``ComputeState.fail_quota``)."""
        self._fault("fail_quota", machine_type, zone, metric, synchronous)

    def clear_faults(self) -> None:
        """No capacity, quota or throttling faults any more."""
        with self._lock:
            self._faults.clear()
            for state in self._projects.values():
                state.clear_faults()
        self.throttle.clear()

    def alive(self) -> list[dict[str, Any]]:
        """Every instance whose guest runs, in every project (``ComputeState.alive``, plus ``project``)."""
        return [{**i, "project": s.project} for s in self._states() for i in s.alive()]

    def instance(self, zone: str, name: str, project: str | None = None) -> dict[str, Any] | None:
        """The instance as ``instances.get`` shows it, or None."""
        return self.state(project).instance(zone, name)

    def _holder(self, zone: str, name: str, project: str | None) -> GceProject:
        """The project of a live VM (the default project first), for acts known by zone and name."""
        if project is not None:
            return self.state(project)
        states = sorted(self._states(), key=lambda s: s.project != self.project)
        for state in states:
            if any(i["zone"] == zone and i["name"] == name for i in state.alive()):
                return state
        return self.state()

    def preempt(self, zone: str, name: str, grace_s: float = 0.0, project: str | None = None) -> None:
        """Compute Engine reclaims a Spot VM (``ComputeState.preempt``)."""
        self._holder(zone, name, project).preempt(zone, name, grace_s)

    def shutdown(self, zone: str, name: str, project: str | None = None) -> None:
        """The guest powered off (``ComputeState.shutdown``)."""
        self._holder(zone, name, project).shutdown(zone, name)

    def templates(self, project: str | None = None) -> list[str]:
        return self.state(project).templates()

    def firewalls(self, project: str | None = None) -> list[dict[str, Any]]:
        """The project's firewall rules as ``firewalls.get`` shows them (``gce_firewalls``)."""
        return self.state(project).firewalls()

    def group(self, zone: str, name: str, project: str | None = None) -> dict[str, Any] | None:
        return self.state(project).group(zone, name)

    def reconcile(self) -> None:
        """One pass of the group manager over every group of every project."""
        for state in self._states():
            state.reconcile()

    # --- HTTP ------------------------------------------------------------------------------------

    def throttled(self, service: str) -> ApiError:
        return ApiError(429, "rateLimitExceeded", _THROTTLED.format(service=service), domain="usageLimits")

    def unknown_route(self, request: Request, exc: HTTPException) -> ApiError:
        return ApiError(exc.code or 404, "notFound", exc.description or "")

    def handle(self, op: str, request: Request, args: dict[str, Any]) -> Any:
        """The project's state answers (``_h_<op>(request, **args)``), once the project and zone are
        known good; the Billing Catalog answers its own."""
        if op == "services.skus.list":
            return billing.answer(request.method, request.path, request.args)
        project = args.pop("project")
        if not api.PROJECT_ID.fullmatch(project):
            raise api.not_found(f"projects/{project}")
        if "zone" in args and args["zone"] not in cat.catalog().zones:
            if op == "zones.get":
                raise api.not_found(f"projects/{project}/zones/{args['zone']}")
            raise api.invalid("zone", args["zone"], "Unknown zone.")
        return getattr(self.state(project), "_h_" + op.replace(".", "_"))(request, **args)


def _rules(p: str, z: str) -> list[Rule]:
    """The Compute v1 methods served (``p``: a project's path, ``z``: a zone's), and the Billing
    Catalog's SKU listing (any method, any path under it: it answers its own 404s)."""
    return [
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
        *group_rules(p, z),
        *firewall_rules(p),
        *policy_rules(p),
        Rule(f"{billing.PREFIX}<path:rest>", endpoint="services.skus.list"),
    ]
