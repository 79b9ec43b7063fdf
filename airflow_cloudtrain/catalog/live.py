"""Live prices: refresh the catalog from the cloud's own APIs, cached on disk with a time-to-live.

The snapshot answers at DAG parse time (no network call ever happens there); when a task runs, the
operator calls ``refresh_aws`` for its region and ``current_rows`` then prefers the cached live rows
of that region while they are fresher than ``ttl``. A failed refresh logs a warning and the snapshot
stays in use: prices being a few weeks old is better than a training run that does not start.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from airflow_cloudtrain.catalog.snapshot import Row, format_rows, parse_rows, snapshot_rows

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 6 * 3600
_memo: dict[str, tuple[Row, ...]] = {}


def cache_dir() -> Path:
    return Path(os.environ.get("CLOUDTRAIN_CACHE_DIR") or Path.home() / ".cache" / "airflow-cloudtrain")


def ttl_seconds() -> float:
    return float(os.environ.get("CLOUDTRAIN_CATALOG_TTL", DEFAULT_TTL_S))


def _fresh_cache_files(provider: str) -> list[Path]:
    folder = cache_dir() / "catalog"
    if not folder.is_dir():
        return []
    now, ttl = time.time(), ttl_seconds()
    return sorted(p for p in folder.glob(f"{provider}-*.csv") if now - p.stat().st_mtime < ttl)


def current_rows(provider: str) -> tuple[Row, ...]:
    """Snapshot rows, with every region that has a fresh live cache replaced by the live rows."""
    if provider in _memo:
        return _memo[provider]
    rows = list(snapshot_rows(provider))
    for path in _fresh_cache_files(provider):
        try:
            live = parse_rows(path.read_text().splitlines())
        except (OSError, KeyError, ValueError) as err:
            log.warning("Ignoring unreadable catalog cache %s: %s", path, err)
            continue
        regions = {r.region for r in live}
        rows = [r for r in rows if r.region not in regions] + live
    _memo[provider] = tuple(rows)
    return _memo[provider]


def _store(provider: str, region: str, rows: list[Row]) -> None:
    folder = cache_dir() / "catalog"
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{provider}-{region}.csv.tmp"
    tmp.write_text(format_rows(rows))
    tmp.replace(folder / f"{provider}-{region}.csv")
    _memo.pop(provider, None)


# Pricing API location names, as it spells them.
AWS_LOCATIONS = {
    "us-east-1": "US East (N. Virginia)",
    "us-east-2": "US East (Ohio)",
    "us-west-1": "US West (N. California)",
    "us-west-2": "US West (Oregon)",
    "eu-west-1": "EU (Ireland)",
    "eu-central-1": "EU (Frankfurt)",
}


def on_demand_prices(pricing_client: Any, region: str, instance_types: Iterable[str]) -> dict[str, float]:
    """Linux, shared tenancy, no pre-installed software on-demand USD/h from Pricing GetProducts."""
    wanted = set(instance_types)
    filters = [
        {"Type": "TERM_MATCH", "Field": "location", "Value": AWS_LOCATIONS.get(region, region)},
        {"Type": "TERM_MATCH", "Field": "operatingSystem", "Value": "Linux"},
        {"Type": "TERM_MATCH", "Field": "tenancy", "Value": "Shared"},
        {"Type": "TERM_MATCH", "Field": "preInstalledSw", "Value": "NA"},
        {"Type": "TERM_MATCH", "Field": "capacitystatus", "Value": "Used"},
    ]
    prices: dict[str, float] = {}
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"ServiceCode": "AmazonEC2", "Filters": filters, "MaxResults": 100}
        if token:
            kwargs["NextToken"] = token
        page = pricing_client.get_products(**kwargs)
        for item in page.get("PriceList", []):
            product = json.loads(item) if isinstance(item, str) else item
            itype = product["product"]["attributes"].get("instanceType")
            if itype not in wanted:
                continue
            for term in product.get("terms", {}).get("OnDemand", {}).values():
                for dim in term.get("priceDimensions", {}).values():
                    usd = float(dim["pricePerUnit"].get("USD", "0") or 0)
                    if usd > 0:
                        prices[itype] = usd
        token = page.get("NextToken")
        if not token:
            return prices


def spot_prices(ec2_client: Any, instance_types: list[str]) -> dict[str, dict[str, float]]:
    """Latest Linux spot price per (type, zone) from DescribeSpotPriceHistory."""
    latest: dict[tuple[str, str], tuple[Any, float]] = {}
    paginator = ec2_client.get_paginator("describe_spot_price_history")
    start = time.time() - 3 * 3600
    for page in paginator.paginate(
        InstanceTypes=instance_types, ProductDescriptions=["Linux/UNIX"], StartTime=start
    ):
        for rec in page.get("SpotPriceHistory", []):
            key = (rec["InstanceType"], rec["AvailabilityZone"])
            stamp = rec.get("Timestamp")
            if key not in latest or (stamp and stamp > latest[key][0]):
                latest[key] = (stamp, float(rec["SpotPrice"]))
    out: dict[str, dict[str, float]] = {}
    for (itype, zone), (_, price) in latest.items():
        out.setdefault(itype, {})[zone] = price
    return out


def refresh_aws(region: str, ec2_client: Any, pricing_client: Any | None) -> list[Row]:
    """Refresh ``region`` from DescribeInstanceTypes + Pricing GetProducts + DescribeSpotPriceHistory.

    Only the instance types the snapshot knows are refreshed (the catalog's families). Returns the
    rows written to the cache; on any error logs a warning, keeps the snapshot and returns [].
    """
    try:
        known = {r.instance_type: r for r in snapshot_rows("aws") if r.region == region}
        names = set(known) or {r.instance_type for r in snapshot_rows("aws")}
        # Filter by family rather than listing types: a type the region lacks would fail the whole call.
        families = sorted({f"{name.split('.')[0]}.*" for name in names})
        specs: dict[str, dict[str, Any]] = {}
        paginator = ec2_client.get_paginator("describe_instance_types")
        for page in paginator.paginate(Filters=[{"Name": "instance-type", "Values": families}]):
            for it in page["InstanceTypes"]:
                if it["InstanceType"] in names:
                    specs[it["InstanceType"]] = it
        zones_of: dict[str, list[str]] = {}
        for page in ec2_client.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone-id", Filters=[{"Name": "instance-type", "Values": list(specs)}]
        ):
            for rec in page["InstanceTypeOfferings"]:
                zones_of.setdefault(rec["InstanceType"], []).append(rec["Location"])
        od = on_demand_prices(pricing_client, region, specs) if pricing_client is not None else {}
        spot = spot_prices(ec2_client, list(specs))
        rows = []
        for itype, it in sorted(specs.items()):
            old = known.get(itype)
            gpu = (it.get("GpuInfo") or {}).get("Gpus") or [{}]
            zone_prices = spot.get(itype, {})
            rows.append(
                Row(
                    instance_type=itype,
                    accelerator=gpu[0].get("Name") or (old.accelerator if old else None),
                    accelerator_count=int(sum(g.get("Count", 0) for g in gpu))
                    or (old.accelerator_count if old else 0),
                    vcpus=float(it["VCpuInfo"]["DefaultVCpus"]),
                    memory_gib=it["MemoryInfo"]["SizeInMiB"] / 1024,
                    region=region,
                    price=od.get(itype, old.price if old else None),
                    spot_min=min(zone_prices.values()) if zone_prices else (old.spot_min if old else None),
                    spot_max=max(zone_prices.values()) if zone_prices else (old.spot_max if old else None),
                    zones=tuple(sorted(zones_of.get(itype, ()))) or (old.zones if old else ()),
                )
            )
        _store("aws", region, rows)
        return rows
    except Exception as err:  # a refresh must never stop a run: the snapshot still answers
        log.warning("Live catalog refresh for aws/%s failed, using the snapshot: %s", region, err)
        return []
