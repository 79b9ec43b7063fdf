"""Where to launch spot next: the zones a run may use, ranked by what the run has seen there.

A preemption or a capacity error says something about one zone for a while: spot capacity comes
back in spells, so the zone that just took an instance away is the worst bet for the next few
minutes and an untroubled zone of the same region is the best (the public traces: spot is free in
at least one of 9 zones 99% of the time, in a given one 64%). This module is the one place that
turns those observations into an order; the operator's resume loop and the simulator both call it,
so the benchmark measures the ranking the operator uses.

Where the cloud also says how likely a spot request is to succeed in each zone now (EC2's Spot
placement score, 1-10, asked at each spot launch when the account allows it), that breaks the ties
between zones the run has no fresh trouble in: first-hand trouble outranks the cloud's estimate, and
the estimate outranks the offer's fixed order. The traces carry no scores, so the simulator ranks
without them.

Pure stdlib, no cloud calls. Times are hours since the job started (as in :mod:`.base`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

ZoneEventKind = Literal["launched", "preempted", "capacity_error"]
"""What happened in a zone: a spot instance started there, was taken back, or could not be had."""

TROUBLE_HALF_LIFE_HOURS = 0.5
"""How fast a zone's trouble is forgotten: a preemption half an hour ago weighs half as much."""

WEIGHTS: dict[str, float] = {"preempted": 1.0, "capacity_error": 0.6, "launched": 0.0}
"""A preemption says more than a capacity error (it also cost the work since the last checkpoint)."""

SCORED_TIE = 0.1
"""With placement scores, trouble is compared in steps of this: zones in the same step count as
equally troubled and the score decides between them. Below one step is no fresh trouble (a
preemption more than about 1.7 h ago, a capacity error more than 1.3 h ago)."""


@dataclass(frozen=True, slots=True)
class ZoneEvent:
    """One observation of one zone, at ``at`` hours since the job started."""

    zone: str
    kind: ZoneEventKind
    at: float


def zone_trouble(zone: str, events: Sequence[ZoneEvent], now: float) -> float:
    """The zone's recent trouble: each preemption or capacity error there, decayed by its age."""
    total = 0.0
    for e in events:
        if e.zone != zone or e.at > now:
            continue
        weight = WEIGHTS.get(e.kind, 0.0)
        if weight:
            total += weight * math.pow(0.5, (now - e.at) / TROUBLE_HALF_LIFE_HOURS)
    return total


def rank_zones(
    zones: Sequence[str],
    events: Sequence[ZoneEvent],
    now: float,
    scores: Mapping[str, float] | None = None,
) -> list[str]:
    """``zones`` in the order to try spot in, least recent trouble first.

    ``scores`` (zone -> the cloud's placement score, higher is likelier; None or empty: none known)
    orders the zones whose trouble falls in the same step of ``SCORED_TIE``, highest score first; a
    zone without a score counts as the lowest. Remaining ties keep the caller's order (the offer's own
    zone order, cheapest first), so a run that has seen nothing and has no scores behaves exactly as
    before this module existed. Duplicates are dropped.
    """
    unique = list(dict.fromkeys(zones))
    order = {z: i for i, z in enumerate(unique)}
    if not scores:
        return sorted(unique, key=lambda z: (round(zone_trouble(z, events, now), 9), order[z]))
    trouble = {z: zone_trouble(z, events, now) for z in unique}
    return sorted(
        unique, key=lambda z: (math.floor(trouble[z] / SCORED_TIE + 1e-9), -scores.get(z, 0.0), order[z])
    )
