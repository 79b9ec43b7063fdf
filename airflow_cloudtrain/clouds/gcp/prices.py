"""What a GCE Spot VM is charged: the Billing catalog's current Spot SKU price for its machine type.

Compute Engine bills a Spot VM per second at the Spot SKU prices of its region (per vCPU-hour and
GiB-hour; Google changes them at most once a month, not during a run), so the current SKU price over the
attempt's lifetime is what was charged. The rates come from the Cloud Billing Catalog
(``catalog.live_gcp``: the same SKUs the live catalog refresh reads), once per region per hour in this
process; the shape (vCPUs, GiB) from the catalog. A machine type the catalog cannot price from SKUs
(one with attached GPUs, a family without SKUs) gets None: its launch price stands.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from airflow_cloudtrain.core.billing import PriceHistory

RATES_TTL_S = 3600.0
_RATES: dict[str, tuple[float, dict[tuple[str, str, str], float]]] = {}
_LOCK = threading.Lock()


def spot_sku_history(
    session: Any, billing_url: str, region: str, instance_type: str, start: float
) -> PriceHistory | None:
    """The Spot SKU price of ``instance_type`` in ``region`` now, as a one-point history from ``start``."""
    from airflow_cloudtrain.catalog.live_gcp import fetch_skus, sku_rates

    shape = _shape(instance_type)
    if shape is None:
        return None
    series, vcpus, gib, note = shape
    with _LOCK:
        cached = _RATES.get(region)
    if cached is None or time.time() - cached[0] > RATES_TTL_S:
        rates = sku_rates(fetch_skus(session, billing_url), region)
        with _LOCK:
            _RATES[region] = (time.time(), rates)
    else:
        rates = cached[1]
    core, ram = rates.get((series, "Core", "Preemptible")), rates.get((series, "Ram", "Preemptible"))
    if core is None or ram is None:
        return None
    price = round(vcpus * core + gib * ram, 6)
    source = f"GCE Spot SKU prices (Cloud Billing Catalog) of {instance_type} in {region}{note}"
    return PriceHistory(((start, price),), source)


def _shape(instance_type: str) -> tuple[str, float, float, str] | None:
    """(SKU series, vCPUs, GiB, a note for the basis) of a predefined type of the catalog, or of a custom
    shape (priced at its family's predefined rates, as the catalog prices it: ``catalog.gce``)."""
    from airflow_cloudtrain.catalog.gce import custom_shape_of
    from airflow_cloudtrain.catalog.live_gcp import FAMILIES
    from airflow_cloudtrain.catalog.snapshot import snapshot_rows

    custom = custom_shape_of(instance_type)
    if custom is not None:
        family, vcpus, mib = custom
        predefined = FAMILIES["n1-standard-" if family.name == "N1" else "n2-standard-"]
        return predefined, float(vcpus), mib / 1024, " (a custom shape, at its family's predefined rates)"
    series = next((s for p, s in FAMILIES.items() if instance_type.startswith(p)), None)
    row = next(
        (r for r in snapshot_rows("gcp") if r.instance_type == instance_type and not r.accelerator), None
    )
    if series is None or row is None:
        return None
    return series, row.vcpus, row.memory_gib, ""
