"""What one attempt cost, at the prices its instances were charged (``core.billing.instance_cost``).

The backend says which prices those were (``RunBackend.charged_prices``: an EC2 spot instance's zone
history, a GCE Spot VM's current SKU price); a failure to read them is not a reason to fail the run:
the launch's price stands, and the log says so. Every node of a gang has the same type, zone and
lifetime; each instance's root volume is added at the region's per-GB-month price (``catalog.volumes``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airflow_cloudtrain.catalog.volumes import root_volume_price
from airflow_cloudtrain.contract.clouds import provider_of
from airflow_cloudtrain.core.billing import HOURS_PER_MONTH, PriceHistory, billed_seconds, instance_cost
from airflow_cloudtrain.core.retry import TransientBudget, call_with_retry

if TYPE_CHECKING:
    from airflow_cloudtrain.core.backend import RunBackend
    from airflow_cloudtrain.core.records import LaunchRecord


def attempt_cost(
    backend: RunBackend, launch: LaunchRecord, seconds: float, gpus: int, log: logging.Logger
) -> tuple[float | None, str]:
    """(USD, the cost basis) of ``launch``'s instances alive ``seconds`` from its launch."""
    start = float(launch.launched_at or 0.0)
    history: PriceHistory | None = None
    if launch.instance_type and start:
        itype, end = launch.instance_type, start + billed_seconds(seconds)
        try:
            history = call_with_retry(
                lambda: backend.charged_prices(itype, launch.zone, bool(launch.spot), gpus, start, end),
                TransientBudget(budget_s=30.0),
            )
        except Exception as err:
            log.warning(
                "Could not read the prices %s was charged (%s); costing at its launch price", itype, err
            )
    disk = None
    per_month = _volume_price(launch)
    if launch.disk_gib and per_month is not None:
        disk = (float(launch.disk_gib), per_month)
    return instance_cost(launch.hourly_usd, start, seconds, launch.num_nodes, history, disk)


def hourly_usd(launch: LaunchRecord) -> float | None:
    """What the launch's instances cost together per hour at its price, root volumes included: what
    a ``max_cost`` projection runs on (``core.budget``)."""
    if launch.hourly_usd is None:
        return None
    per_month = _volume_price(launch)
    disk = float(launch.disk_gib or 0) * (per_month or 0.0) / HOURS_PER_MONTH
    return (float(launch.hourly_usd) + disk) * launch.num_nodes


def _volume_price(launch: LaunchRecord) -> float | None:
    """USD per GiB-month of the launch's root volumes (None where the catalog has no price)."""
    return root_volume_price(provider_of(launch.cloud), launch.region)
