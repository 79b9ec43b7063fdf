"""Where the resume loop (re)launches spot: the run's zone events, the zones ranked, each move named.

A preemption or a capacity error says something about one zone for a while (``policy.zones``), so a
spot relaunch tries the allowed zones least-recent-trouble first instead of in the offer's fixed
order: after a preemption the run moves to another zone of the region and restores its checkpoint
from the bucket there (the run folder is the bucket's, not the zone's: a move copies nothing).

Everything here is derived from the ledger's rows (``AttemptRow.zone``, ``ended``, ``no_capacity_in``
and their times), so a loop rebuilt after a deferral, a killed worker or an Airflow retry ranks the
zones exactly as the loop before it did (the placement scores excepted: a forecast of now, asked
anew at each launch). No cloud calls of its own: the scores come through the caller's function.

- ``allowed_zones``: the zones an offer may launch in: the user's ``zones`` it is sold in (in the
  user's order), else what the backend's ``zones_for`` gives (today's behaviour).
- ``launch_order``: those zones ranked by ``policy.zones.rank_zones`` for a spot launch with two or
  more of the user's zones, with the cloud's placement scores where it gives them (EC2's Spot
  placement score, asked through the backend only then); one zone, or no ``zones`` argument (the
  offers' own zones, EC2 placing the instance itself) is left exactly as it was.
- ``note_move``: an attempt that ran in another zone than the attempt before gets ``moved_from`` and
  ``move_reason`` (the ledger's table prints it, the XCom's ``attempts`` carry it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from airflow_cloudtrain.lifecycle.resume.history import SPOT_ENDINGS, AttemptRow, RunHistory
from airflow_cloudtrain.policy.zones import ZoneEvent, rank_zones, zone_trouble

if TYPE_CHECKING:
    import logging

    from airflow_cloudtrain.catalog.offers import Offer

HOUR = 3600.0


def _hours(history: RunHistory, at: float | None) -> float:
    """Unix time as hours since the loop started (the policy engine's clock)."""
    return ((at if at is not None else history.started_at) - history.started_at) / HOUR


def zone_events(history: RunHistory, before: int | None = None) -> list[ZoneEvent]:
    """What the run's spot attempts (those numbered below ``before``, or all) saw in each zone: a
    capacity error in every zone its launch found none, a launch where it ran, a preemption (with or
    without notice) where it was taken back; and a capacity error in every zone a probe (a spot launch
    beside a running on-demand attempt) found none. On-demand attempts say nothing about spot capacity."""
    events: list[ZoneEvent] = []
    for row in history.heads:  # a gang's attempt once: it moved and was preempted as one
        if not row.spot or (before is not None and row.attempt >= before):
            continue
        asked = _hours(history, row.requested_at or row.launched_at or row.ended_at)
        events.extend(ZoneEvent(zone, "capacity_error", asked) for zone in row.no_capacity_in)
        if row.instance_id and row.zone:
            events.append(ZoneEvent(row.zone, "launched", _hours(history, row.launched_at)))
            if row.ended in SPOT_ENDINGS:
                events.append(ZoneEvent(row.zone, "preempted", _hours(history, row.ended_at)))
    last = max((r.attempt for r in history.heads), default=0)
    if before is None or before > last:  # probes came after the rows so far (``lifecycle.resume.switch``)
        for probe in history.probes:  # a spot launch beside on-demand that found no capacity there
            at = _hours(history, float(probe["at"]))
            events.extend(
                ZoneEvent(z, "capacity_error", at) for z in probe.get("zones") or [] if not probe.get("ok")
            )
    return events


def no_capacity_zones(tried: Sequence[Sequence[str]], region: str | None) -> list[str]:
    """The zones of a launcher's ``tried`` list (``(type, where, code)``): ``where`` is the region
    when the cloud chose the zone (EC2 without one), which names no zone and is left out."""
    return list(dict.fromkeys(str(t[1]) for t in tried if len(t) > 1 and t[1] and t[1] != region))


def allowed_zones(zones: Sequence[str], offer: Offer, default: Sequence[str | None]) -> list[str | None]:
    """The zones to try ``offer`` in: the user's ``zones`` the offer is sold in, in the user's order
    (none: the next offer is tried), or without ``zones`` the backend's own (``zones_for``)."""
    if not zones:
        return list(default)
    if not offer.zones:
        return list(zones)
    from airflow_cloudtrain.catalog.rules import rules

    return [z for z in zones if rules(offer.cloud).offer_in_zone(offer.zones, z)]


def launch_order(
    history: RunHistory,
    zones: Sequence[str],
    spot: bool,
    offer: Offer,
    default: Sequence[str | None],
    now: float,
    log: logging.Logger | None = None,
    scores: Callable[[list[str]], Mapping[str, float] | None] | None = None,
) -> list[str | None]:
    """The zones to try ``offer`` in, in order: for spot with two or more of the user's ``zones``, least
    recent trouble first, then the highest placement score (``scores(zones)``, asked only here; None:
    the cloud gives none), then the allowed order, so a run that saw nothing and has no scores
    launches as before. Without ``zones`` the order is ``zones_for``'s, as before this module: moving
    is opted into."""
    allowed = allowed_zones(zones, offer, default)
    named = [z for z in allowed if z]
    if not zones or not spot or len(named) < 2 or len(named) != len(allowed):
        return allowed
    events = zone_events(history)
    at = _hours(history, now)
    scored = scores(named) if scores is not None else None
    ranked = rank_zones(named, events, at, scored)
    if (ranked != named or scored) and log is not None:
        log.info(
            "Spot zones for %s, least recent trouble first%s: %s",
            offer.instance_type,
            ", then Spot placement score" if scored else "",
            ", ".join(_said(z, zone_trouble(z, events, at), scored) for z in ranked),
        )
    return list(ranked)


def _said(zone: str, trouble: float, scores: Mapping[str, float] | None) -> str:
    score = f", score {scores[zone]:g}" if scores and zone in scores else ""
    return f"{zone} (trouble {trouble:.2f}{score})"


def note_move(history: RunHistory, rows: list[AttemptRow]) -> None:
    """Mark ``rows`` (one attempt: a gang's every node) as a move when the attempt ran in another zone
    than the last attempt before it that ran: ``moved_from`` that zone, ``move_reason`` why."""
    head = rows[0] if rows else None
    if head is None or not head.instance_id or not head.zone:
        return
    before = [r for r in history.heads if r.attempt < head.attempt and r.instance_id and r.zone]
    if not before or before[-1].zone == head.zone:
        return
    moved_from = before[-1].zone
    reason = move_reason(history, head, moved_from)
    for row in rows:
        row.moved_from, row.move_reason = moved_from, reason


def move_reason(history: RunHistory, head: AttemptRow, moved_from: str | None) -> str:
    """Why the attempt ran in ``head.zone``: what each zone had seen before it (preemptions,
    capacity errors, the ranking's trouble) and where its own launch found no capacity."""
    events = zone_events(history, before=head.attempt)
    at = _hours(history, head.requested_at or head.launched_at)
    seen = list(dict.fromkeys([*(e.zone for e in events), moved_from or "", head.zone or ""]))

    def said(zone: str) -> str:
        kinds = [e.kind for e in events if e.zone == zone]
        return (
            f"{zone}: {kinds.count('preempted')} preemption(s), {kinds.count('capacity_error')} "
            f"capacity error(s), trouble {zone_trouble(zone, events, at):.2f}"
        )

    mode = "spot relaunch" if head.spot else "on-demand launch"
    parts = [f"{mode}; zones before it: " + "; ".join(said(z) for z in seen if z)]
    if head.no_capacity_in:
        parts.append(f"no capacity at this launch in {', '.join(head.no_capacity_in)}")
    return "; ".join(parts)
