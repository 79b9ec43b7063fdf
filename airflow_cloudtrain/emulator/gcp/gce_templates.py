"""Instance templates: the rules ``instanceTemplates.insert`` enforces, the template resource, and the
``instances.insert`` body a managed instance group builds from a template for each of its VMs.

A global template names zonal resources by their bare names (``machineType: n1-standard-4``, an
accelerator's ``acceleratorType: nvidia-tesla-t4``, a disk's ``initializeParams.diskType:
pd-balanced``), since it serves groups in any zone; a URL there is refused. Everything else is checked
as ``instances.insert`` checks it (``gce_validate.build_instance``), in the first zone that offers the
machine type and the accelerators, with the fields renamed ``resource.properties.*``: a template the
emulator accepts is one whose VMs it would accept, so a bad launch shape fails at the template, where
the product can report it, not later inside a group where it only shows as members stuck CREATING.
Whether the group's own zone offers the machine type shows only when the group creates a VM (the
member's ``lastAttempt``), as on the real API.
"""

from __future__ import annotations

import copy
import re
import time
from typing import Any

from airflow_cloudtrain.emulator.gcp import gce_validate as v
from airflow_cloudtrain.emulator.gcp.gce_api import API, ApiError, fingerprint, numeric_id, rfc3339

_TEMPLATE_URL = re.compile(
    r"(?:https?://[^/]+/compute/v1/)?(?:projects/([^/]+)/)?global/instanceTemplates/([^/]+)"
)
_FIELD = "resource.properties"
CREATED_BY = "created-by"  # metadata items the group adds to each of its VMs, as the real API does
INSTANCE_TEMPLATE = "instance-template"


def template_link(project: str, name: str) -> str:
    return f"{API}/projects/{project}/global/instanceTemplates/{name}"


def parse_template_url(url: str) -> tuple[str | None, str] | None:
    """(project or None, name) of a template's full or partial URL (``global/instanceTemplates/t``)."""
    m = _TEMPLATE_URL.fullmatch(url or "")
    return (m.group(1), m.group(2)) if m else None


def build_template(project: str, body: dict[str, Any]) -> dict[str, Any]:
    """Validate an ``instanceTemplates.insert`` body; the template resource as ``get`` shows it."""
    name = v.check_name(body.get("name"))
    props = body.get("properties")
    if not isinstance(props, dict) or not props:
        raise v.required(_FIELD)
    machine = props.get("machineType")
    if not machine:
        raise v.required(f"{_FIELD}.machineType")
    _bare(f"{_FIELD}.machineType", machine)
    accelerators = [a.get("acceleratorType", "") for a in props.get("guestAccelerators") or []]
    for i, accelerator in enumerate(accelerators):
        _bare(f"{_FIELD}.guestAccelerators[{i}].acceleratorType", accelerator)
    for i, disk in enumerate(props.get("disks") or []):
        if disk_type := (disk.get("initializeParams") or {}).get("diskType"):
            _bare(f"{_FIELD}.disks[{i}].initializeParams.diskType", disk_type)
    try:
        zone = _zone_offering(machine, accelerators)
        res, _, _ = v.build_instance(project, zone, instance_body(props, zone, "template-check"))
    except ApiError as exc:  # the instance's rule, in the template's terms
        message = exc.message.replace("'resource.", f"'{_FIELD}.")
        raise ApiError(exc.code, exc.reason, message, exc.domain) from None
    shown = copy.deepcopy(props)
    shown["scheduling"] = res["scheduling"]
    shown["shieldedInstanceConfig"] = res["shieldedInstanceConfig"]
    shown["metadata"] = {
        "kind": "compute#metadata",
        "fingerprint": fingerprint(),
        "items": (props.get("metadata") or {}).get("items", []),
    }
    return {
        "kind": "compute#instanceTemplate",
        "id": numeric_id(),
        "creationTimestamp": rfc3339(time.time()),
        "name": name,
        "description": body.get("description", ""),
        "properties": shown,
        "selfLink": template_link(project, name),
    }


def instance_body(
    props: dict[str, Any], zone: str, name: str, metadata: dict[str, str] | None = None
) -> dict[str, Any]:
    """The ``instances.insert`` body of a VM named ``name`` in ``zone`` made from template properties:
    bare type names become the zone's, and ``metadata`` items are added (replacing any of that key)."""
    body = copy.deepcopy(props)
    body["name"] = name
    body["machineType"] = f"zones/{zone}/machineTypes/{props['machineType']}"
    for accelerator in body.get("guestAccelerators") or []:
        accelerator["acceleratorType"] = f"zones/{zone}/acceleratorTypes/{accelerator.get('acceleratorType')}"
    for disk in body.get("disks") or []:
        params = disk.get("initializeParams") or {}
        if params.get("diskType"):
            params["diskType"] = f"zones/{zone}/diskTypes/{params['diskType']}"
    if metadata:
        items = [i for i in (body.get("metadata") or {}).get("items", []) if i.get("key") not in metadata]
        body["metadata"] = {"items": items + [{"key": k, "value": x} for k, x in metadata.items()]}
    return body


def _bare(field: str, value: str) -> None:
    if "/" in value:
        raise v.invalid(field, value, "A template names it by its name, not by a URL.")


def _zone_offering(machine: str, accelerators: list[str]) -> str:
    """The first zone offering the machine type (a custom shape within its family's rules) and every
    accelerator: where the template's VMs are validated."""
    cat = v.catalog()
    with_machine = [
        z for z in sorted(cat.zones) if machine in cat.machines.get(z, {}) or cat.custom(z, machine, machine)
    ]
    if not with_machine:
        raise v.invalid(
            f"{_FIELD}.machineType", machine, f"Machine type with name '{machine}' does not exist."
        )
    for zone in with_machine:
        if all(a in cat.accelerators.get(zone, {}) for a in accelerators):
            return zone
    offered = {a for z in with_machine for a in cat.accelerators.get(z, {})}
    missing = next((a for a in accelerators if a not in offered), accelerators[-1])
    field = f"{_FIELD}.guestAccelerators[{accelerators.index(missing)}].acceleratorType"
    raise v.invalid(
        field, missing, f"Accelerator type '{missing}' does not exist in any zone offering '{machine}'."
    )
