"""A Vertex AI job's cost estimate: every replica of every pool, billed through ``core.billing``.

The prices are the vocabulary floor's (``mlengine.pricing.hourly_price``: the Compute Engine list
price of a replica's machine and accelerators); the summation is here, a floor above the one billing
function every engine's cost goes through (``billed_usd``, per replica, ``VERTEX_MINIMUM_S``: no
per-replica minimum; whole seconds, as the instances' bills).
"""

from __future__ import annotations

from airflow_cloudtrain.catalog.snapshot import SNAPSHOT_DATE
from airflow_cloudtrain.core.billing import VERTEX_MINIMUM_S, billed_usd
from airflow_cloudtrain.mlengine.pricing import hourly_price
from airflow_cloudtrain.mlengine.tiers import ReplicaPool


def estimate_cost(
    pools: list[ReplicaPool], region: str, spot: bool, seconds: float
) -> tuple[float | None, str]:
    """(USD for ``seconds`` of every pool's replicas, or None if any pool cannot be priced; a
    one-line basis saying how the number was made and what it leaves out)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise ValueError(f"seconds={seconds!r}: accepted: a run time in seconds >= 0")
    total = 0.0
    parts: list[str] = []
    unpriced: list[str] = []
    for pool in pools:
        price = hourly_price(pool.machine, region, spot)
        label = f"{pool.role} {pool.count} x {pool.machine.describe()}"
        if price is None:
            unpriced.append(label)
        else:
            total += billed_usd(price, seconds, count=pool.count, minimum_s=VERTEX_MINIMUM_S)
            parts.append(f"{label} at ${price:.4f}/h")
    kind = "Spot" if spot else "on-demand"
    basis = (
        f"ESTIMATE: Compute Engine {kind} list prices in {region} (catalog snapshot {SNAPSHOT_DATE}) of the "
        f"replicas' machines x {seconds / 3600:.2f} h run time ({'; '.join(parts) or 'no pool priced'}); "
        "Vertex AI adds its own training charge on top, not included"
    )
    if unpriced:
        basis += (
            f"; could not price {'; '.join(unpriced)} (TPUs and types or regions missing from the snapshot "
            "have no catalog price), so no total"
        )
        return None, basis
    return round(total, 6), basis
