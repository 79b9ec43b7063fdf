"""The rules ``instances.insert`` enforces, and the instance resource it creates from a valid body.

Kept apart from the HTTP server and its state (``gce.py``, ``gce_state.py``) so the rules read as one
list. Error texts follow the real API's wording where it is known from real responses ("Invalid value
for field ...", "Required field ... not specified", "Memory should be a multiple of 256MiB, while ...",
"Instances with guest accelerators do not support live migration.", "Label value '...' violates
format constraints ...", "At most N vCPUs can be used along with K accelerator cards in an
instance.", "Number of accelerator cards attached to an instance must be one of [1, 2, 4].", "[gpu,
type] features are not compatible for creating instance.", "Boot disk must be the first disk
attached to the instance.", "The URL is malformed."), so code that matches on them behaves the same
against the emulator; elsewhere the message names the field and the rule broken."""

from __future__ import annotations

import re
import secrets
import time
import uuid
from typing import Any

from airflow_cloudtrain.catalog.gce import N1_ATTACH_LIMITS
from airflow_cloudtrain.emulator.gcp.gce_api import (
    API,
    ApiError,
    bad_request,
    fingerprint,
    invalid,
    not_found,
    numeric_id,
    required,
    rfc3339,
)
from airflow_cloudtrain.emulator.gcp.gce_catalog import GPU_OF_TYPE, Shape, catalog

__all__ = [
    "ApiError",
    "Shape",
    "bad_request",
    "build_instance",
    "catalog",
    "check_name",
    "check_request_id",
    "parse_zonal",
    "invalid",
    "not_found",
    "required",
]

_CPU_PLATFORM = {
    "N1": "Intel Broadwell",
    "N2": "Intel Cascade Lake",
    "A2": "Intel Cascade Lake",
    "G2": "Intel Cascade Lake",
    "A3": "Intel Sapphire Rapids",
}
NAME_RE = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
_NAME_RULE = "(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?|[1-9][0-9]{0,19})"
_LABEL_KEY_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_LABEL_VALUE_RE = re.compile(r"[a-z0-9_-]{0,63}")
_ZONAL_URL = r"(?:https?://[^/]+/compute/v1/)?(?:projects/[^/]+/)?zones/([^/]+)/{kind}/([^/]+)"
_NO_PD_STANDARD = ("g2-", "a3-")  # G2 and A3 take Balanced/SSD PD and Hyperdisk only
METADATA_VALUE_MAX = 262144
MAX_RUN_DURATION_S = (30, 120 * 86400)  # 30 s to 120 days


def parse_zonal(url: str, kind: str) -> tuple[str, str] | None:
    """(zone, name) of a zonal partial or full URL such as ``zones/z/machineTypes/t``."""
    m = re.fullmatch(_ZONAL_URL.format(kind=kind), url or "")
    return (m.group(1), m.group(2)) if m else None


def check_name(name: str | None) -> str:
    if not name:
        raise required("resource.name")
    if not NAME_RE.fullmatch(name):
        raise invalid("resource.name", name, f"Must be a match of regex '{_NAME_RULE}'")
    return name


def check_labels(labels: dict[str, str]) -> None:
    for key, value in labels.items():
        if not _LABEL_KEY_RE.fullmatch(key):
            raise invalid(
                "resource.labels",
                "",
                f"Label key '{key}' violates format constraints. The key must "
                "start with a lowercase character, can only contain lowercase letters, numeric "
                "characters, underscores and dashes. The key can be at most 63 characters long. "
                "International characters are allowed.",
            )
        if not _LABEL_VALUE_RE.fullmatch(value):
            raise invalid(
                "resource.labels",
                "",
                f"Label value '{value}' violates format constraints. The value "
                "can only contain lowercase letters, numeric characters, underscores and dashes. "
                "The value can be at most 63 characters long. International characters are allowed.",
            )


def check_network_tags(tags: dict[str, Any]) -> dict[str, Any]:
    """``tags.items``: at most 64 network tags, each a name (firewall rules target VMs by them)."""
    items = tags.get("items")
    if items is None:
        return {}
    if not isinstance(items, list) or len(items) > 64:
        raise invalid("resource.tags.items", items, "Must be a list of at most 64 network tags.")
    for i, tag in enumerate(items):
        if not isinstance(tag, str) or not NAME_RE.fullmatch(tag):
            raise invalid(f"resource.tags.items[{i}]", tag, f"Must be a match of regex '{NAME_RE.pattern}'")
    return {"items": list(dict.fromkeys(items))}


def check_request_id(request_id: str | None) -> None:
    try:
        ok = request_id is None or uuid.UUID(request_id).int != 0
    except ValueError:
        ok = False
    if not ok:
        raise invalid(
            "requestId",
            request_id,
            "The request ID must be a valid UUID with the exception that "
            "zero UUID is not supported (00000000-0000-0000-0000-000000000000).",
        )


def machine_shape(zone: str, given: str | None) -> Shape:
    if not given:
        raise required("resource.machineType")
    parsed = parse_zonal(given, "machineTypes")
    if parsed is None:
        raise invalid("resource.machineType", given, "The URL is malformed.")
    mzone, name = parsed
    if mzone != zone:
        raise invalid(
            "resource.machineType", given, f"Machine type zone '{mzone}' must be the instance zone '{zone}'."
        )
    shape = catalog().machines.get(zone, {}).get(name) or catalog().custom(zone, name, given)
    if shape is None:
        raise invalid(
            "resource.machineType", given, f"Machine type with name '{name}' does not exist in zone '{zone}'."
        )
    return shape


def check_accelerators(zone: str, shape: Shape, accels: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """GPUs attach only to N1 (T4, V100, P100, P4) within the per-count vCPU/memory caps."""
    out = []
    for i, acc in enumerate(accels):
        field = f"resource.guestAccelerators[{i}]"
        given = acc.get("acceleratorType", "")
        parsed = parse_zonal(given, "acceleratorTypes")
        if parsed is None:
            raise invalid(f"{field}.acceleratorType", given, "The URL is malformed.")
        azone, name = parsed
        if azone != zone or name not in catalog().accelerators.get(zone, {}):
            raise invalid(
                f"{field}.acceleratorType",
                given,
                f"Accelerator type '{name}' does not exist in zone '{zone}'.",
            )
        count = int(acc.get("acceleratorCount") or 0)
        gpu = GPU_OF_TYPE.get(name, "")
        if shape.family != "N1" or gpu not in N1_ATTACH_LIMITS:
            raise bad_request(f"[{name}, {shape.name}] features are not compatible for creating instance.")
        limits = N1_ATTACH_LIMITS[gpu]
        if count not in limits:
            raise invalid(
                f"{field}.acceleratorCount",
                count,
                f"Number of accelerator cards attached to an instance must be one of {sorted(limits)}.",
            )
        max_vcpus, max_gib = limits[count]
        if shape.vcpus > max_vcpus:
            raise invalid(
                f"{field}.acceleratorCount",
                count,
                f"At most {max_vcpus} vCPUs can be used along with {count} accelerator cards in an instance.",
            )
        if shape.memory_mb > max_gib * 1024:
            raise invalid(
                f"{field}.acceleratorCount",
                count,
                f"At most {max_gib} GB of memory can be used along "
                f"with {count} accelerator cards in an instance.",
            )
        out.append((name, count))
    return out


def check_scheduling(sched: dict[str, Any], has_gpus: bool) -> dict[str, Any]:
    """The scheduling block with the defaults the API fills in; Spot/preemptible defaults to TERMINATE."""
    model = sched.get("provisioningModel") or ("SPOT" if sched.get("preemptible") else "STANDARD")
    if model not in ("STANDARD", "SPOT"):
        raise invalid("resource.scheduling.provisioningModel", model, "Must be one of [SPOT, STANDARD].")
    spot = model == "SPOT" or bool(sched.get("preemptible"))
    ohm = sched.get("onHostMaintenance") or ("TERMINATE" if spot else "MIGRATE")
    if ohm not in ("MIGRATE", "TERMINATE"):
        raise invalid("resource.scheduling.onHostMaintenance", ohm, "Must be one of [MIGRATE, TERMINATE].")
    if spot and ohm != "TERMINATE":
        raise bad_request("Scheduling must have preemptible be false when OnHostMaintenance isn't TERMINATE.")
    restart = sched.get("automaticRestart", not spot)
    if spot and restart:
        raise bad_request("Scheduling must have automaticRestart be false when preemptible is true.")
    if has_gpus and ohm != "TERMINATE":
        raise bad_request("Instances with guest accelerators do not support live migration.")
    out = {
        **sched,
        "onHostMaintenance": ohm,
        "automaticRestart": restart,
        "preemptible": spot,
        "provisioningModel": model,
    }
    action = sched.get("instanceTerminationAction")
    if sched.get("maxRunDuration") is not None:
        out["maxRunDuration"] = check_run_duration(sched["maxRunDuration"])
        if action is None:  # the API does not guess what to do when the time is up
            raise required("resource.scheduling.instanceTerminationAction")
    if action is not None:
        if action not in ("DELETE", "STOP"):
            raise invalid(
                "resource.scheduling.instanceTerminationAction", action, "Must be one of [DELETE, STOP]."
            )
        if not spot and not sched.get("maxRunDuration") and not sched.get("terminationTime"):
            raise invalid(
                "resource.scheduling.instanceTerminationAction",
                action,
                "Instance termination action "
                "can only be specified for Spot VMs or VMs with a max run duration or termination time.",
            )
    elif spot:
        out["instanceTerminationAction"] = "STOP"
    return out


def check_run_duration(value: Any) -> dict[str, Any]:
    """``scheduling.maxRunDuration``, a Duration (``{"seconds": "3600"}``: int64 as a JSON string), in
    MAX_RUN_DURATION_S; as GET shows it."""
    field = "resource.scheduling.maxRunDuration"
    if not isinstance(value, dict):
        raise invalid(field, value, "Must be a Duration with 'seconds'.")
    seconds, nanos = value.get("seconds", 0), value.get("nanos", 0)
    try:
        whole, frac = int(str(seconds)), int(str(nanos))
    except ValueError:
        raise invalid(f"{field}.seconds", seconds, "Must be an integer number of seconds.") from None
    if not 0 <= frac < 10**9:
        raise invalid(f"{field}.nanos", nanos, "Must be between 0 and 999999999.")
    low, high = MAX_RUN_DURATION_S
    if not low <= whole <= high:
        raise invalid(
            f"{field}.seconds",
            whole,
            f"Max run duration must be between {low} seconds and {high // 86400} days ({high} seconds).",
        )
    return {"seconds": str(whole), **({"nanos": frac} if frac else {})}


def check_disks(zone: str, shape: Shape, disks: list[dict[str, Any]]) -> None:
    if not any(d.get("boot") for d in disks):
        raise invalid("resource.disks", "", "Boot disk must be specified.")
    for i, disk in enumerate(disks):
        field = f"resource.disks[{i}]"
        if disk.get("boot") and i:
            raise invalid(field, "", "Boot disk must be the first disk attached to the instance.")
        params = disk.get("initializeParams")
        if params is not None and disk.get("source"):
            raise invalid(field, "", "Cannot specify both 'source' and 'initializeParams'.")
        if params is None and not disk.get("source"):
            raise invalid(field, "", "Either 'source' or 'initializeParams' must be specified.")
        params = params or {}
        if disk.get("boot") and params and not (params.get("sourceImage") or params.get("sourceSnapshot")):
            raise required(f"{field}.initializeParams.sourceImage")
        if "diskSizeGb" in params and not str(params["diskSizeGb"]).isdigit():
            raise invalid(f"{field}.initializeParams.diskSizeGb", params["diskSizeGb"], "Must be an integer.")
        if params.get("diskType"):
            parsed = parse_zonal(params["diskType"], "diskTypes")
            if parsed is None or parsed[0] != zone:
                raise invalid(
                    f"{field}.initializeParams.diskType", params["diskType"], "The URL is malformed."
                )
            if parsed[1] == "pd-standard" and shape.name.startswith(_NO_PD_STANDARD):
                raise bad_request(
                    f"[pd-standard, {shape.name}] features are not compatible for creating instance."
                )


def check_metadata(metadata: dict[str, Any]) -> dict[str, str]:
    items: dict[str, str] = {}
    for item in metadata.get("items", []):
        key, value = item.get("key", ""), item.get("value", "")
        if not re.fullmatch(r"[a-zA-Z0-9_-]{1,128}", key):
            raise invalid("resource.metadata", "", f"Metadata key '{key}' violates format constraints.")
        if key in items:
            raise invalid("resource.metadata", "", "Metadata has duplicate keys.")
        if len(value) > METADATA_VALUE_MAX:
            raise invalid(
                "resource.metadata",
                "",
                f"Value for field 'resource.metadata' is too large: maximum "
                f"size {METADATA_VALUE_MAX} character(s); actual size {len(value)}.",
            )
        items[key] = value
    return items


_SHIELDED = ("enableSecureBoot", "enableVtpm", "enableIntegrityMonitoring")
_SHIELDED_DEFAULT = {"enableSecureBoot": False, "enableVtpm": True, "enableIntegrityMonitoring": True}
_SCOPE_PREFIX = "https://www.googleapis.com/auth/"


def check_service_accounts(accounts: list[dict[str, Any]]) -> None:
    """One service account at most, its scopes as full URLs (``gcloud`` expands aliases such as
    ``cloud-platform``; the API does not)."""
    if len(accounts) > 1:
        raise invalid("resource.serviceAccounts", "", "At most one service account may be specified.")
    for i, account in enumerate(accounts):
        for j, scope in enumerate(account.get("scopes") or []):
            if not str(scope).startswith(_SCOPE_PREFIX):
                raise invalid(f"resource.serviceAccounts[{i}].scopes[{j}]", scope, "The URL is malformed.")


def check_shielded(config: dict[str, Any]) -> dict[str, bool]:
    """``shieldedInstanceConfig`` as GET shows it: the given booleans over the API's defaults."""
    for key, value in config.items():
        if key not in _SHIELDED or not isinstance(value, bool):
            raise invalid(f"resource.shieldedInstanceConfig.{key}", value, "Must be a boolean.")
    return {**_SHIELDED_DEFAULT, **config}


# --- resources as the API shows them ------------------------------------------------------------------


def build_instance(
    project: str, zone: str, body: dict[str, Any]
) -> tuple[dict[str, Any], bool, dict[str, str]]:
    """Validate an ``instances.insert`` body; the instance resource (no status yet), spot?, metadata."""
    name = check_name(body.get("name"))
    shape = machine_shape(zone, body.get("machineType"))
    labels = body.get("labels") or {}
    check_labels(labels)
    gpus = check_accelerators(zone, shape, body.get("guestAccelerators") or []) or (
        [shape.gpus] if shape.gpus else []
    )
    scheduling = check_scheduling(body.get("scheduling") or {}, bool(gpus))
    disks = body.get("disks") or []
    check_disks(zone, shape, disks)
    metadata = check_metadata(body.get("metadata") or {})
    check_service_accounts(body.get("serviceAccounts") or [])
    shielded = check_shielded(body.get("shieldedInstanceConfig") or {})
    tags = check_network_tags(body.get("tags") or {})
    base = f"{API}/projects/{project}/zones/{zone}"
    nics = []
    for i, nic in enumerate(body.get("networkInterfaces") or [{}]):
        configs = [
            {
                **c,
                "kind": "compute#accessConfig",
                "natIP": f"34.{secrets.randbelow(256)}.{secrets.randbelow(256)}.7",
            }
            for c in nic.get("accessConfigs", [])
        ]
        nics.append(
            {
                "network": f"{API}/projects/{project}/global/networks/default",
                **nic,
                "accessConfigs": configs,
                "kind": "compute#networkInterface",
                "name": f"nic{i}",
                "fingerprint": fingerprint(),
                "networkIP": f"10.128.{secrets.randbelow(256)}.{2 + secrets.randbelow(250)}",
            }
        )
    attached = []
    for i, disk in enumerate(disks):
        params = disk.get("initializeParams") or {}
        disk_name = params.get("diskName") or (name if i == 0 else f"{name}-{i}")
        attached.append(
            {
                **{k: x for k, x in disk.items() if k != "initializeParams"},
                "kind": "compute#attachedDisk",
                "type": disk.get("type", "PERSISTENT"),
                "mode": disk.get("mode", "READ_WRITE"),
                "source": disk.get("source") or f"{base}/disks/{disk_name}",
                "index": i,
                "deviceName": disk.get("deviceName") or f"persistent-disk-{i}",
                "boot": bool(disk.get("boot")),
                "autoDelete": bool(disk.get("autoDelete")),
                "interface": disk.get("interface", "SCSI"),
                "diskSizeGb": str(params.get("diskSizeGb") or disk.get("diskSizeGb") or 10),
            }
        )
    res = {
        "kind": "compute#instance",
        "id": numeric_id(),
        "creationTimestamp": rfc3339(time.time()),
        "name": name,
        "description": body.get("description", ""),
        "tags": {**tags, "fingerprint": fingerprint()},
        "machineType": f"{base}/machineTypes/{shape.name}",
        "zone": base,
        "canIpForward": bool(body.get("canIpForward")),
        "networkInterfaces": nics,
        "disks": attached,
        "scheduling": scheduling,
        "labels": labels,
        "metadata": {
            "kind": "compute#metadata",
            "fingerprint": fingerprint(),
            "items": (body.get("metadata") or {}).get("items", []),
        },
        "serviceAccounts": body.get("serviceAccounts", []),
        "shieldedInstanceConfig": shielded,
        "selfLink": f"{base}/instances/{name}",
        "cpuPlatform": _CPU_PLATFORM.get(shape.family, "Intel Broadwell"),
        "labelFingerprint": fingerprint(),
        "startRestricted": False,
        "deletionProtection": bool(body.get("deletionProtection")),
        "fingerprint": fingerprint(),
    }
    policies = body.get("resourcePolicies") or []
    if policies:  # a placement policy of the VM's region (``gce_policies``), shown as a full URL
        region = f"{API}/projects/{project}/regions/{catalog().zones[zone]}/resourcePolicies/"
        res["resourcePolicies"] = [
            p if p.startswith("https://") else region + p.rsplit("/", 1)[-1] for p in policies
        ]
    if gpus:
        res["guestAccelerators"] = [
            {"acceleratorType": f"{base}/acceleratorTypes/{n}", "acceleratorCount": c} for n, c in gpus
        ]
    return res, scheduling["preemptible"], metadata
