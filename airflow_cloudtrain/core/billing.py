"""What a run cost: the hourly price paid times the billed time, and how that was computed."""

from __future__ import annotations

import math


def billed_cost(
    hourly_usd: float | None, seconds: float, minimum_s: float = 60.0
) -> tuple[float | None, str]:
    """EC2 and GCE bill Linux instances per second with a one-minute minimum.

    Returns (USD rounded to the cent's hundredth, an explanation for the XCom / log).
    """
    billed = max(minimum_s, math.ceil(max(seconds, 0.0)))
    if hourly_usd is None:
        return None, f"{billed:.0f} s billed; no price known for this instance type"
    usd = hourly_usd * billed / 3600.0
    return round(usd, 6), f"${hourly_usd:g}/h x {billed:.0f} s billed (per second, 60 s minimum)"
