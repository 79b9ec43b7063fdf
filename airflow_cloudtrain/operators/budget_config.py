"""``max_cost``, checked at parse time: a positive amount of USD that buys at least a minute.

EC2 and GCE bill at least 60 s of every instance, so a budget below one minute of the cheapest offer
that fits (every node of a gang counted) cannot run anything: it fails when the DAG is parsed, naming
the offer, rather than launching an instance only to stop it at the first poll.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_cloudtrain.catalog.offers import Offer

FORMS = "a positive number of USD (25, 12.5, '12.50' or '$12.50'), or None for no budget"


def parse_max_cost(value: Any, name: str = "max_cost") -> float | None:
    """USD, or None; ValueError naming the field on anything else."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{name}={value!r} is not an amount: give {FORMS}")
    number: float
    if isinstance(value, str):
        text = value.strip().removeprefix("$").strip()
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"{name}={value!r} is not a number: give {FORMS}") from None
    else:
        number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{name}={value!r} must be more than zero: give {FORMS}")
    return number


def check_covers_a_minute(
    max_cost: float, offers: Sequence[Offer], nodes: int, raw: Any = None, name: str = "max_cost"
) -> None:
    """ValueError when ``max_cost`` buys less than the 60 s minimum of the cheapest offer x ``nodes``."""
    from airflow_cloudtrain.core.billing import INSTANCE_MINIMUM_S, billed_usd

    priced = [o for o in offers if o.hourly is not None]
    if not priced:
        return
    cheapest = min(priced, key=lambda o: float(o.hourly or 0.0))
    hourly = float(cheapest.hourly or 0.0)
    minute = billed_usd(hourly, INSTANCE_MINIMUM_S, nodes)
    if max_cost < minute:
        of_nodes = f" x {nodes} nodes" if nodes > 1 else ""
        raise ValueError(
            f"{name}={max_cost if raw is None else raw!r} (USD) buys less than one minute (the cloud's minimum bill) of the cheapest offer "
            f"that fits, {cheapest.describe()} at ${hourly:g}/h{of_nodes}: ${minute:.4f}; raise {name} or leave "
            "it out"
        )
