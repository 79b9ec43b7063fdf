"""Replay a set of zone traces through a policy that may move between zones.

A zone set is the trace files of one instance group in one folder (``us-west-2a_v100_1.json``,
``us-west-2b_v100_1.json``, ...: zone, then group), same tick, aligned from the same start; a
shorter file counts as unavailable past its end, as in :mod:`.simulate`. The model is the
single-zone simulator's, plus:

* **No clairvoyance.** Each tick the run sees one zone: the one its spot instance runs in, or
  else the first zone :func:`.zones.rank_zones` gives (the ranking the operator's resume loop
  uses). Trying a zone takes that tick; a zone found without spot gets a ``capacity_error``
  event, a preemption a ``preempted`` one, so the ranking moves on to the next zone.
* **Moves.** The checkpoint lives where the last instance ran. A spot launch in another zone
  adds ``restore_hours`` to the changeover (restore from the bucket); in another region also
  ``transfer_hours`` and ``egress_usd``. On-demand always runs where the checkpoint is.
* **Gangs.** Trace values are counts of free instances; a zone has spot for a run of ``nodes``
  nodes at a tick when its count is at least ``nodes`` (a gang moves and is preempted as one).

:func:`ours_zones` is the zone-aware ``policy="deadline"``: while the run has not yet tried every
zone in the current outage it keeps trying (waiting, not paying for on-demand), unless
:func:`.base.must_run_on_demand` says the deadline needs on-demand now; after that it is ``ours``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from .base import EPSILON_HOURS, ON_DEMAND, SPOT, WAIT, Decision, PolicyState, must_run_on_demand
from .bounds import NO_MOVES, Moves
from .deadline import ours
from .simulate import SimulationError, tick_use
from .zones import TROUBLE_HALF_LIFE_HOURS, ZoneEvent, rank_zones

FORGET_HALF_LIVES = 24
"""Events older than this many half-lives weigh < 1e-7 in the ranking; dropping them keeps each
tick's ranking cheap (the list would otherwise grow by one per tick of a long outage)."""

ZoneDecideFn = Callable[[PolicyState, int], Decision]
"""A zone-aware policy: ``decide(state, zones)``; ``state.spot_available`` is about the zone tried."""


@dataclass(frozen=True)
class ZoneSet:
    """Aligned traces of one instance group: ``counts[z][i]`` free instances in ``zones[z]`` at tick ``i``."""

    group: str
    gap_hours: float
    zones: tuple[str, ...]
    regions: tuple[str, ...]
    counts: tuple[tuple[int, ...], ...]

    @property
    def ticks(self) -> int:
        return max(len(c) for c in self.counts)

    def available(self, nodes: int = 1) -> list[list[int]]:
        """0/1 rows, padded with 0 to the longest zone: 1 where ``nodes`` instances are free at once."""
        n = self.ticks
        return [[1 if v >= nodes else 0 for v in c] + [0] * (n - len(c)) for c in self.counts]


def region_of(zone: str) -> str:
    """``us-west-2a`` -> ``us-west-2`` (AWS zone names are the region plus one letter)."""
    return zone[:-1] if zone and zone[-1].isalpha() else zone


def load_zone_sets(folder: str | Path) -> list[ZoneSet]:
    """Group ``ZONE_GROUP.json`` files of a folder by group (the name after the first ``_``)."""
    groups: dict[str, list[tuple[str, float, tuple[int, ...]]]] = {}
    for path in sorted(Path(folder).glob("*.json")):
        zone, _, group = path.stem.partition("_")
        raw = json.loads(path.read_text())
        gap = float(raw["metadata"]["gap_seconds"]) / 3600.0
        groups.setdefault(group or zone, []).append((zone, gap, tuple(max(0, int(v)) for v in raw["data"])))
    sets = []
    for group, members in sorted(groups.items()):
        gaps = {gap for _, gap, _ in members}
        if len(gaps) != 1:
            raise ValueError(f"zone set {group!r}: its files have different gap_seconds {sorted(gaps)}")
        zones = tuple(z for z, _, _ in members)
        sets.append(
            ZoneSet(
                group, gaps.pop(), zones, tuple(region_of(z) for z in zones), tuple(c for *_, c in members)
            )
        )
    return sets


def ours_zones(state: PolicyState, zones: int) -> Decision:
    """Zone-aware ``ours``: keep trying other zones through an outage before paying for on-demand.

    ``state.spell_hours`` is how long the zones tried have all been without spot; while that is
    under one tick per other zone, some zone is still untried, so we wait (the try is the wait)
    unless the deadline's safety net fires; after that it is ``ours`` (waiting longer before
    on-demand, 4 changeovers past ``ours``' budget, was tried and cost more: docs/spot_policy.md).
    A running on-demand instance is kept meanwhile (leaving it is ``ours``' decision, made when a
    zone with spot is found).
    """
    if must_run_on_demand(state):
        return ON_DEMAND
    trying = not state.spot_available and state.spell_hours < (zones - 1) * state.tick - EPSILON_HOURS
    if trying and state.running != ON_DEMAND:
        return WAIT
    return ours(state)


@dataclass(frozen=True)
class ZoneRunResult:
    """One simulated job over a zone set (hours and currency as given)."""

    cost: float
    finish_hours: float | None
    met_deadline: bool
    launches: int
    interruptions: int
    moves: int
    spot_hours: float
    on_demand_hours: float
    on_demand_spot_seen_hours: float = 0.0
    """On-demand hours while the zone looked at had spot: where a policy without foresight loses most
    against the optimum (docs/spot_policy.md, "Where the gap goes")."""


def simulate_zones(
    zone_set: ZoneSet,
    decide: ZoneDecideFn,
    *,
    job_hours: float,
    deadline_hours: float,
    changeover_hours: float,
    spot_price: float,
    on_demand_price: float,
    moves: Moves = NO_MOVES,
    nodes: int = 1,
    start: int = 0,
    max_hours: float | None = None,
) -> ZoneRunResult:
    """Run one job from tick ``start`` over every zone of ``zone_set``; see the module docstring."""
    rows = zone_set.available(nodes)
    names = list(zone_set.zones)
    region = dict(zip(zone_set.zones, zone_set.regions, strict=True))
    gap, d = zone_set.gap_hours, changeover_hours
    max_ticks = int((max_hours or 2.0 * deadline_hours + job_hours) / gap) + 1
    n = zone_set.ticks
    events: list[ZoneEvent] = []
    done = cost = spot_h = od_h = od_seen_h = 0.0
    running: str | None = None
    run_zone: str | None = None
    home: str | None = None  # where the checkpoint is
    setup_left = running_hours = seen_up = seen_down = spell = 0.0
    launches = interruptions = n_moves = spells = 0
    prev: bool | None = None
    forget = FORGET_HALF_LIVES * TROUBLE_HALF_LIFE_HOURS

    def best_zone(now: float) -> str:
        if len(names) == 1:
            return names[0]
        if events and events[0].at < now - forget:
            events[:] = [e for e in events if e.at >= now - forget]
        return rank_zones(names, events, now)[0]

    for k in range(max_ticks):
        i, now = start + k, k * gap
        probe = run_zone if running == SPOT and run_zone else best_zone(now)
        avail = 0 <= i < n and rows[names.index(probe)][i] == 1
        if running == SPOT and not avail:
            events.append(ZoneEvent(probe, "preempted", now))
            running, run_zone, setup_left, running_hours = None, None, 0.0, 0.0
            interruptions += 1
            probe = best_zone(now)  # relaunch: try the best-ranked zone now
            avail = 0 <= i < n and rows[names.index(probe)][i] == 1
        if not avail and (not events or events[-1] != ZoneEvent(probe, "preempted", now)):
            events.append(ZoneEvent(probe, "capacity_error", now))
        if prev is None or avail != prev:
            spell, spells = 0.0, spells + avail
        else:
            spell += gap
        state = PolicyState(
            elapsed=now,
            deadline=deadline_hours,
            work_done=done,
            work_remaining=job_hours - done,
            changeover=d,
            spot_available=avail,
            running=running,  # type: ignore[arg-type]
            setup_remaining=setup_left,
            tick=gap,
            price_ratio=spot_price / on_demand_price,
            interruptions=interruptions,
            launches=launches,
            spot_hours=spot_h,
            on_demand_hours=od_h,
            seen_available_hours=seen_up,
            seen_unavailable_hours=seen_down,
            spot_spells=spells,
            spell_hours=spell,
            running_hours=running_hours,
        )
        choice = decide(state, len(names))
        if choice == SPOT and not avail:
            raise SimulationError(f"policy chose spot at hour {now:.2f} but none is available in {probe}")
        if choice not in (SPOT, ON_DEMAND, WAIT):
            raise SimulationError(f"policy returned {choice!r}")
        target = None if choice == WAIT else choice
        if target != running:
            running, running_hours = target, 0.0
            if target is not None:
                launches += 1
                setup_left = d
                where = probe if target == SPOT else (home or probe)
                if home is not None and where != home:
                    n_moves += 1
                    setup_left += moves.restore_hours
                    if region[where] != region[home]:
                        setup_left += moves.transfer_hours
                        cost += moves.egress_usd
                home, run_zone = where, where
                if target == SPOT:
                    events.append(ZoneEvent(where, "launched", now))
        seen_up, seen_down = seen_up + gap * avail, seen_down + gap * (not avail)
        prev = avail
        if running is None:
            continue
        price = spot_price if running == SPOT else on_demand_price
        setup_part, work_part, used, finishing = tick_use(setup_left, gap, done, job_hours)
        cost += price * used
        if running == SPOT:
            spot_h += used
        else:
            od_h += used
            od_seen_h += used * avail
        if finishing:
            finish = now + used
            met = finish <= deadline_hours + 1e-9
            return ZoneRunResult(cost, finish, met, launches, interruptions, n_moves, spot_h, od_h, od_seen_h)
        done += work_part
        setup_left -= setup_part
        running_hours += gap
    return ZoneRunResult(cost, None, False, launches, interruptions, n_moves, spot_h, od_h, od_seen_h)


PROBE_HOURS = 1.0 / 6.0
"""The operator's default ``probe_interval`` (10 min): how often it asks the policy while on-demand runs."""


def as_operator(decide: ZoneDecideFn, probe_hours: float = PROBE_HOURS) -> ZoneDecideFn:
    """``decide`` as ``CheckpointResumeOperator`` acts on it (``lifecycle.resume.switch``).

    * Between attempts (nothing runs) and on spot it is asked every tick, as the simulator does.
    * While on-demand runs it is asked only every ``probe_hours`` (``probe_interval``), as if spot
      were there, with the spell as old as the operator can know: the time since it last saw spot
      unavailable (a capacity error, a preemption, a failed probe). When it says spot, the probe is
      a spot launch in the zone the simulator looks at: spot there, the switch (a launch: the full
      changeover, spot billed; the on-demand attempt's work while spot boots is not credited, so
      this is an upper bound of what the operator pays); none, nothing is paid, and spot counts as
      seen unavailable now. ``wait`` while on-demand runs keeps it (the operator never stops a
      running on-demand attempt to wait).

    The spell statistics in the state (spells seen, hours seen available) stay the simulator's,
    which looks every tick; the operator's come from its attempts and probes. Stateful per run:
    it starts over when the clock goes back (the next run of a replay).
    """
    memo: dict[str, float] = {}

    def zone_decide(state: PolicyState, zones: int) -> Decision:
        now = state.elapsed
        if not memo or now < memo["clock"]:
            memo.update(unavailable=0.0, looked=float("-inf"), on_demand_since=0.0)
        memo["clock"] = now
        if state.running != ON_DEMAND:
            if not state.spot_available:
                memo["unavailable"] = now
            choice = decide(state, zones)
            memo["on_demand_since"] = now
            return choice
        if now - max(memo["on_demand_since"], memo["looked"]) < probe_hours - EPSILON_HOURS:
            return ON_DEMAND
        memo["looked"] = now
        asked = replace(state, spot_available=True, spell_hours=now - memo["unavailable"])
        if decide(asked, zones) != SPOT:
            return ON_DEMAND
        if not state.spot_available:
            memo["unavailable"] = now
            return ON_DEMAND
        return SPOT

    return zone_decide


def single_zone(decide: Callable[[PolicyState], Decision]) -> ZoneDecideFn:
    """A single-zone policy used in a zone set (it ignores the zone count)."""

    def zone_decide(state: PolicyState, zones: int) -> Decision:
        del zones
        return decide(state)

    return zone_decide
