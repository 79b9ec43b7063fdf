"""What a run cost: every engine's costs go through ``billed_usd`` (and ``billed_cost`` for a run).

EC2 and GCE bill Linux instances per second with a one-minute minimum (``INSTANCE_MINIMUM_S``), so
an instance that lived 20 s is billed 60 s. A fleet's workers are instances too: each worker's
lifetime is billed on its own. Vertex AI custom jobs are billed per replica for the job's run time,
with no per-replica minimum here (``VERTEX_MINIMUM_S``: the job's estimate, see
``mlengine.pricing``).
"""

from __future__ import annotations

import math

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
