"""The emulated Cloud Billing Catalog: ``GET /v1/services/<service>/skus`` for Compute Engine, priced from
the shipped snapshot (``catalog/data/gcp.csv``), so a run's live catalog refresh (``catalog.live_gcp``)
succeeds against the emulator and finds the prices the snapshot has.

Served on the Compute Engine emulator's port (the ``google_cloud_default`` connection's
``billing_endpoint``), through its request pipeline (``rest``: counted as ``services.skus.list``,
throttled as service ``cloudbilling``). SKUs are the ones the refresh reads, shaped as the real API returns them:
per region and family a "Core" (per vCPU-hour, ``h``) and a "Ram" (per GiB-hour, ``GiBy.h``) SKU,
on demand and Spot (``usageType`` ``OnDemand`` / ``Preemptible``), and one per GPU card and hour. Their
rates are fitted to the snapshot's machine prices (least squares over a family's machines in the region;
the snapshot's prices are of that form, rounded to 5 decimals), so refreshed prices match the
snapshot's within a few millionths of a dollar. Families the snapshot has no machine of (N2) get no SKU:
the emulated catalog stays the snapshot's. Paging: ``pageSize`` (default and maximum 5000),
``pageToken``/``nextPageToken`` (the last page's is ""). Another service id is 404 NOT_FOUND.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from airflow_cloudtrain.emulator.gcp.rest import GoogleError

GCE_SERVICE = "6F81-5844-456A"
PREFIX = "/v1/services/"
_GPU_SKU_NAMES = {  # catalog GPU -> "Nvidia <name> GPU" as the SKU descriptions spell it
    "T4": "Tesla T4",
    "V100": "Tesla V100",
    "P100": "Tesla P100",
    "P4": "Tesla P4",
    "L4": "L4",
    "A100": "Tesla A100",
    "A100-80GB": "A100 80GB",
    "H100": "H100 80GB",
    "H100-MEGA": "H100 80GB Mega",
    "H200": "H200 141GB",
    "B200": "B200",
}


def _fit(points: list[tuple[float, float, float]]) -> tuple[float, float] | None:
    """(per vCPU, per GiB) minimising the squared error of vcpus * a + gib * b = price."""
    sxx = sum(x * x for x, _, _ in points)
    syy = sum(y * y for _, y, _ in points)
    sxy = sum(x * y for x, y, _ in points)
    sxp = sum(x * p for x, _, p in points)
    syp = sum(y * p for _, y, p in points)
    det = sxx * syy - sxy * sxy
    if abs(det) < 1e-12:
        return None
    return (sxp * syy - syp * sxy) / det, (syp * sxx - sxp * sxy) / det


def _sku(n: int, description: str, usage: str, region: str, unit: str, price: float) -> dict[str, Any]:
    price = max(price, 0.0)
    units, nanos = int(price), round((price - int(price)) * 1e9)
    sku_id = f"EMU{n:04d}-{zlib.crc32(description.encode()) % 10**8:08d}"
    return {
        "name": f"services/{GCE_SERVICE}/skus/{sku_id}",
        "skuId": sku_id,
        "description": description,
        "category": {
            "serviceDisplayName": "Compute Engine",
            "resourceFamily": "Compute",
            "resourceGroup": "RAM" if unit == "GiBy.h" else ("GPU" if "Nvidia" in description else "CPU"),
            "usageType": usage,
        },
        "serviceRegions": [region],
        "pricingInfo": [
            {
                "summary": "",
                "pricingExpression": {
                    "usageUnit": unit,
                    "displayQuantity": 1,
                    "usageUnitDescription": "gibibyte hour" if unit == "GiBy.h" else "hour",
                    "baseUnit": "By.s" if unit == "GiBy.h" else "s",
                    "baseUnitConversionFactor": 3865470566400 if unit == "GiBy.h" else 3600,
                    "tieredRates": [
                        {
                            "startUsageAmount": 0,
                            "unitPrice": {"currencyCode": "USD", "units": str(units), "nanos": nanos},
                        }
                    ],
                },
                "currencyConversionRate": 1,
                "effectiveTime": "2026-11-22T00:00:00Z",
            }
        ],
        "serviceProviderName": "Google",
    }


@lru_cache(maxsize=1)
def compute_skus() -> tuple[dict[str, Any], ...]:
    """Every Compute Engine SKU of the emulated catalog (module doc), built once from the snapshot."""
    from airflow_cloudtrain.catalog.live_gcp import FAMILIES
    from airflow_cloudtrain.catalog.snapshot import snapshot_rows

    machines: dict[tuple[str, str], list[Any]] = {}
    gpus: dict[tuple[str, str], list[Any]] = {}
    for row in snapshot_rows("gcp"):
        if row.instance_type:
            series = next((s for p, s in FAMILIES.items() if row.instance_type.startswith(p)), None)
            if series is not None:
                machines.setdefault((series, row.region), []).append(row)
        elif row.accelerator in _GPU_SKU_NAMES and row.accelerator_count:
            gpus.setdefault((row.accelerator, row.region), []).append(row)
    skus: list[dict[str, Any]] = []
    for (series, region), rows in sorted(machines.items()):
        for usage, attr, prefix in (
            ("OnDemand", "price", ""),
            ("Preemptible", "spot_min", "Spot Preemptible "),
        ):
            points = [(r.vcpus, r.memory_gib, getattr(r, attr)) for r in rows if getattr(r, attr) is not None]
            rates = _fit(points) if len(points) >= 2 else None
            if rates is None:
                continue
            core, ram = rates
            where = f"running in {region}"
            skus.append(_sku(len(skus), f"{prefix}{series} Core {where}", usage, region, "h", core))
            skus.append(_sku(len(skus), f"{prefix}{series} Ram {where}", usage, region, "GiBy.h", ram))
    for (gpu, region), rows in sorted(gpus.items()):
        for usage, attr, prefix in (
            ("OnDemand", "price", ""),
            ("Preemptible", "spot_min", "Spot Preemptible "),
        ):
            priced = sorted(
                (r.accelerator_count, getattr(r, attr)) for r in rows if getattr(r, attr) is not None
            )
            if priced:  # the most cards' row: its price per card is the least rounded
                desc = f"{prefix}Nvidia {_GPU_SKU_NAMES[gpu]} GPU running in {region}"
                skus.append(_sku(len(skus), desc, usage, region, "h", priced[-1][1] / priced[-1][0]))
    return tuple(skus)


def _page(skus: Iterable[dict[str, Any]], size: int, token: str) -> dict[str, Any]:
    items = list(skus)
    start = int(token) if token.isdigit() else 0
    chunk = items[start : start + size]
    following = start + size
    return {"skus": chunk, "nextPageToken": str(following) if following < len(items) else ""}


def answer(method: str, path: str, args: Mapping[str, str]) -> dict[str, Any]:
    """The JSON body for a request under ``/v1/services/`` (``GoogleError`` for a 400 or 404)."""
    service, _, rest = path[len(PREFIX) :].partition("/")
    if method != "GET" or rest != "skus":
        raise GoogleError(404, f"Method not found: {method} {path}")
    if service != GCE_SERVICE:
        raise GoogleError(404, f"Service services/{service} not found (the emulator serves {GCE_SERVICE}).")
    if args.get("currencyCode", "USD") != "USD":
        raise GoogleError(400, "The emulator prices in USD only.")
    try:
        size = int(args.get("pageSize") or 5000)
    except ValueError:
        raise GoogleError(400, f"Invalid value for pageSize: {args.get('pageSize')!r}") from None
    return _page(compute_skus(), max(1, min(size, 5000)), args.get("pageToken") or "")
