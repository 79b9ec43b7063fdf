"""What the emulated Compute Engine knows, checks and shows: the zones, machine types and GPUs of the
price snapshot, the rules ``instances.insert`` enforces, the resources as the API renders them, and the
``filter`` / paging of list calls.

Kept apart from the HTTP server and its state (``gce.py``) so the rules read as one list. Error texts
follow the real API's wording where it is known from real responses ("Invalid value for field ...",
"Required field ... not specified", "Memory should be a multiple of 256MiB, while ...", "Instances
with guest accelerators do not support live migration.", "Label value '...' violates format
constraints ...", "At most N vCPUs can be used along with K accelerator cards in an instance.",
"Number of accelerator cards attached to an instance must be one of [1, 2, 4].", "[gpu, type]
features are not compatible for creating instance.", "Boot disk must be the first disk attached to
the instance.", "The URL is malformed."), so code that matches on them behaves the same against the
emulator; elsewhere the message names the field and the rule broken."""

from __future__ import annotations

import base64
import math
import re
import secrets
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from typing import Any

from airflow_cloudtrain.catalog.gce import (
    ACCELERATOR_TYPES,
    CUSTOM_FAMILIES,
    N1_ATTACH_LIMITS,
    CustomFamily,
    bundled_gpus,
)
from airflow_cloudtrain.catalog.snapshot import snapshot_rows

API = "https://www.googleapis.com/compute/v1"  # what selfLinks carry, as in production
_TZ = timezone(timedelta(hours=-7))  # the real API writes RFC 3339 in Pacific time, never "Z"

GPU_OF_TYPE = {v: k for k, v in ACCELERATOR_TYPES.items()}

_CPU_PLATFORM = {"N1": "Intel Broadwell", "N2": "Intel Cascade Lake", "A2": "Intel Cascade Lake",
                 "G2": "Intel Cascade Lake", "A3": "Intel Sapphire Rapids"}  # fmt: skip
_STATUS = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 409: "ALREADY_EXISTS"}
NAME_RE = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
_NAME_RULE = "(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?|[1-9][0-9]{0,19})"
_LABEL_KEY_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_LABEL_VALUE_RE = re.compile(r"[a-z0-9_-]{0,63}")
_ZONAL_URL = r"(?:https?://[^/]+/compute/v1/)?(?:projects/[^/]+/)?zones/([^/]+)/{kind}/([^/]+)"
_CUSTOM_RE = re.compile(r"(custom|n1-custom|n2-custom)-(\d+)-(\d+)(-ext)?")
_NO_PD_STANDARD = ("g2-", "a3-")  # G2 and A3 take Balanced/SSD PD and Hyperdisk only
METADATA_VALUE_MAX = 262144


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, _TZ).isoformat(timespec="milliseconds")


def numeric_id() -> str:
    return str(10**18 + secrets.randbelow(8 * 10**18))


def fingerprint() -> str:
    return base64.b64encode(secrets.token_bytes(8)).decode()


class ApiError(Exception):
    """An HTTP error in the Compute API's JSON shape; ``reason`` is the ``errors[0].reason``."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "domain": "global", "reason": self.reason}
        return {"error": {"code": self.code, "message": self.message, "errors": [error],
                          "status": _STATUS.get(self.code, "UNKNOWN")}}  # fmt: skip


def invalid(field: str, value: object, why: str) -> ApiError:
    return ApiError(400, "invalid", f"Invalid value for field '{field}': '{value}'. {why}")


def required(field: str) -> ApiError:
    return ApiError(400, "required", f"Required field '{field}' not specified")


def bad_request(message: str) -> ApiError:
    return ApiError(400, "badRequest", message)


def not_found(path: str) -> ApiError:
    return ApiError(404, "notFound", f"The resource '{path}' was not found")


@dataclass(frozen=True)
class Shape:
    """A machine type as ``machineTypes.get`` describes it; ``gpus`` only for bundled GPUs."""

    name: str
    vcpus: int
    memory_mb: int
    gpus: tuple[str, int] | None = None  # (GCE accelerator type name, count)

    @property
    def family(self) -> str:
        return "N1" if self.name.startswith(("n1-", "custom-")) else self.name.split("-")[0].upper()


class Catalog:
    """Zones, machine types and accelerator types per zone, as the snapshot's ``gcp.csv`` lists them.

    The snapshot has no N2 rows; N2 is offered in every zone it lists, so ``n2-custom-*`` is
    accepted in all of them.
    """

    def __init__(self) -> None:
        self.zones: dict[str, str] = {}  # zone -> region
        self.machines: dict[str, dict[str, Shape]] = {}
        self.accelerators: dict[str, dict[str, int]] = {}  # zone -> type -> max cards
        for row in snapshot_rows("gcp"):
            for zone in row.zones:
                self.zones[zone] = row.region
                if row.instance_type:
                    bundled = bundled_gpus(row.instance_type)
                    gpus = (ACCELERATOR_TYPES[bundled[0]], bundled[1]) if bundled else None
                    shape = Shape(row.instance_type, int(row.vcpus), round(row.memory_gib * 1024), gpus)
                    self.machines.setdefault(zone, {})[row.instance_type] = shape
                elif row.accelerator in ACCELERATOR_TYPES:
                    types = self.accelerators.setdefault(zone, {})
                    name = ACCELERATOR_TYPES[row.accelerator]
                    types[name] = max(types.get(name, 0), row.accelerator_count)

    def custom(self, zone: str, name: str, given: str) -> Shape | None:
        """The shape of a custom machine type name, None if it is not one; ApiError if it breaks a rule."""
        m = _CUSTOM_RE.fullmatch(name)
        if not m:
            return None
        fam: CustomFamily = (
            CUSTOM_FAMILIES[0] if m.group(1) in ("custom", "n1-custom") else CUSTOM_FAMILIES[1]
        )
        if fam.name == "N1" and not any(t.startswith("n1-") for t in self.machines.get(zone, {})):
            return None
        n, mib = int(m.group(2)), int(m.group(3))
        field = "resource.machineType"
        if not fam.valid_vcpus(n):
            rule = (
                "1 or an even number" if fam.name == "N1" else "an even number up to 32, then a multiple of 4"
            )
            raise invalid(field, given, f"Invalid number of vCPUs {n} for a custom {fam.name} machine type: "
                                        f"it must be {rule}, at most {fam.max_vcpus}.")  # fmt: skip
        if mib % 256:
            raise invalid(
                field, given, f"Memory should be a multiple of 256MiB, while {mib}MiB is requested."
            )
        low = math.ceil(fam.min_gib_per_vcpu * 1024 * n / 256) * 256
        high = math.floor(fam.max_gib_per_vcpu * 1024 * n / 256) * 256
        if mib < low or (mib > high and not m.group(4)):
            raise invalid(field, given, f"Memory should be between {low}MiB and {high}MiB for {n} CPU"
                                        f"{'s' if n > 1 else ''}, while {mib}MiB is requested.")  # fmt: skip
        return Shape(name, n, mib)


@lru_cache(maxsize=1)
def catalog() -> Catalog:
    return Catalog()


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
            raise invalid("resource.labels", "", f"Label key '{key}' violates format constraints. The key must "
                          "start with a lowercase character, can only contain lowercase letters, numeric "
                          "characters, underscores and dashes. The key can be at most 63 characters long. "
                          "International characters are allowed.")  # fmt: skip
        if not _LABEL_VALUE_RE.fullmatch(value):
            raise invalid("resource.labels", "", f"Label value '{value}' violates format constraints. The value "
                          "can only contain lowercase letters, numeric characters, underscores and dashes. "
                          "The value can be at most 63 characters long. International characters are allowed.")  # fmt: skip


def check_request_id(request_id: str | None) -> None:
    try:
        ok = request_id is None or uuid.UUID(request_id).int != 0
    except ValueError:
        ok = False
    if not ok:
        raise invalid("requestId", request_id, "The request ID must be a valid UUID with the exception that "
                      "zero UUID is not supported (00000000-0000-0000-0000-000000000000).")  # fmt: skip


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
            raise invalid(f"{field}.acceleratorType", given,
                          f"Accelerator type '{name}' does not exist in zone '{zone}'.")  # fmt: skip
        count = int(acc.get("acceleratorCount") or 0)
        gpu = GPU_OF_TYPE.get(name, "")
        if shape.family != "N1" or gpu not in N1_ATTACH_LIMITS:
            raise bad_request(f"[{name}, {shape.name}] features are not compatible for creating instance.")
        limits = N1_ATTACH_LIMITS[gpu]
        if count not in limits:
            raise invalid(f"{field}.acceleratorCount", count, "Number of accelerator cards attached to an instance "
                          f"must be one of {sorted(limits)}.")  # fmt: skip
        max_vcpus, max_gib = limits[count]
        if shape.vcpus > max_vcpus:
            raise invalid(f"{field}.acceleratorCount", count,
                          f"At most {max_vcpus} vCPUs can be used along with {count} accelerator cards in an instance.")  # fmt: skip
        if shape.memory_mb > max_gib * 1024:
            raise invalid(f"{field}.acceleratorCount", count, f"At most {max_gib} GB of memory can be used along "
                          f"with {count} accelerator cards in an instance.")  # fmt: skip
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
    out = {**sched, "onHostMaintenance": ohm, "automaticRestart": restart, "preemptible": spot,
           "provisioningModel": model}  # fmt: skip
    action = sched.get("instanceTerminationAction")
    if action is not None:
        if action not in ("DELETE", "STOP"):
            raise invalid(
                "resource.scheduling.instanceTerminationAction", action, "Must be one of [DELETE, STOP]."
            )
        if not spot and not sched.get("maxRunDuration") and not sched.get("terminationTime"):
            raise invalid("resource.scheduling.instanceTerminationAction", action, "Instance termination action "
                          "can only be specified for Spot VMs or VMs with a max run duration or termination time.")  # fmt: skip
    elif spot:
        out["instanceTerminationAction"] = "STOP"
    return out


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
            raise invalid("resource.metadata", "", f"Value for field 'resource.metadata' is too large: maximum "
                          f"size {METADATA_VALUE_MAX} character(s); actual size {len(value)}.")  # fmt: skip
        items[key] = value
    return items


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
    base = f"{API}/projects/{project}/zones/{zone}"
    nics = []
    for i, nic in enumerate(body.get("networkInterfaces") or [{}]):
        configs = [{**c, "kind": "compute#accessConfig", "natIP": f"34.{secrets.randbelow(256)}.{secrets.randbelow(256)}.7"}
                   for c in nic.get("accessConfigs", [])]  # fmt: skip
        nics.append({"network": f"{API}/projects/{project}/global/networks/default", **nic, "accessConfigs": configs,
                     "kind": "compute#networkInterface", "name": f"nic{i}", "fingerprint": fingerprint(),
                     "networkIP": f"10.128.{secrets.randbelow(256)}.{2 + secrets.randbelow(250)}"})  # fmt: skip
    attached = []
    for i, disk in enumerate(disks):
        params = disk.get("initializeParams") or {}
        disk_name = params.get("diskName") or (name if i == 0 else f"{name}-{i}")
        attached.append({**{k: x for k, x in disk.items() if k != "initializeParams"}, "kind": "compute#attachedDisk",
                         "type": disk.get("type", "PERSISTENT"), "mode": disk.get("mode", "READ_WRITE"),
                         "source": disk.get("source") or f"{base}/disks/{disk_name}", "index": i,
                         "deviceName": disk.get("deviceName") or f"persistent-disk-{i}", "boot": bool(disk.get("boot")),
                         "autoDelete": bool(disk.get("autoDelete")), "interface": disk.get("interface", "SCSI"),
                         "diskSizeGb": str(params.get("diskSizeGb") or disk.get("diskSizeGb") or 10)})  # fmt: skip
    res = {
        "kind": "compute#instance", "id": numeric_id(), "creationTimestamp": rfc3339(time.time()), "name": name,
        "description": body.get("description", ""), "tags": {**(body.get("tags") or {}), "fingerprint": fingerprint()},
        "machineType": f"{base}/machineTypes/{shape.name}", "zone": base, "canIpForward": bool(body.get("canIpForward")),
        "networkInterfaces": nics, "disks": attached, "scheduling": scheduling, "labels": labels,
        "metadata": {"kind": "compute#metadata", "fingerprint": fingerprint(), "items": (body.get("metadata") or {}).get("items", [])},
        "serviceAccounts": body.get("serviceAccounts", []), "selfLink": f"{base}/instances/{name}",
        "cpuPlatform": _CPU_PLATFORM.get(shape.family, "Intel Broadwell"), "labelFingerprint": fingerprint(),
        "startRestricted": False, "deletionProtection": bool(body.get("deletionProtection")), "fingerprint": fingerprint(),
    }  # fmt: skip
    if gpus:
        res["guestAccelerators"] = [{"acceleratorType": f"{base}/acceleratorTypes/{n}", "acceleratorCount": c}
                                    for n, c in gpus]  # fmt: skip
    return res, scheduling["preemptible"], metadata


def zone_resource(project: str, zone: str) -> dict[str, Any]:
    link = f"{API}/projects/{project}"
    return {"kind": "compute#zone", "id": str(2000 + sorted(catalog().zones).index(zone)), "name": zone,
            "creationTimestamp": "1969-12-31T16:00:00.000-08:00", "description": zone, "status": "UP",
            "region": f"{link}/regions/{catalog().zones[zone]}", "selfLink": f"{link}/zones/{zone}",
            "supportsPzs": False}  # fmt: skip


def machine_type_resource(project: str, zone: str, shape: Shape) -> dict[str, Any]:
    out = {"kind": "compute#machineType", "id": str(int.from_bytes(shape.name.encode()[:6], "big")), "zone": zone,
           "name": shape.name, "description": f"{shape.vcpus} vCPUs, {shape.memory_mb / 1024:g} GB RAM",
           "guestCpus": shape.vcpus, "memoryMb": shape.memory_mb, "maximumPersistentDisks": 128,
           "maximumPersistentDisksSizeGb": "263168", "isSharedCpu": False, "architecture": "X86_64",
           "selfLink": f"{API}/projects/{project}/zones/{zone}/machineTypes/{shape.name}"}  # fmt: skip
    if shape.gpus:
        out["accelerators"] = [
            {"guestAcceleratorType": shape.gpus[0], "guestAcceleratorCount": shape.gpus[1]}
        ]
    return out


def accelerator_type_resource(project: str, zone: str, name: str, max_cards: int) -> dict[str, Any]:
    link = f"{API}/projects/{project}/zones/{zone}"
    return {"kind": "compute#acceleratorType", "id": str(int.from_bytes(name.encode()[-6:], "big")), "name": name,
            "description": f"NVIDIA {GPU_OF_TYPE[name]}", "zone": link, "maximumCardsPerInstance": max_cards,
            "selfLink": f"{link}/acceleratorTypes/{name}"}  # fmt: skip


# --- list filters and paging ------------------------------------------------------------------------

_TOKEN = re.compile(r'\s*(\(|\)|"(?:[^"\\]|\\.)*"|\'[^\']*\'|!=|=|:|[^\s()=!:"\']+)')


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text.rstrip()):
        m = _TOKEN.match(text, pos)
        if not m:
            raise invalid("filter", text, "Invalid list filter expression.")
        out.append(m.group(1))
        pos = m.end()
    return out


def _lookup(resource: dict[str, Any], field: str) -> Any:
    value: Any = resource
    for part in field.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _compare(resource: dict[str, Any], field: str, op: str, literal: str) -> bool:
    if literal[:1] in "\"'":
        literal = literal[1:-1]
    value = _lookup(resource, field)
    if op == ":":
        return value is not None and (literal == "*" or literal in _text(value))
    if op in ("eq", "ne"):
        hit = value is not None and re.fullmatch(literal, _text(value)) is not None
        return hit if op == "eq" else not hit
    hit = value is not None and _text(value) == literal
    return hit if op == "=" else not hit


def compile_filter(text: str | None) -> Any:
    """``filter`` of Compute list calls -> predicate. Supports ``field = v``, ``!=``, ``eq``/``ne`` (RE2
    full match), ``field:*`` (present), nested fields (``labels.k``, ``scheduling.preemptible``),
    parentheses, implicit or explicit AND, and OR."""
    if not text or not text.strip():
        return lambda resource: True
    toks = _tokens(text)
    pos = 0

    def expr() -> Any:
        nonlocal pos
        terms = [conj()]
        while pos < len(toks) and toks[pos].upper() == "OR":
            pos += 1
            terms.append(conj())
        return lambda r: any(t(r) for t in terms)

    def conj() -> Any:
        nonlocal pos
        terms = [term()]
        while pos < len(toks) and toks[pos] != ")" and toks[pos].upper() != "OR":
            if toks[pos].upper() == "AND":
                pos += 1
            terms.append(term())
        return lambda r: all(t(r) for t in terms)

    def term() -> Any:
        nonlocal pos
        if pos < len(toks) and toks[pos] == "(":
            pos += 1
            inner = expr()
            if pos >= len(toks) or toks[pos] != ")":
                raise invalid("filter", text, "Invalid list filter expression: unbalanced parentheses.")
            pos += 1
            return inner
        if pos + 3 > len(toks):
            raise invalid("filter", text, "Invalid list filter expression.")
        field, op, literal = toks[pos], toks[pos + 1], toks[pos + 2]
        if op not in ("=", "!=", ":", "eq", "ne"):
            raise invalid("filter", text, f"Invalid list filter expression: unsupported operator '{op}'.")
        pos += 3
        return lambda r: _compare(r, field, op, literal)

    predicate = expr()
    if pos != len(toks):
        raise invalid("filter", text, "Invalid list filter expression.")
    return predicate


def page(items: list[Any], max_results: str | None, page_token: str | None) -> tuple[list[Any], str | None]:
    """One page of ``items`` (``maxResults`` default and cap 500) and the next page's token, if any."""
    size = min(int(max_results or 500), 500)
    if size < 0:
        raise invalid("maxResults", max_results, "Must be between 0 and 500.")
    size = size or 500
    try:
        start = int(base64.urlsafe_b64decode(page_token.encode()).decode()) if page_token else 0
    except (ValueError, UnicodeDecodeError):
        raise invalid("pageToken", page_token, "Invalid page token.") from None
    end = start + size
    token = base64.urlsafe_b64encode(str(end).encode()).decode() if end < len(items) else None
    return items[start:end], token
