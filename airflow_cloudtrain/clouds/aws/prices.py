"""What an EC2 spot instance was charged: the zone's spot price history over its lifetime.

EC2 bills a spot instance per second at the spot price in effect in its zone, which changes while it
runs; the price of the offer at launch (the lowest over the region's zones) is only where it started.
``DescribeSpotPriceHistory`` for the instance's type, zone and product (Linux/UNIX) over [launch, end]
returns every price in effect during that window, the one in effect at its start included. One call
(paged) per type, zone and window; answers are cached for the process, so a ledger that prices the
same window twice (a retried finish) asks once.
"""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from typing import Any

from airflow_cloudtrain.core.billing import PriceHistory

PRODUCT = "Linux/UNIX"
_CACHE: dict[tuple[str, str, int, int], PriceHistory] = {}
_LOCK = threading.Lock()


def spot_price_history(
    ec2_client: Any, instance_type: str, zone: str, start: float, end: float
) -> PriceHistory:
    """The spot prices ``instance_type`` had in ``zone`` from ``start`` to ``end`` (unix times)."""
    key = (instance_type, zone, int(start), int(end))
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    points: list[tuple[float, float]] = []
    paginator = ec2_client.get_paginator("describe_spot_price_history")
    for page in paginator.paginate(
        InstanceTypes=[instance_type],
        ProductDescriptions=[PRODUCT],
        AvailabilityZone=zone,
        StartTime=datetime.fromtimestamp(start, timezone.utc),
        EndTime=datetime.fromtimestamp(end, timezone.utc),
    ):
        for record in page.get("SpotPriceHistory", []):
            if record.get("AvailabilityZone") != zone or record.get("InstanceType") != instance_type:
                continue
            stamp = record["Timestamp"]
            points.append((stamp.timestamp(), float(record["SpotPrice"])))
    history = PriceHistory(tuple(sorted(set(points))), f"EC2 spot price history of {instance_type} in {zone}")
    if points:
        with _LOCK:
            _CACHE[key] = history
    return history
