"""What a run cost: every engine's costs go through ``billed_usd`` (and ``billed_cost`` for a run).

An instance's attempt is priced by ``instance_cost``: at the prices it was charged (an EC2 spot
instance at the zone's spot price history over its lifetime, which moves; on-demand and GCE Spot at
the price of its launch, which is the catalog's or the Billing catalog's current SKU price), plus its
root volume at the region's per-GB-month price for the same billed time.

EC2 and GCE bill Linux instances per second with a one-minute minimum (``INSTANCE_MINIMUM_S``), so
an instance that lived 20 s is billed 60 s. A fleet's workers are instances too: each worker's
lifetime is billed on its own. Vertex AI custom jobs are billed per replica for the job's run time,
with no per-replica minimum here (``VERTEX_MINIMUM_S``: the job's estimate, see
``mlengine.pricing``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

INSTANCE_MINIMUM_S = 60.0
VERTEX_MINIMUM_S = 0.0


def billed_seconds(seconds: float, minimum_s: float = INSTANCE_MINIMUM_S) -> float:
    """Whole seconds billed for a lifetime of ``seconds`` (negative counts as zero)."""
    return max(minimum_s, float(math.ceil(max(seconds, 0.0))))


def billed_usd(
    hourly_usd: float, seconds: float, count: int = 1, minimum_s: float = INSTANCE_MINIMUM_S
) -> float:
    """USD for ``count`` machines at ``hourly_usd`` each, alive ``seconds`` each, before rounding."""
    return hourly_usd * count * billed_seconds(seconds, minimum_s) / 3600.0


def billed_cost(
    hourly_usd: float | None, seconds: float, minimum_s: float = INSTANCE_MINIMUM_S
) -> tuple[float | None, str]:
    """One instance's cost: (USD rounded to the cent's hundredth, an explanation for the XCom / log)."""
    billed = billed_seconds(seconds, minimum_s)
    if hourly_usd is None:
        return None, f"{billed:.0f} s billed; no price known for this instance type"
    usd = billed_usd(hourly_usd, seconds, 1, minimum_s)
    return round(usd, 6), f"${hourly_usd:g}/h x {billed:.0f} s billed (per second, 60 s minimum)"


HOURS_PER_MONTH = 730.0  # how AWS and Google turn a per-GB-month storage price into hours


@dataclass(frozen=True)
class PriceHistory:
    """The hourly prices an instance was charged at: ``points`` are (from unix time, USD/h), in order,
    each in effect until the next; ``source`` names where they came from (for the ``cost_basis``)."""

    points: tuple[tuple[float, float], ...]
    source: str

    def price_at(self, moment: float) -> float | None:
        """The price in effect at ``moment`` (the first one's, before it: the history starts late)."""
        if not self.points:
            return None
        current = self.points[0][1]
        for at, usd in self.points:
            if at > moment:
                break
            current = usd
        return current


def integrate_usd(
    history: PriceHistory, start: float, seconds: float, minimum_s: float = INSTANCE_MINIMUM_S
) -> float:
    """USD for one instance alive ``seconds`` from ``start``, billed per second (``billed_seconds``) at the
    price in effect each second: the integral of the history's step function over the billed window."""
    end = start + billed_seconds(seconds, minimum_s)
    moments = [start] + [at for at, _ in history.points if start < at < end] + [end]
    total = 0.0
    for a, b in zip(moments, moments[1:], strict=False):
        total += (history.price_at(a) or 0.0) * (b - a) / 3600.0
    return total


def volume_usd(
    gib: float, usd_per_gb_month: float, seconds: float, minimum_s: float = INSTANCE_MINIMUM_S
) -> float:
    """A volume's storage for the instance's billed lifetime (per second, as the instance)."""
    return gib * usd_per_gb_month * billed_seconds(seconds, minimum_s) / (HOURS_PER_MONTH * 3600.0)


def instance_cost(
    hourly_usd: float | None,
    start: float,
    seconds: float,
    count: int = 1,
    history: PriceHistory | None = None,
    disk: tuple[float, float] | None = None,
) -> tuple[float | None, str]:
    """``count`` instances alive ``seconds`` from ``start`` (a gang's nodes, launched together): at the
    prices ``history`` says they were charged (EC2 spot, which moves), else at ``hourly_usd`` (the
    launch's price: on-demand, GCE Spot), plus each one's root volume (``disk``: GiB, USD per GB-month).
    Returns (USD rounded to the cent's hundredth, the ``cost_basis``)."""
    billed = billed_seconds(seconds)
    nodes = f" x {count} nodes" if count > 1 else ""
    if history is not None and history.points:
        compute = integrate_usd(history, start, seconds) * count
        prices = sorted(
            {usd for at, usd in history.points if at < start + billed} | {history.price_at(start) or 0.0}
        )
        span = f"${prices[0]:g}/h" if len(prices) == 1 else f"${prices[0]:g}-{prices[-1]:g}/h"
        basis = f"{history.source}: {span} over {billed:.0f} s billed (per second, 60 s minimum){nodes}"
    elif hourly_usd is not None:
        compute = billed_usd(hourly_usd, seconds, count)
        basis = f"${hourly_usd:g}/h x {billed:.0f} s billed (per second, 60 s minimum){nodes}"
    else:
        return None, f"{billed:.0f} s billed; no price known for this instance type"
    if disk is not None and disk[0] and disk[1]:
        gib, per_month = disk
        compute += volume_usd(gib, per_month, seconds) * count
        basis += f" + {gib:g} GiB root volume at ${per_month:g}/GB-month"
    return round(compute, 6), basis
