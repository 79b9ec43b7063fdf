"""Compute Engine behind the cloud interface: google-cloud-compute calls and error mapping.

An instance's id in our records is its name; the zone travels beside it. Insert is a zonal
operation whose *result* carries capacity errors (ZONE_RESOURCE_POOL_EXHAUSTED), so launches wait
on the operation through ZoneOperationsClient.wait (the extended-operation helper of the library
polls the default endpoint, not the one the client was built for).
"""

from __future__ import annotations

import re
import time
import uuid
from typing import TYPE_CHECKING, Any, Protocol

from airflow_cloudtrain.catalog.gce import ACCELERATOR_TYPES
from airflow_cloudtrain.clouds.gcp.errors import map_api_error, map_code
from airflow_cloudtrain.clouds.gcp.firewall import network_tag
from airflow_cloudtrain.contract.errors import InvalidRequest
from airflow_cloudtrain.contract.runs import TAG_PRICE, TAG_RUN, TAG_RUN_KEY, TAG_RUN_URI
from airflow_cloudtrain.core.cloud import (
    PENDING,
    RUNNING,
    STOPPED,
    STOPPING,
    TERMINATED,
    Cloud,
    Instance,
    LaunchRequest,
)
from airflow_cloudtrain.core.inventory import Tagged, price_of, register_lister

if TYPE_CHECKING:
    from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook

STATUS = {
    "PROVISIONING": PENDING,
    "STAGING": PENDING,
    "RUNNING": RUNNING,
    "STOPPING": STOPPING,
    "SUSPENDING": STOPPING,
    "SUSPENDED": STOPPED,
    "REPAIRING": PENDING,
    "TERMINATED": TERMINATED,
}
CPU_IMAGE = "projects/debian-cloud/global/images/family/debian-12"
GPU_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu123-debian-11-py310"
SCOPES = [
    "https://www.googleapis.com/auth/devstorage.read_write",
    "https://www.googleapis.com/auth/logging.write",
]
PAGE = 500  # instances.list maxResults limit
AGGREGATED_NAMES_MAX = 64  # names one aggregatedList filter carries; more: the zonal listings


def zones_of(region: str | None) -> list[str]:
    """The region's zones the catalog knows (where our machine types are offered)."""
    from airflow_cloudtrain.catalog.snapshot import snapshot_rows

    if not region:
        raise ValueError("a GCE region or zone is needed")
    zones = sorted({z for r in snapshot_rows("gcp") if r.region == region for z in r.zones})
    return zones or [f"{region}-a", f"{region}-b", f"{region}-c"]


def gcp_cloud(hook: CloudTrainGcpHook, region: str | None, zone: str | None = None) -> GcpCloud:
    """Compute Engine in the hook's project: in ``zone``, or in every zone of ``region`` we know."""
    zones = [zone] if zone else zones_of(region)
    return GcpCloud(
        hook.instances_client(),
        hook.operations_client(),
        hook.project,
        region or (zone or "").rsplit("-", 1)[0],
        zones,
    )


def label_value(text: str) -> str:
    """GCE label values: lowercase letters, digits, ``_`` and ``-``, at most 63 characters."""
    return re.sub(r"[^a-z0-9_-]", "_", text.lower())[:63]


def instance_name(run_digest: str, try_number: int, attempt: int) -> str:
    return f"ct-{run_digest[:16]}-t{try_number}-a{attempt}"


def _error_of(op: Any) -> tuple[str, str] | None:
    errors = list(getattr(getattr(op, "error", None), "errors", []) or [])
    if not errors:
        return None
    return errors[0].code, errors[0].message


def network_interface(r: LaunchRequest, zone: str | None) -> dict[str, Any]:
    """The VM's one NIC: ``network``/``subnetwork`` as asked (the ``default`` network otherwise; a
    subnetwork alone implies its network), and an external IP unless ``external_ip=False``: then no
    access config at all, and the VM reaches Google APIs only through Private Google Access or Cloud
    NAT on its subnetwork."""
    nic: dict[str, Any] = {}
    if r.network or not r.subnetwork:
        nic["network"] = r.network or "global/networks/default"
    if r.subnetwork:
        region = zone.rsplit("-", 1)[0] if zone else r.offer.region
        named = "/" not in r.subnetwork
        nic["subnetwork"] = f"regions/{region}/subnetworks/{r.subnetwork}" if named else r.subnetwork
        if not named and f"/regions/{region}/" not in f"/{r.subnetwork}":
            raise InvalidRequest(
                f"subnetwork={r.subnetwork!r} is not in region {region!r}, where this VM launches: use a "
                f"subnetwork of {region!r} or set region to the subnetwork's",
                "INVALID_SUBNETWORK_REGION",
            )
    if r.external_ip:
        nic["access_configs"] = [{"name": "External NAT", "type_": "ONE_TO_ONE_NAT"}]
    return nic


def instance_properties(r: LaunchRequest, zone: str | None) -> dict[str, Any]:
    """The launch shape of one of our VMs, shared by a single run's insert and a group's instance
    template (``zone=None``: machine and accelerator types by bare name, as templates take them).

    Shielded VM (vTPM, integrity monitoring; secure boot on CPU images, whose kernels are signed, not
    on GPU images, whose NVIDIA modules may not be), the run's labels, the agent bootstrap as the
    startup script, no SSH key, and the run's network tag, which the run's firewall rule denies all
    ingress to (``clouds.gcp_firewall``): the default network's allow rules do not reach our VMs."""
    offer = r.offer
    labels = {k: label_value(v) for k, v in r.tags.items() if k != TAG_RUN_URI}
    gpu = offer.gpus > 0
    scheduling: dict[str, Any] = {"automatic_restart": False, "on_host_maintenance": "TERMINATE"}
    if r.provisioning == "preemptible":
        scheduling["preemptible"] = True
    elif r.provisioning == "spot" or offer.is_spot:
        scheduling.update(provisioning_model="SPOT", instance_termination_action="DELETE")
    elif not gpu:
        scheduling = {"automatic_restart": True, "on_host_maintenance": "MIGRATE"}
    if r.hard_stop_s:
        # the cloud's own hard stop: deleted after this long, whether or not our agent is alive
        scheduling.update(
            max_run_duration={"seconds": max(30, int(r.hard_stop_s))},
            instance_termination_action="DELETE",
        )
    body: dict[str, Any] = {
        "machine_type": f"zones/{zone}/machineTypes/{offer.instance_type}" if zone else offer.instance_type,
        "labels": labels,
        "tags": {"items": [network_tag(r.tags[TAG_RUN_KEY])] if r.tags.get(TAG_RUN_KEY) else []},
        "metadata": {
            "items": [
                {"key": "startup-script", "value": r.user_data},
                {"key": TAG_RUN_URI, "value": r.tags.get(TAG_RUN_URI, "")},
            ]
        },
        "disks": [
            {
                "boot": True,
                "auto_delete": True,
                "initialize_params": {
                    "source_image": r.image_id or (GPU_IMAGE if gpu else CPU_IMAGE),
                    "disk_size_gb": r.disk_gib,
                },
            }
        ],
        "network_interfaces": [network_interface(r, zone)],
        "service_accounts": [{"email": r.service_account or "default", "scopes": SCOPES}],
        "scheduling": scheduling,
        "shielded_instance_config": {
            "enable_secure_boot": not gpu,
            "enable_vtpm": True,
            "enable_integrity_monitoring": True,
        },
    }
    if r.resource_policies:  # a gang's compact placement policy (``clouds.gcp.gang_net``)
        body["resource_policies"] = list(r.resource_policies)
    if offer.attach_gpus:
        accelerator = ACCELERATOR_TYPES[offer.gpu_type or ""]
        body["guest_accelerators"] = [
            {
                "accelerator_type": f"zones/{zone}/acceleratorTypes/{accelerator}" if zone else accelerator,
                "accelerator_count": offer.gpus,
            }
        ]
    return body


class GcpCloud(Cloud):
    """Compute Engine in one project, for the zones of one region."""

    name = "gcp"

    def __init__(self, instances: Any, operations: Any, project: str, region: str, zones: list[str]) -> None:
        self.instances = instances
        self.operations = operations
        self.project = project
        self.region = region
        self.zones = zones

    def launch(self, request: LaunchRequest) -> Instance:
        from google.api_core import exceptions as gexc
        from google.cloud import compute_v1

        zone = request.zone or (request.offer.zones[0] if request.offer.zones else f"{self.region}-a")
        digest, try_number, attempt = request.client_token.split("-")[:3]
        name = instance_name(digest, int(try_number), int(attempt))
        request_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"cloudtrain:{request.client_token}"))
        resource = compute_v1.Instance({"name": name, **instance_properties(request, zone)})
        insert = compute_v1.InsertInstanceRequest(
            project=self.project, zone=zone, instance_resource=resource, request_id=request_id
        )
        from airflow_cloudtrain.core.retry import TransientBudget, call_with_retry

        def insert_once() -> Any:  # None: the instance exists already (a launch sent twice is ours)
            try:
                return self.instances.insert(request=insert)
            except gexc.Conflict:
                return None
            except gexc.GoogleAPICallError as err:
                raise map_api_error(err) from err

        # As EC2's launch: throttling (429 rateLimitExceeded) and 5xx are asked again within a budget;
        # the request id makes a repeated insert the same operation, never a second VM. The waits and
        # the get below are reads, which the hook's clients retry themselves (``RetryingReads``).
        op = call_with_retry(insert_once, TransientBudget(budget_s=180.0))
        if op is not None:
            op = self._wait(zone, getattr(op, "name", None) or op.name)
            if (error := _error_of(op)) is not None:
                raise map_code(*error)
        try:
            return self._get(zone, name)
        except gexc.NotFound:
            # The cloud took it between the insert's end and this read: a Spot VM preempted at once is
            # deleted (``instanceTerminationAction: DELETE``). It was made, so it is launched and
            # already ended: the wait then treats it as any interrupted or lost instance (relaunch,
            # resume), where a 404 raised here would fail the task (fault campaign s110).
            gone = self.describe([name])[name]
            spot = request.provisioning in ("spot", "preemptible") or request.offer.is_spot
            gone.instance_type, gone.zone, gone.spot = request.offer.instance_type, zone, spot
            return gone

    def _wait(self, zone: str, operation: str, timeout: float = 300) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            op = self.operations.wait(project=self.project, zone=zone, operation=operation)
            if str(getattr(op.status, "name", op.status)) == "DONE" or time.monotonic() > deadline:
                return op

    def _get(self, zone: str, name: str) -> Instance:
        return to_instance(self.instances.get(project=self.project, zone=zone, instance=name))

    def _list(self, zone: str, filter_: str | None = None) -> list[Any]:
        from google.cloud import compute_v1

        req = compute_v1.ListInstancesRequest(project=self.project, zone=zone, max_results=PAGE)
        if filter_:
            req.filter = filter_
        return list(self.instances.list(request=req))

    def find(self, run_key_digest: str, ended: bool = False) -> list[Instance]:
        found = self._labelled(TAG_RUN_KEY, run_key_digest)
        return found if ended else [i for i in found if i.state in (PENDING, RUNNING)]

    def find_run(self, run_id: str) -> list[Instance]:
        return self._labelled(TAG_RUN, run_id)

    def _labelled(self, key: str, value: str) -> list[Instance]:
        return [
            to_instance(raw) for zone in self.zones for raw in self._list(zone, f"labels.{key} = {value}")
        ]

    def describe(self, ids: list[str]) -> dict[str, Instance]:
        """One call for the whole region (``_named``); names not listed are gone (deleted)."""
        wanted = set(ids)
        out = {raw.name: to_instance(raw) for raw in self._named(sorted(wanted)) if raw.name in wanted}
        ended = [i for i in out.values() if i.state == TERMINATED]
        if ended or wanted - set(out):
            preempted = self._operation_targets("compute.instances.preempted")
            deleted = self._operation_targets("delete") if wanted - set(out) else set()
            for inst in ended:
                inst.preempted = inst.id in preempted
            for name in wanted - set(out):
                known = name in deleted or name in preempted
                out[name] = Instance(
                    name,
                    TERMINATED,
                    "",
                    None,
                    False,
                    state_reason="deleted" if known else "not found",
                    preempted=name in preempted,
                    missing=not known,
                )
        return out

    def _named(self, names: list[str]) -> list[Any]:
        """The instances of these names in the region's zones. Several zones: ONE ``aggregatedList``
        filtered by name (a gang's nodes, a run that moved zones) instead of an ``instances.list`` per
        zone (four in us-central1); one zone, or more names than a filter should carry: the zonal
        listings (per 500 instances)."""
        from google.cloud import compute_v1

        if len(self.zones) == 1 or not names or len(names) > AGGREGATED_NAMES_MAX:
            return [raw for zone in self.zones for raw in self._list(zone)]
        req = compute_v1.AggregatedListInstancesRequest(
            project=self.project,
            filter=" OR ".join(f'(name = "{name}")' for name in names),
            max_results=PAGE,
        )
        zones = {f"zones/{zone}" for zone in self.zones}
        return [
            raw
            for scope, scoped in self.instances.aggregated_list(request=req)
            if scope in zones
            for raw in scoped.instances
        ]

    def _operation_targets(self, operation_type: str) -> set[str]:
        """Names of instances a zonal operation of this type acted on (preempted, deleted): how a
        VM that is gone is told from one that never existed."""
        from google.cloud import compute_v1

        names = set()
        for zone in self.zones:
            req = compute_v1.ListZoneOperationsRequest(
                project=self.project, zone=zone, filter=f'operationType = "{operation_type}"'
            )
            for op in self.operations.list(request=req):
                names.add(op.target_link.rsplit("/", 1)[-1])
        return names

    def terminate(self, ids: list[str]) -> None:
        from google.api_core import exceptions as gexc

        for name in ids:
            for zone in self.zones:
                try:
                    self.instances.delete(project=self.project, zone=zone, instance=name)
                    break
                except gexc.NotFound:
                    continue

    def attach_volume(self, instance_id: str, volume_id: str) -> str:
        raise InvalidRequest("volume_id is an EC2 feature; on GCE attach a persistent disk in setup_cmds", "")


def to_instance(raw: Any) -> Instance:
    status = str(getattr(raw.status, "name", raw.status)) if not isinstance(raw.status, str) else raw.status
    scheduling = raw.scheduling
    spot = (
        bool(getattr(scheduling, "preemptible", False))
        or getattr(scheduling, "provisioning_model", "") == "SPOT"
    )
    created = getattr(raw, "creation_timestamp", "") or ""
    launch = None
    if created:
        from datetime import datetime

        launch = datetime.fromisoformat(created).timestamp()
    return Instance(
        id=raw.name,
        state=STATUS.get(status, PENDING),
        instance_type=raw.machine_type.rsplit("/", 1)[-1],
        zone=raw.zone.rsplit("/", 1)[-1],
        spot=spot,
        launch_time=launch,
        state_reason=status,
        tags=dict(raw.labels),
        private_ip=_private_ip(raw),
    )


def _private_ip(raw: Any) -> str | None:
    """The VM's first NIC's internal address (``networkIP``), once assigned."""
    nics = list(getattr(raw, "network_interfaces", []) or [])
    return (getattr(nics[0], "network_i_p", "") or None) if nics else None


# --- cloudtrain gc: every VM of ours in the region's zones, whatever its run -----------------------


class _GceBackend(Protocol):
    """What the lister needs of ``GcpRunBackend`` (named here: the backend module imports this one)."""

    @property
    def cloud(self) -> GcpCloud: ...


def _metadata(raw: Any, key: str) -> str | None:
    items = getattr(getattr(raw, "metadata", None), "items", None) or []
    return next((str(i.value) for i in items if i.key == key and i.value), None)


def list_tagged(backend: _GceBackend) -> list[Tagged]:
    """Every VM labelled with a run key, any state but deleted (a TERMINATED VM still bills its
    disks), in each zone of the region: one list call per zone."""
    cloud, out = backend.cloud, []
    for zone in cloud.zones:
        for raw in cloud._list(zone):
            labels = dict(raw.labels)
            if TAG_RUN_KEY not in labels:
                continue
            inst = to_instance(raw)
            out.append(
                Tagged(
                    "instance",
                    inst.id,
                    inst.zone,
                    labels[TAG_RUN_KEY],
                    _metadata(raw, TAG_RUN_URI),
                    inst.launch_time,
                    inst.state_reason or inst.state,
                    price_of(labels, TAG_PRICE),
                )
            )
    return out


register_lister("gcp", "instance", list_tagged)
