"""``ours``: the default ``policy="deadline"``. Spend slack on waiting only while you can afford it.

Why not Uniform Progress: it runs on-demand whenever progress is behind a straight line, even
when the spot capacity still to come would have done that work for a third of the price; and
both it and greedy end on a hard commitment to on-demand, ignoring any spot seen near the end.

The idea: in a spot-unavailable hour you either wait (costs an hour of slack) or run on-demand
(costs money, keeps the slack). On-demand work done while spot is unavailable never displaces
spot, so the ideal is: wait while the slack can afford it, otherwise run on-demand *only while
spot is unavailable*, and take every spot spell worth taking until the very end. Slack is needed
later for changeovers (each spot spell near the end costs two: onto spot and back to
on-demand), so we keep a reserve for them, sized from what this run has observed so far.

Rules, in order (all from :class:`PolicyState`; nothing about the future of the trace):

1. Safety net: if anything but on-demand could miss the deadline, on-demand (exact, per tick).
2. Spot available: keep a running spot instance. Launch one from idle if the spells seen so far
   are long enough to repay a changeover (:func:`spot_pays_off`). Leave a working on-demand
   instance for it only once the spell has lasted ``SPELL_PROOF`` changeovers, times the slack
   scarcity (:func:`slack_scarcity`), and is expected to repay two: most spells that vanish do
   so within minutes, and chasing one costs two changeovers of money *and of slack*. When the
   slack can no longer pay for a switch to every spell still expected, only the proven-long
   ones are worth it (spells have a falling hazard): otherwise the slack runs out mid-job and
   the safety net pins the job to on-demand while spot is there. Otherwise treat spot as
   unavailable.
3. Spot unavailable: ``budget = slack - reserve`` with
   ``reserve = RESERVE_BASE + 2 * changeover * (expected spot spells until the deadline)``.
   Idle: wait while ``budget > 0`` (and for one tick after an outage starts, if slack is ample,
   since many outages are one-tick blips); otherwise start on-demand. On on-demand: keep it
   until ``budget >= HYSTERESIS`` so we do not pay a changeover for every short wait.

The constants below were chosen on the NSDI'24 AWS traces (see docs/spot_policy.md); the cost is
flat around them (within about 0.005 of on-demand cost), so they are not a knife-edge fit. On
those traces ``ours`` costs about 9% more than the offline optimum (:mod:`.optimum`, which knows
the future), short of the 5% goal; see the docs for what was tried.
"""

from __future__ import annotations

from .base import EPSILON_HOURS, ON_DEMAND, SPOT, WAIT, Decision, PolicyState, must_run_on_demand

RESERVE_BASE = 1.0
"""Hours of slack always kept back for bad luck near the end."""

PRIOR_SPELLS_PER_HOUR = 0.3
"""Prior rate at which new spot spells appear (one per ~3 h), before the run has seen any."""

PRIOR_WEIGHT_HOURS = 12.0
"""How many hours of observation the prior is worth; afterwards the run's own data dominate."""

SPELL_PROOF = 1.5
"""Leave a working on-demand instance only for a spot spell older than this many changeovers."""

HYSTERESIS = 2.0
"""Hours of spare budget needed before a working on-demand instance is stopped to wait."""

PRIOR_SPELL_HOURS = 2.0
"""Prior length of a spot spell, worth one observed spell."""

BLIP_MIN_SLACK = 3.0
"""Slack (hours) above which we wait out the first tick of an outage instead of paying for on-demand."""

SCARCITY_CAP = 10.0
"""Most that slack scarcity may stretch ``SPELL_PROOF`` (10 x 1.5 x 0.2 h changeover = 3 h)."""


def spell_rate(state: PolicyState) -> float:
    """Spot spells per hour seen so far, shrunk towards the prior while little has been seen."""
    seen = state.seen_available_hours + state.seen_unavailable_hours
    return (state.spot_spells + PRIOR_SPELLS_PER_HOUR * PRIOR_WEIGHT_HOURS) / (seen + PRIOR_WEIGHT_HOURS)


def expected_spell(state: PolicyState) -> float:
    """Mean length of the spot spells seen so far (hours), shrunk towards the prior."""
    return (state.seen_available_hours + PRIOR_SPELL_HOURS) / (state.spot_spells + 1)


def spot_pays_off(state: PolicyState, changeovers: int, age: float = 0.0) -> bool:
    """Whether the current spot spell is likely to last long enough to repay ``changeovers``.

    A spell of length ``o`` gives ``o - d`` hours of work for ``o`` spot-hours; one that also
    forces an on-demand relaunch costs ``d`` on-demand hours more. With ``k = 1 / price_ratio``
    it beats on-demand iff ``o > n k d / (k - 1)`` (Wu et al., section 5.4, with the observed
    mean spell standing in for their lifetime oracle). Spells that have already lasted ``age``
    tend to last longer (real traces have a falling hazard), so ``age`` is added to the estimate.
    """
    k = 1.0 / max(state.price_ratio, EPSILON_HOURS)
    if k <= 1.0:
        return False
    return expected_spell(state) + age > changeovers * k * state.changeover / (k - 1.0)


def slack_scarcity(state: PolicyState) -> float:
    """Spot spells still expected before the deadline per switch the slack can still pay (>= 1).

    Riding a spot spell from on-demand costs two changeovers of slack (onto spot, and back onto
    on-demand after the preemption), and once slack falls to the safety net the job is pinned
    to on-demand for good. 1 means the slack can pay for every spell we expect; above 1, only
    the longest spells should get it, and a spell's age is the only sign of its length we have.
    """
    if state.changeover <= 0.0:
        return 1.0
    affordable = max(state.slack - state.tick - state.changeover, 0.0) / (2.0 * state.changeover)
    expected = spell_rate(state) * (state.deadline - state.elapsed)
    return min(SCARCITY_CAP, max(1.0, expected / max(affordable, EPSILON_HOURS)))


def waiting_budget(state: PolicyState) -> float:
    """Slack we can still spend waiting, after reserving two changeovers per expected spot spell."""
    time_left = state.deadline - state.elapsed
    reserve = RESERVE_BASE + 2.0 * state.changeover * spell_rate(state) * time_left
    return state.slack - reserve


def ours(state: PolicyState) -> Decision:
    """Decide for ``policy="deadline"``; see the module docstring for the rules and why."""
    if must_run_on_demand(state):
        return ON_DEMAND
    if state.spot_available:
        if state.running == SPOT:
            return SPOT
        if state.running == ON_DEMAND:
            proof = SPELL_PROOF * state.changeover * slack_scarcity(state)
            spell_is_young = state.spell_hours < proof - EPSILON_HOURS
            worth_it = spot_pays_off(state, 2, age=state.spell_hours)
            return SPOT if worth_it and not spell_is_young else ON_DEMAND
        if spot_pays_off(state, 1):
            return SPOT
    # Spot is unavailable, or not worth launching: wait or pay for on-demand.
    budget = waiting_budget(state)
    if state.running == ON_DEMAND:
        return ON_DEMAND if budget < HYSTERESIS else WAIT
    if budget > 0.0:
        return WAIT
    outage_just_started = state.spell_hours < 0.5 * state.tick
    if outage_just_started and state.slack > BLIP_MIN_SLACK:
        return WAIT
    return ON_DEMAND
