"""Live GCE prices: machine shapes from the Compute Engine API, prices from the Cloud Billing Catalog.

The GCP twin of ``live.refresh_aws``: rows come out in the snapshot's layout (``gcp.csv``: machine
rows priced for their vCPUs and memory only, GPUs as separate rows with an empty InstanceType, priced
per count) and go through ``live._store``, so ``current_rows("gcp")`` prefers them while fresh and
``catalog.gce`` prices offers from them unchanged. Compute Engine bills a predefined machine as
vCPUs x the family's "Core" SKU + GiB x its "Ram" SKU, and a GPU per card, so those SKUs are enough.
It also yields N2 predefined rows, which the snapshot lacks: ``gce.family_rates`` then derives
``n2-custom-*`` prices from them. SKU descriptions are matched as SkyPilot's GCP catalog fetcher
matches them (``sky/catalog/data_fetchers/fetch_gcp.py``), but anchored, so look-alikes (Custom,
Sole Tenancy, DWS, A3 Mega/Plus, Virtual Workstation GPUs) never clobber a predefined rate.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from airflow_cloudtrain.catalog import live
from airflow_cloudtrain.catalog.gce import ACCELERATOR_TYPES
from airflow_cloudtrain.catalog.snapshot import Row, snapshot_rows

BILLING_URL = "https://cloudbilling.googleapis.com"
GCE_SERVICE_ID = "6F81-5844-456A"  # Compute Engine in the Billing Catalog (cloud.google.com/skus)
# The API calls a refresh makes (as ``catalog.live.CALLS``); tests/cloud/test_catalog_live_gcp.py checks them
CALLS = (
    ("compute", "machineTypes.list"),
    ("compute", "acceleratorTypes.list"),
    ("cloudbilling", "services.skus.list"),
)

# Machine type prefixes the catalog knows -> the series as SKU descriptions spell it.
FAMILIES: dict[str, str] = {
    "n1-standard-": "N1 Predefined Instance",
    "n1-highmem-": "N1 Predefined Instance",
    "n2-standard-": "N2 Instance",
    "n2-highmem-": "N2 Instance",
    "g2-standard-": "G2 Instance",
    "a2-highgpu-": "A2 Instance",
    "a3-highgpu-": "A3 Instance",
}
# "Nvidia <name> GPU running in ..." -> catalog GPU name (SkyPilot's mapping).
SKU_GPUS: dict[str, str] = {
    "Tesla T4": "T4",
    "Tesla V100": "V100",
    "Tesla P100": "P100",
    "Tesla P4": "P4",
    "L4": "L4",
    "Tesla A100": "A100",
    "A100 80GB": "A100-80GB",
    "H100 80GB": "H100",
    "H100 80GB Mega": "H100-MEGA",
    "H100 Mega 80GB": "H100-MEGA",
    "H100 80GB Plus": "H100-MEGA",
    "H200 141GB": "H200",
    "B200": "B200",
}
_GPU_OF_TYPE = {v: k for k, v in ACCELERATOR_TYPES.items()}  # "nvidia-tesla-t4" -> "T4"
_EIGHT_ONLY = {"H100-MEGA", "H200", "B200"}  # sold only as whole 8-GPU machines
_USAGE = ("OnDemand", "Preemptible")  # Preemptible = Spot; commitments (Commit1Yr, ...) are not ours

_SPOT = r"^(?:Spot Preemptible |Preemptible )?"
_SERIES = "|".join(sorted({re.escape(s) for s in FAMILIES.values()}))
_MACHINE_SKU = re.compile(_SPOT + rf"(?P<series>{_SERIES}) (?P<kind>Core|Ram)(?: |$)")
_GPU_SKU = re.compile(_SPOT + r"Nvidia (?P<gpu>.+?) (?:GPU|\(1 gpu slice\))(?: |$)")
# SkyPilot's pruning (custom, premium, reserved, sole tenancy) plus newer look-alike products.
_EXCLUDED = re.compile(r"custom|premium|reserved|sole tenan|commit|dws|calendar|workstation|extended", re.I)


def billing_session(credentials: Any) -> Any:
    """An authorized ``requests`` session for the Billing Catalog (cloud-platform scope suffices)."""
    from google.auth.transport.requests import AuthorizedSession

    return AuthorizedSession(credentials)


def fetch_skus(session: Any, base_url: str = BILLING_URL, timeout: float = 60.0) -> Iterator[dict[str, Any]]:
    """Every Compute Engine SKU, page by page (``services.skus.list``; the last page's token is "")."""
    url = f"{base_url.rstrip('/')}/v1/services/{GCE_SERVICE_ID}/skus"
    token, seen = "", set()
    while True:
        params: dict[str, Any] = {"currencyCode": "USD", "pageSize": 5000}
        if token:
            params["pageToken"] = token
        resp = session.get(url, params=params, timeout=timeout)
        resp.raise_for_status()
        page = resp.json()
        yield from page.get("skus", [])
        token = page.get("nextPageToken") or ""
        if not token:
            return
        if token in seen:  # a server repeating itself must not keep a task busy forever
            raise RuntimeError(f"Billing Catalog repeated page token {token!r}")
        seen.add(token)


def unit_price(sku: dict[str, Any]) -> float:
    """USD per usage unit: the last tier (after any free tier), ``units`` (an int64 string) + nanos."""
    rate = sku["pricingInfo"][0]["pricingExpression"]["tieredRates"][-1]["unitPrice"]
    return int(rate.get("units") or 0) + int(rate.get("nanos") or 0) / 1e9


def sku_rates(skus: Iterable[dict[str, Any]], region: str) -> dict[tuple[str, str, str], float]:
    """Hourly rates in ``region``: (series, "Core"|"Ram", usage) per vCPU or GiB, ("GPU", name, usage)
    per card; usage is "OnDemand" or "Preemptible" (``category.usageType``, which decides, not the
    wording). When several SKUs match, the one serving the fewest regions (the most specific) wins."""
    best: dict[tuple[str, str, str], tuple[int, float]] = {}
    for sku in skus:
        cat, desc = sku.get("category") or {}, sku.get("description") or ""
        regions = sku.get("serviceRegions") or []
        usage = cat.get("usageType")
        if cat.get("resourceFamily") != "Compute" or usage not in _USAGE or region not in regions:
            continue
        if _EXCLUDED.search(desc) or not sku.get("pricingInfo"):
            continue
        if m := _MACHINE_SKU.match(desc):
            key, unit = (m["series"], m["kind"], usage), ("GiBy.h" if m["kind"] == "Ram" else "h")
        elif (m := _GPU_SKU.match(desc)) and m["gpu"] in SKU_GPUS:
            key, unit = ("GPU", SKU_GPUS[m["gpu"]], usage), "h"
        else:
            continue
        if sku["pricingInfo"][0]["pricingExpression"].get("usageUnit", unit) != unit:
            continue  # e.g. a monthly unit: not a per-hour rate, do not mix it in
        if key not in best or len(regions) < best[key][0]:
            best[key] = (len(regions), unit_price(sku))
    return {k: price for k, (_, price) in best.items()}


def _list_shapes(
    mt_client: Any, at_client: Any, project: str, zones: Sequence[str]
) -> tuple[dict[str, tuple[float, float, list[str]]], dict[str, dict[str, int]]]:
    """Machine types of our families -> (vCPUs, GiB, zones); catalog GPU -> zone -> max cards."""
    shapes: dict[str, tuple[float, float, list[str]]] = {}
    cards: dict[str, dict[str, int]] = {}
    for zone in zones:
        for mt in mt_client.list(project=project, zone=zone):
            if not mt.name.startswith(tuple(FAMILIES)) or mt.deprecated.state in ("OBSOLETE", "DELETED"):
                continue
            shapes.setdefault(mt.name, (float(mt.guest_cpus), mt.memory_mb / 1024, []))[2].append(zone)
        for at in at_client.list(project=project, zone=zone):
            if gpu := _GPU_OF_TYPE.get(at.name):
                cards.setdefault(gpu, {})[zone] = int(at.maximum_cards_per_instance)
    return shapes, cards


def _counts(gpu: str, max_cards: int) -> list[int]:
    """Per-count rows as the snapshot (and SkyPilot) has them: powers of two up to the maximum."""
    if gpu in _EIGHT_ONLY:
        return [8] if max_cards >= 8 else []
    return [2**i for i in range(max_cards.bit_length()) if 2**i <= max_cards]


def build_rows(
    region: str,
    shapes: dict[str, tuple[float, float, list[str]]],
    cards: dict[str, dict[str, int]],
    rates: dict[tuple[str, str, str], float],
) -> list[Row]:
    """Rows in the snapshot layout. A price no SKU gave falls back to the snapshot's for the same row
    (as ``refresh_aws`` does); rows with no price at all are left out."""
    old = {
        (r.instance_type, r.accelerator, r.accelerator_count): r
        for r in snapshot_rows("gcp")
        if r.region == region
    }
    rows: list[Row] = []

    def add(
        key: tuple[str, str | None, int],
        vcpus: float,
        gib: float,
        price: float | None,
        spot: float | None,
        zones: Iterable[str],
    ) -> None:
        prev = old.get(key)
        price = price if price is not None else (prev.price if prev else None)
        spot = spot if spot is not None else (prev.spot_min if prev else None)
        if price is not None or spot is not None:
            rows.append(
                Row(key[0], key[1], key[2], vcpus, gib, region, price, spot, spot, tuple(sorted(zones)))
            )

    def machine(series: str, vcpus: float, gib: float, usage: str) -> float | None:
        core, ram = rates.get((series, "Core", usage)), rates.get((series, "Ram", usage))
        return None if core is None or ram is None else round(vcpus * core + gib * ram, 6)

    for name, (vcpus, gib, zones) in sorted(shapes.items()):
        series = next(s for p, s in FAMILIES.items() if name.startswith(p))
        od, spot = machine(series, vcpus, gib, "OnDemand"), machine(series, vcpus, gib, "Preemptible")
        add((name, None, 0), vcpus, gib, od, spot, zones)
    for gpu, per_zone in sorted(cards.items()):
        od, spot = rates.get(("GPU", gpu, "OnDemand")), rates.get(("GPU", gpu, "Preemptible"))
        for n in _counts(gpu, max(per_zone.values())):
            add(
                ("", gpu, n),
                0.0,
                0.0,
                None if od is None else round(n * od, 6),
                None if spot is None else round(n * spot, 6),
                [z for z, m in per_zone.items() if m >= n],
            )
    return rows


def refresh_gcp(
    region: str,
    machine_types_client: Any,
    accelerator_types_client: Any,
    billing_session: Any,
    zones: Sequence[str],
    project: str,
    billing_url: str = BILLING_URL,
    budget_s: float | None = None,
    clients: Callable[[], tuple[Any, Any, Any]] | None = None,
) -> list[Row]:
    """Refresh ``region`` from machineTypes/acceleratorTypes ``list`` in ``zones`` of ``project`` and
    the Billing Catalog at ``billing_url`` (through ``billing_session``, an AuthorizedSession), at the
    bounded cost ``live.refreshed`` gives it (fresh cache or recent failure: no call; ``budget_s`` in
    all). ``clients``, when given, builds the three clients inside the budget instead: importing
    ``google.cloud.compute_v1`` alone can take seconds, and a fresh cache must not pay it.

    Returns the live rows; on any error logs a warning, keeps the snapshot and returns []: a refresh
    must never stop a run.
    """

    def fetch(budget: float) -> list[Row]:
        machines, accelerators, session = (
            clients() if clients else (machine_types_client, accelerator_types_client, billing_session)
        )
        shapes, cards = _list_shapes(machines, accelerators, project, zones)
        if not shapes:
            raise LookupError(f"no machine type of {sorted(FAMILIES)} listed in zones {list(zones)}")
        rates = sku_rates(fetch_skus(session, billing_url, timeout=min(60.0, budget)), region)
        if not any(key[0] != "GPU" for key in rates):
            # the descriptions changed or the region is unknown to Billing: do not pass stale rows off as live
            raise LookupError(f"no Compute Engine Core/Ram SKU matched region {region}")
        return build_rows(region, shapes, cards, rates)

    return live.refreshed("gcp", region, fetch, budget_s)
