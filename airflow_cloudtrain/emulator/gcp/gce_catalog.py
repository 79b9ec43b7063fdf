"""What the emulated Compute Engine offers: the zones, machine types and GPUs of the price snapshot,
custom shapes within their family's rules, and those resources as the API renders them."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from airflow_cloudtrain.catalog.gce import ACCELERATOR_TYPES, CUSTOM_FAMILIES, CustomFamily, bundled_gpus
from airflow_cloudtrain.catalog.snapshot import snapshot_rows
from airflow_cloudtrain.emulator.gcp.gce_api import API, invalid

GPU_OF_TYPE = {v: k for k, v in ACCELERATOR_TYPES.items()}
_CUSTOM_RE = re.compile(r"(custom|n1-custom|n2-custom)-(\d+)-(\d+)(-ext)?")


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
            raise invalid(
                field,
                given,
                f"Invalid number of vCPUs {n} for a custom {fam.name} machine type: "
                f"it must be {rule}, at most {fam.max_vcpus}.",
            )
        if mib % 256:
            raise invalid(
                field, given, f"Memory should be a multiple of 256MiB, while {mib}MiB is requested."
            )
        low = math.ceil(fam.min_gib_per_vcpu * 1024 * n / 256) * 256
        high = math.floor(fam.max_gib_per_vcpu * 1024 * n / 256) * 256
        if mib < low or (mib > high and not m.group(4)):
            raise invalid(
                field,
                given,
                f"Memory should be between {low}MiB and {high}MiB for {n} CPU"
                f"{'s' if n > 1 else ''}, while {mib}MiB is requested.",
            )
        return Shape(name, n, mib)


@lru_cache(maxsize=1)
def catalog() -> Catalog:
    return Catalog()


def zone_resource(project: str, zone: str) -> dict[str, Any]:
    link = f"{API}/projects/{project}"
    return {
        "kind": "compute#zone",
        "id": str(2000 + sorted(catalog().zones).index(zone)),
        "name": zone,
        "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
        "description": zone,
        "status": "UP",
        "region": f"{link}/regions/{catalog().zones[zone]}",
        "selfLink": f"{link}/zones/{zone}",
        "supportsPzs": False,
    }


def machine_type_resource(project: str, zone: str, shape: Shape) -> dict[str, Any]:
    out = {
        "kind": "compute#machineType",
        "id": str(int.from_bytes(shape.name.encode()[:6], "big")),
        "zone": zone,
        "name": shape.name,
        "description": f"{shape.vcpus} vCPUs, {shape.memory_mb / 1024:g} GB RAM",
        "guestCpus": shape.vcpus,
        "memoryMb": shape.memory_mb,
        "maximumPersistentDisks": 128,
        "maximumPersistentDisksSizeGb": "263168",
        "isSharedCpu": False,
        "architecture": "X86_64",
        "selfLink": f"{API}/projects/{project}/zones/{zone}/machineTypes/{shape.name}",
    }
    if shape.gpus:
        out["accelerators"] = [
            {"guestAcceleratorType": shape.gpus[0], "guestAcceleratorCount": shape.gpus[1]}
        ]
    return out


def accelerator_type_resource(project: str, zone: str, name: str, max_cards: int) -> dict[str, Any]:
    link = f"{API}/projects/{project}/zones/{zone}"
    return {
        "kind": "compute#acceleratorType",
        "id": str(int.from_bytes(name.encode()[-6:], "big")),
        "name": name,
        "description": f"NVIDIA {GPU_OF_TYPE[name]}",
        "zone": link,
        "maximumCardsPerInstance": max_cards,
        "selfLink": f"{link}/acceleratorTypes/{name}",
    }
