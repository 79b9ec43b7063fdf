"""Compute Engine shapes: predefined types, custom shapes, and which GPUs go with which family.

The catalog rules of the GCP provider, beside ``catalog.ec2`` (same functions; ``catalog.rules(cloud)``
returns one or the other). GCE differs from EC2 in two ways the catalog must know about. Machines can be *custom*
(``custom-N-M``), inside a per-family memory-per-vCPU range; the snapshot has no price for those,
so per-vCPU and per-GiB rates are *derived* by least squares from the same family's predefined
prices in the same region (``Offer.derived`` is then True). And GPUs either attach to N1 machines
as guest accelerators (T4, V100, P100, P4, with per-count vCPU/memory caps) or come with an
accelerator-optimised family (G2 = L4, A2 = A100, A3 = H100), never anything else.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from airflow_cloudtrain.catalog.offers import Offer
from airflow_cloudtrain.catalog.snapshot import Row

TYPE_RE = re.compile(r"[a-z][a-z0-9]*-[a-z]+(-\d+[a-z]*)?")
CUSTOM_RE = re.compile(r"(?:(n2)-)?custom-(\d+)-(\d+)")
TYPE_HINT = "use a GCE machine type such as 'n1-standard-8' or 'custom-4-16384'"


@dataclass(frozen=True)
class CustomFamily:
    """Custom-shape rules of one family (no extended memory)."""

    name: str
    prefix: str  # machine type name prefix: "custom" (N1) or "n2-custom"
    predefined: tuple[str, ...]  # predefined series whose prices the rates are derived from
    min_gib_per_vcpu: float
    max_gib_per_vcpu: float
    max_vcpus: int

    def valid_vcpus(self, n: int) -> bool:
        if self.name == "N1":
            return n == 1 or (n % 2 == 0 and n <= self.max_vcpus)
        if n <= 32:
            return n >= 2 and n % 2 == 0
        return n % 4 == 0 and n <= self.max_vcpus

    def mib_range(self, vcpus: int) -> tuple[float, float]:
        """The least and most memory (MiB) a shape of ``vcpus`` may have (no extended memory)."""
        return self.min_gib_per_vcpu * vcpus * 1024, self.max_gib_per_vcpu * vcpus * 1024

    def valid_shape(self, vcpus: int, mib: int) -> bool:
        """The one custom-shape rule: vCPUs of the family, MiB a multiple of 256 within its range."""
        low, high = self.mib_range(vcpus)
        return self.valid_vcpus(vcpus) and mib % 256 == 0 and low <= mib <= high


CUSTOM_FAMILIES: tuple[CustomFamily, ...] = (
    CustomFamily("N1", "custom", ("n1-standard", "n1-highmem", "n1-highcpu"), 0.9, 6.5, 96),
    CustomFamily("N2", "n2-custom", ("n2-standard", "n2-highmem", "n2-highcpu"), 0.5, 8.0, 80),
)

# Accelerators that attach to N1, with (max vCPUs, max memory GiB) per GPU count, from the
# Compute Engine GPU documentation ("GPU machine types", N1 general-purpose with GPUs).
N1_ATTACH_LIMITS: dict[str, dict[int, tuple[int, int]]] = {
    "T4": {1: (48, 312), 2: (48, 312), 4: (96, 624)},
    "V100": {1: (12, 78), 2: (24, 156), 4: (48, 312), 8: (96, 624)},
    "P100": {1: (16, 104), 2: (32, 208), 4: (96, 624)},
    "P4": {1: (24, 156), 2: (48, 312), 4: (96, 624)},
}

# Catalog GPU names -> Compute Engine accelerator type names.
ACCELERATOR_TYPES: dict[str, str] = {
    "T4": "nvidia-tesla-t4",
    "V100": "nvidia-tesla-v100",
    "P100": "nvidia-tesla-p100",
    "P4": "nvidia-tesla-p4",
    "L4": "nvidia-l4",
    "A100": "nvidia-tesla-a100",
    "A100-80GB": "nvidia-a100-80gb",
    "H100": "nvidia-h100-80gb",
    "H100-MEGA": "nvidia-h100-mega-80gb",
    "H200": "nvidia-h200-141gb",
    "B200": "nvidia-b200",
}

# Accelerator-optimised families: the GPU comes with the machine type.
_G2_L4 = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}


def bundled_gpus(machine_type: str) -> tuple[str, int] | None:
    """GPU model and count that come with an accelerator-optimised machine type, else None."""
    if m := re.fullmatch(r"g2-standard-(\d+)", machine_type):
        count = _G2_L4.get(int(m.group(1)))
        return ("L4", count) if count else None
    if m := re.fullmatch(r"a2-highgpu-(\d+)g", machine_type):
        return "A100", int(m.group(1))
    if m := re.fullmatch(r"a2-ultragpu-(\d+)g", machine_type):
        return "A100-80GB", int(m.group(1))
    if m := re.fullmatch(r"a3-highgpu-(\d+)g", machine_type):
        return "H100", int(m.group(1))
    return None


def _accelerator_prices(rows: tuple[Row, ...]) -> dict[tuple[str, int, str], Row]:
    return {
        (r.accelerator, r.accelerator_count, r.region): r
        for r in rows
        if not r.instance_type and r.accelerator
    }


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a + b, 6)


def _zones(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(z for z in a if z in b)


def predefined_offers(rows: tuple[Row, ...], cloud: str) -> list[Offer]:
    """Predefined machine types, accelerator-optimised ones with their GPU price added, and N1
    types with each GPU count they can take attached."""
    accel = _accelerator_prices(rows)
    offers: list[Offer] = []
    n1_rows = [r for r in rows if r.instance_type.startswith("n1-")]
    for r in rows:
        if not r.instance_type:
            continue
        bundled = bundled_gpus(r.instance_type)
        if bundled:
            gpu, count = bundled
            gpu_row = accel.get((gpu, count, r.region))
            if gpu_row is None:
                continue  # no published price for its GPUs in this region: cannot price it
            offers.append(
                Offer(
                    cloud,
                    r.instance_type,
                    r.vcpus,
                    r.memory_gib,
                    count,
                    gpu,
                    r.region,
                    _zones(r.zones, gpu_row.zones),
                    _add(r.price, gpu_row.price),
                    _add(r.spot_min, gpu_row.spot_min),
                )
            )
        else:
            offers.append(
                Offer(
                    cloud,
                    r.instance_type,
                    r.vcpus,
                    r.memory_gib,
                    0,
                    None,
                    r.region,
                    r.zones,
                    r.price,
                    r.spot_min,
                )
            )
    for r in n1_rows:
        for gpu, limits in N1_ATTACH_LIMITS.items():
            for count, (max_vcpus, max_mem) in limits.items():
                gpu_row = accel.get((gpu, count, r.region))
                if gpu_row is None or r.vcpus > max_vcpus or r.memory_gib > max_mem:
                    continue
                zones = _zones(r.zones, gpu_row.zones)
                if zones:
                    offers.append(
                        Offer(
                            cloud,
                            r.instance_type,
                            r.vcpus,
                            r.memory_gib,
                            count,
                            gpu,
                            r.region,
                            zones,
                            _add(r.price, gpu_row.price),
                            _add(r.spot_min, gpu_row.spot_min),
                            attach_gpus=True,
                        )
                    )
    return offers


@dataclass(frozen=True)
class Rates:
    """Derived prices of one family in one region: USD per vCPU-hour and per GiB-hour."""

    vcpu: float
    gib: float
    spot_vcpu: float | None
    spot_gib: float | None
    zones: tuple[str, ...]


def _fit(points: list[tuple[float, float, float]]) -> tuple[float, float] | None:
    """Least-squares ``price = a * vcpus + b * gib`` (no intercept) over (vcpus, gib, price)."""
    sxx = sum(v * v for v, _, _ in points)
    syy = sum(g * g for _, g, _ in points)
    sxy = sum(v * g for v, g, _ in points)
    sxp = sum(v * p for v, _, p in points)
    syp = sum(g * p for _, g, p in points)
    det = sxx * syy - sxy * sxy
    if len(points) < 2 or abs(det) < 1e-12:
        return None
    return (sxp * syy - syp * sxy) / det, (syp * sxx - sxp * sxy) / det


@lru_cache(maxsize=8)
def family_rates(rows: tuple[Row, ...]) -> dict[tuple[str, str], Rates]:
    """Rates per (family name, region), for families with predefined prices in ``rows``."""
    rates: dict[tuple[str, str], Rates] = {}
    for fam in CUSTOM_FAMILIES:
        by_region: dict[str, list[Row]] = {}
        for r in rows:
            if r.instance_type.startswith(fam.predefined):
                by_region.setdefault(r.region, []).append(r)
        for region, members in by_region.items():
            od = _fit([(r.vcpus, r.memory_gib, r.price) for r in members if r.price is not None])
            spot = _fit([(r.vcpus, r.memory_gib, r.spot_min) for r in members if r.spot_min is not None])
            if od is None:
                continue
            zones = tuple(sorted({z for r in members for z in r.zones}))
            rates[(fam.name, region)] = Rates(
                od[0], od[1], spot[0] if spot else None, spot[1] if spot else None, zones
            )
    return rates


def custom_shape(fam: CustomFamily, cpus: int, ram_mib: int | None) -> tuple[int, int] | None:
    """Smallest (vCPUs, MiB) custom shape of ``fam`` with at least ``cpus`` and ``ram_mib``, or None.

    Memory is a multiple of 256 MiB and stays within the family's GiB-per-vCPU range: too much
    memory for the vCPUs asked adds vCPUs (extended memory is not supported), too little is
    raised to the family minimum.
    """
    n = cpus
    while n <= fam.max_vcpus and not fam.valid_vcpus(n):
        n += 1
    want_mib = ram_mib or 0
    while n <= fam.max_vcpus:
        floor_mib = math.ceil(fam.mib_range(n)[0] / 256) * 256
        mib = max(math.ceil(want_mib / 256) * 256, floor_mib)
        if fam.valid_shape(n, mib):
            return n, mib
        n += 1
    return None


def custom_offers(
    rows: tuple[Row, ...], cloud: str, cpus: int, ram_mib: int | None, gpus: int, gpu_type: str | None
) -> list[Offer]:
    """Custom shapes (one per family and region) that meet the request, with GPUs attached on N1."""
    accel = _accelerator_prices(rows)
    rates = family_rates(rows)
    offers: list[Offer] = []
    for fam in CUSTOM_FAMILIES:
        shape = custom_shape(fam, cpus, ram_mib)
        if shape is None:
            continue
        n, mib = shape
        gib = mib / 1024
        name = f"{fam.prefix}-{n}-{mib}"
        for (fam_name, region), rate in rates.items():
            if fam_name != fam.name:
                continue
            price = round(rate.vcpu * n + rate.gib * gib, 6)
            spot = (
                None
                if rate.spot_vcpu is None or rate.spot_gib is None
                else round(rate.spot_vcpu * n + rate.spot_gib * gib, 6)
            )
            if gpus == 0:
                offers.append(
                    Offer(cloud, name, n, gib, 0, None, region, rate.zones, price, spot, derived=True)
                )
                continue
            if fam.name != "N1":
                continue
            for gpu, limits in N1_ATTACH_LIMITS.items():
                if gpu_type and gpu != gpu_type:
                    continue
                for count, (max_vcpus, max_mem) in limits.items():
                    gpu_row = accel.get((gpu, count, region))
                    if count < gpus or gpu_row is None or n > max_vcpus or gib > max_mem:
                        continue
                    zones = _zones(rate.zones, gpu_row.zones)
                    if zones:
                        offers.append(
                            Offer(
                                cloud,
                                name,
                                n,
                                gib,
                                count,
                                gpu,
                                region,
                                zones,
                                _add(price, gpu_row.price),
                                _add(spot, gpu_row.spot_min),
                                attach_gpus=True,
                                derived=True,
                            )
                        )
                    break  # the smallest count that fits is the cheapest
    return offers


def family_limits_text() -> str:
    """How the custom families are bounded, for error messages."""
    return (
        "; ".join(
            f"{f.name} custom: up to {f.max_vcpus} vCPUs, {f.min_gib_per_vcpu:g}-{f.max_gib_per_vcpu:g} GiB per vCPU"
            for f in CUSTOM_FAMILIES
        )
        + "; GPUs attach to N1 (T4, V100, P100, P4) or come with G2 (L4), A2 (A100), A3 (H100)"
    )


# --- the rules the parse-time checks and choose_offer call (``catalog.ec2`` has the same) -----------


def is_type_name(value: str) -> bool:
    """Written like a GCE machine type (``n1-standard-8``) or a custom shape (``custom-4-16384``)."""
    return TYPE_RE.fullmatch(value) is not None or CUSTOM_RE.fullmatch(value) is not None


def family_of(instance_type: str) -> str:
    """``n1-standard`` of ``n1-standard-8``: the family whose sizes an unknown size is compared with."""
    return instance_type.rsplit("-", 1)[0]


def custom_shape_of(value: str) -> tuple[CustomFamily, int, int] | None:
    """(family, vCPUs, MiB) of a custom shape name, or None for any other name."""
    m = CUSTOM_RE.fullmatch(value)
    if not m:
        return None
    prefix = "n2-custom" if m.group(1) else "custom"
    fam = next(f for f in CUSTOM_FAMILIES if f.prefix == prefix)
    return fam, int(m.group(2)), int(m.group(3))


def check_custom_shape(value: str) -> bool:
    """Is ``value`` a custom shape (True) within its family's rules? Raises naming the rule if not."""
    custom = custom_shape_of(value)
    if custom is None:
        return False
    fam, vcpus, mib = custom
    if not fam.valid_shape(vcpus, mib):
        low, high = fam.mib_range(vcpus)
        n1 = (
            "1 or an even number up to 96"
            if fam.name == "N1"
            else "even up to 32, then multiples of 4 up to 80"
        )
        raise ValueError(
            f"instance_type={value!r} is not a valid {fam.name} custom shape: vCPUs {n1}; memory in MiB, "
            f"a multiple of 256, {fam.min_gib_per_vcpu:g}-{fam.max_gib_per_vcpu:g} GiB per vCPU "
            f"({low:.0f}-{high:.0f} MiB for {vcpus} vCPUs), e.g. '{fam.prefix}-4-16384'"
        )
    return True


def custom_shape_has(instance_type: str, gpus: int, gpu_type: str | None) -> dict[str, Any] | None:
    """What a custom shape has ({"vcpus", "mib", "gpus", "gpu"}: GPUs attached as asked, on N1 only),
    or None when ``instance_type`` is not one."""
    custom = custom_shape_of(instance_type)
    if custom is None:
        return None
    fam, vcpus, mib = custom
    if gpus and fam.name != "N1":
        raise ValueError(
            f"instance_type={instance_type!r} cannot take GPUs (gpus={gpus}): GPUs attach to N1 "
            "custom shapes ('custom-N-M') or come with G2/A2/A3 types"
        )
    return {"vcpus": vcpus, "mib": mib, "gpus": gpus, "gpu": gpu_type}  # attached to N1 as guest accelerators


def type_gpus(instance_type: str, row: Row, gpus: int, gpu_type: str | None) -> tuple[str | None, int]:
    """(GPU model, count) a predefined machine type has for a request of ``gpus`` x ``gpu_type``: its
    bundled GPUs (G2/A2/A3), or the asked GPUs when they can attach to this N1 type, else none."""
    if bundled := bundled_gpus(instance_type):
        return bundled
    if gpus and instance_type.startswith("n1-"):
        fits = [
            g
            for g, limits in N1_ATTACH_LIMITS.items()
            if (not gpu_type or g == gpu_type)
            and any(c >= gpus and row.vcpus <= v and row.memory_gib <= m for c, (v, m) in limits.items())
        ]
        if fits:
            return gpu_type or fits[0], gpus
    return None, 0


def zone_region(zone: str) -> str:
    """``us-central1-a`` -> ``us-central1``."""
    return zone.rsplit("-", 1)[0]


def zone_in_region(zone: str, region: str, zones: tuple[str, ...]) -> bool:
    """The catalog lists GCE zones by name."""
    return zone in zones


def zone_names(region: str, zones: tuple[str, ...]) -> list[str]:
    return list(zones)


def offer_in_zone(offer_zones: tuple[str, ...], zone: str) -> bool:
    return zone in offer_zones


def nothing_fits_note() -> str:
    """What to add when no offer fits: the custom families' bounds."""
    return f". No GCE family can serve it ({family_limits_text()})"
