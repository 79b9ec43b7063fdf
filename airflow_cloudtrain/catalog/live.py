"""Live prices: refresh the catalog from the cloud's own APIs, cached on disk with a time-to-live.

The snapshot answers at DAG parse time (no network call ever happens there); when a task runs, the
operator calls ``refresh_aws`` for its region and ``current_rows`` then prefers the cached live rows
of that region while they are fresher than ``ttl``. A failed refresh logs a warning and the snapshot
stays in use: prices being a few weeks old is better than a training run that does not start.

What a refresh may cost a run is bounded (``refreshed``): a region whose cache is fresh is not asked
again (``CLOUDTRAIN_CATALOG_TTL``, 6 h); a refresh gets ``CLOUDTRAIN_CATALOG_BUDGET_S`` seconds (10)
in all, after which the run goes on with the snapshot (the refresh may still finish in the background
and fill the cache); and a failed refresh is remembered (``.<provider>-<region>.failed`` beside the
cache) and not tried again for ``CLOUDTRAIN_CATALOG_RETRY_S`` seconds (30 min), so a failure costs
one run its budget and one warning, not every run.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from airflow_cloudtrain.catalog.snapshot import Row, format_rows, parse_rows, snapshot_rows

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 6 * 3600
DEFAULT_BUDGET_S = 10.0
DEFAULT_RETRY_S = 30 * 60
_memo: dict[str, tuple[Row, ...]] = {}


def cache_dir() -> Path:
    return Path(os.environ.get("CLOUDTRAIN_CACHE_DIR") or Path.home() / ".cache" / "airflow-cloudtrain")


def ttl_seconds() -> float:
    return float(os.environ.get("CLOUDTRAIN_CATALOG_TTL", DEFAULT_TTL_S))


def budget_seconds() -> float:
    """How long a run waits for a refresh, in all (``CLOUDTRAIN_CATALOG_BUDGET_S``)."""
    return float(os.environ.get("CLOUDTRAIN_CATALOG_BUDGET_S", DEFAULT_BUDGET_S))


def retry_seconds() -> float:
    """How long a failed refresh is not tried again (``CLOUDTRAIN_CATALOG_RETRY_S``)."""
    return float(os.environ.get("CLOUDTRAIN_CATALOG_RETRY_S", DEFAULT_RETRY_S))


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


def _store(provider: str, region: str, rows: list[Row], folder: Path | None = None) -> None:
    folder = folder or cache_dir() / "catalog"
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{provider}-{region}.csv.tmp.{threading.get_ident()}"
    tmp.write_text(format_rows(rows))
    tmp.replace(folder / f"{provider}-{region}.csv")
    (folder / f".{provider}-{region}.failed").unlink(missing_ok=True)
    _memo.pop(provider, None)


def _fresh_cache(folder: Path, provider: str, region: str) -> list[Row] | None:
    """The region's cached live rows while fresher than the TTL; None when there are none."""
    path = folder / f"{provider}-{region}.csv"
    try:
        if time.time() - path.stat().st_mtime >= ttl_seconds():
            return None
        return parse_rows(path.read_text().splitlines())
    except (OSError, KeyError, ValueError):
        return None


def _recent_failure(folder: Path, provider: str, region: str) -> tuple[float, str] | None:
    """(seconds ago, why) of the region's last failed refresh while within the retry delay."""
    path = folder / f".{provider}-{region}.failed"
    try:
        age = time.time() - path.stat().st_mtime
        return (age, path.read_text().strip()) if age < retry_seconds() else None
    except OSError:
        return None


def refreshed(
    provider: str, region: str, fetch: Callable[[float], list[Row]], budget_s: float | None = None
) -> list[Row]:
    """Live rows of ``region`` from ``fetch(budget_s)`` (which reads the cloud's APIs), at bounded cost.

    A fresh cache is returned as is (no call); a refresh that failed less than ``retry_seconds`` ago
    is not tried again ([]); else ``fetch`` runs for at most ``budget_s`` (``budget_seconds()``) and
    its rows are cached and returned. Any error, or the budget running out, logs one warning,
    remembers the failure and returns []: a refresh never stops a run (the snapshot still answers).
    """
    folder = cache_dir() / "catalog"
    cached = _fresh_cache(folder, provider, region)
    if cached is not None:
        log.debug("Live catalog for %s/%s is fresh in the cache: not refreshed", provider, region)
        return cached
    failure = _recent_failure(folder, provider, region)
    if failure is not None:
        log.info(
            "Live catalog refresh for %s/%s failed %.0f s ago (%s); using the snapshot, next try in %.0f s",
            provider,
            region,
            failure[0],
            failure[1],
            retry_seconds() - failure[0],
        )
        return []
    budget = budget_seconds() if budget_s is None else budget_s
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            rows = fetch(budget)
            _store(provider, region, rows, folder)  # also when late: the next run finds it
            outcome["rows"] = rows
        except Exception as err:  # reported by the caller while it waits, else dropped
            outcome["error"] = err

    worker = threading.Thread(target=work, name=f"catalog-refresh-{provider}-{region}", daemon=True)
    worker.start()
    worker.join(budget)
    if "rows" in outcome:
        return list(outcome["rows"])
    unanswered = f"no answer within its {budget:g} s budget (CLOUDTRAIN_CATALOG_BUDGET_S)"
    err = outcome.get("error") or TimeoutError(unanswered)
    if "error" in outcome and _is_timeout(err):  # a request's own timeout, set to the budget: the same end
        err = TimeoutError(f"{unanswered}: {err}")
    _remember_failure(folder, provider, region, err)
    log.warning(
        "Live catalog refresh for %s/%s failed, using the snapshot: %s (not tried again for %.0f s)",
        provider,
        region,
        err,
        retry_seconds(),
    )
    return []


def _is_timeout(err: BaseException) -> bool:
    """A request that got no answer in time, whichever client raised it: the fetches bound their
    requests' read timeouts by the budget, so on a loaded machine that timeout (``requests``'
    ``ReadTimeout``, botocore's ``ReadTimeoutError``, ``socket.timeout``) can fire before the budget's
    own wait ends; the user is told the same thing either way. By class, never by message."""
    return isinstance(err, TimeoutError) or any(
        cls.__name__
        in ("Timeout", "ReadTimeout", "ConnectTimeout", "ReadTimeoutError", "ConnectTimeoutError")
        for cls in type(err).__mro__
    )


def _remember_failure(folder: Path, provider: str, region: str, err: BaseException) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        first_line = (str(err).splitlines() or [type(err).__name__])[0]
        (folder / f".{provider}-{region}.failed").write_text(first_line[:300] + "\n")
    except OSError as exc:  # an unwritable cache only costs the next run another try
        log.debug("Could not record the failed refresh: %s", exc)


# Pricing API location names, as it spells them.
# The API calls a refresh makes (the permission documents grant them to every operator that takes
# ``live_prices``: ``permissions.catalog_calls``); tests/cloud/test_catalog_live.py checks them
CALLS = (
    ("ec2", "DescribeInstanceTypes"),
    ("ec2", "DescribeInstanceTypeOfferings"),
    ("ec2", "DescribeSpotPriceHistory"),
    ("pricing", "GetProducts"),
)
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


def refresh_aws(
    region: str, ec2_client: Any, pricing_client: Any | None, budget_s: float | None = None
) -> list[Row]:
    """Refresh ``region`` from DescribeInstanceTypes + Pricing GetProducts + DescribeSpotPriceHistory,
    at the bounded cost ``refreshed`` gives it (fresh cache: no call; recent failure: no call;
    ``budget_s`` in all).

    Only the instance types the snapshot knows are refreshed (the catalog's families). Returns the
    live rows; on any error logs a warning, keeps the snapshot and returns [].
    """
    return refreshed("aws", region, lambda _budget: _fetch_aws(region, ec2_client, pricing_client), budget_s)


def _fetch_aws(region: str, ec2_client: Any, pricing_client: Any | None) -> list[Row]:
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
                # the catalog's GPU names tell cards apart that the API names alike (V100 / V100-32GB)
                accelerator=(old.accelerator if old else None) or gpu[0].get("Name"),
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
    # A type of the snapshot the API did not describe keeps its snapshot row: the live rows replace the
    # region's rows wholesale, and an incomplete answer must not take offers away.
    rows += [old for itype, old in sorted(known.items()) if itype not in specs]
    return rows
