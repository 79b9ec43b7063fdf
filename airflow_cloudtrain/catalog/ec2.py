"""EC2 shapes: the catalog rules of the AWS provider, beside ``catalog.gce`` (same functions).

``catalog.rules(cloud)`` returns this module or ``catalog.gce``; the parse-time checks and
``choose_offer`` call the rules through it instead of asking which provider they have. EC2 has no
custom shapes and GPUs always come with the instance type; the snapshot lists zone *ids*
(``use1-az1``), which map to zone names (``us-east-1a``) per account, so a zone name is checked by
its region and its letter.
"""

from __future__ import annotations

import re
from typing import Any

from airflow_cloudtrain.catalog.offers import Offer
from airflow_cloudtrain.catalog.snapshot import Row

_SIZE = r"(nano|micro|small|medium|large|xlarge|\d+xlarge|metal(-\d+xl)?)"
TYPE_RE = re.compile(rf"([a-z][a-z0-9-]*\d[a-z0-9-]*)\.{_SIZE}")
TYPE_HINT = "use an EC2 type such as 'm5.xlarge'"
_ZONE_RE = re.compile(r"([a-z]{2}(?:-gov)?-[a-z]+-\d)([a-z])")


def is_type_name(value: str) -> bool:
    """Written like an EC2 instance type (``g5.xlarge``)."""
    return TYPE_RE.fullmatch(value) is not None


def family_of(instance_type: str) -> str:
    """``g5`` of ``g5.xlarge``: the family whose sizes an unknown size is compared with."""
    return instance_type.split(".")[0]


def custom_shape_of(value: str) -> Any:
    """EC2 has no custom shapes."""
    return None


def check_custom_shape(value: str) -> bool:
    """EC2 has no custom shapes: nothing to check (False: not one)."""
    return False


def custom_shape_has(instance_type: str, gpus: int, gpu_type: str | None) -> dict[str, Any] | None:
    """EC2 has no custom shapes."""
    return None


def predefined_offers(rows: tuple[Row, ...], cloud: str) -> list[Offer]:
    """One offer per catalog row: the GPUs come with the type."""
    return [
        Offer(
            cloud,
            r.instance_type,
            r.vcpus,
            r.memory_gib,
            r.accelerator_count,
            r.accelerator,
            r.region,
            r.zones,
            r.price,
            r.spot_min,
        )
        for r in rows
    ]


def custom_offers(
    rows: tuple[Row, ...], cloud: str, cpus: int, ram_mib: int | None, gpus: int, gpu_type: str | None
) -> list[Offer]:
    """EC2 has no custom shapes."""
    return []


def zone_region(zone: str) -> str:
    """``us-east-1a`` -> ``us-east-1`` (a zone id is returned as it is)."""
    return zone[:-1] if zone[-1:].isalpha() else zone


def zone_in_region(zone: str, region: str, zones: tuple[str, ...]) -> bool:
    """A zone name whose letter is within the number of zones the region has (``us-east-1a`` ..
    ``us-east-1f`` for six; the catalog lists zone ids, which map to names per account)."""
    m = _ZONE_RE.fullmatch(zone)
    return m is not None and m.group(1) == region and ord(zone[-1]) - ord("a") < max(len(zones), 1)


def zone_names(region: str, zones: tuple[str, ...]) -> list[str]:
    """The zone names of a region, from the number of zone ids the catalog lists."""
    return [f"{region}{chr(ord('a') + i)}" for i in range(len(zones))]


def offer_in_zone(offer_zones: tuple[str, ...], zone: str) -> bool:
    """A zone name is checked by region only (names map to ids per account), a zone id exactly."""
    return "-az" not in zone or zone in offer_zones


def type_gpus(instance_type: str, row: Row, gpus: int, gpu_type: str | None) -> tuple[str | None, int]:
    """(GPU model, count) an instance type comes with."""
    return (row.accelerator.upper(), row.accelerator_count) if row.accelerator else (None, 0)


def nothing_fits_note() -> str:
    """What to add when no offer fits: EC2 has nothing beyond the largest offers."""
    return ""
