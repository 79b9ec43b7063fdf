"""The state record every spot policy decides on, and the one safety rule they all share.

A policy is a plain function ``decide(state) -> "spot" | "on_demand" | "wait"``. Everything a
policy may look at is in :class:`PolicyState`, so a decision is a pure function of what the
operator knows *now*: the same state always gives the same answer, a relaunched operator can
rebuild the state from its own records, and the simulator can replay a trace through exactly the
code the operator runs.

Units: every duration in this module is in **hours** (float), measured from the job's start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Decision = Literal["spot", "on_demand", "wait"]
"""What to run until the next decision: a spot instance, an on-demand instance, or nothing."""

Running = Literal["spot", "on_demand"] | None
"""What is running right now (``None``: nothing, e.g. right after a preemption)."""

SPOT: Decision = "spot"
ON_DEMAND: Decision = "on_demand"
WAIT: Decision = "wait"

EPSILON_HOURS = 1e-6
"""Slack for float rounding in deadline arithmetic (3.6 ms): keeps ``>=`` checks honest."""


@dataclass(frozen=True, slots=True)
class PolicyState:
    """Everything a policy may know when it decides. All durations are hours.

    The first block is the job itself; the second is what the operator has *observed so far*
    (never the future). A policy must not assume anything else about the world.

    Attributes:
        elapsed: time since the job was submitted.
        deadline: time (since submission) by which all work must be done.
        work_done: useful compute completed and safely checkpointed.
        work_remaining: compute still to do (``total work - work_done``).
        changeover: time lost on every launch or relaunch (boot + setup + progress lost since the
            last checkpoint); no progress is made during it, but the instance is paid for.
        spot_available: whether a spot instance can be launched (or keeps running) now.
        running: what is running now; ``None`` after a preemption or while waiting.
        setup_remaining: changeover still to go on the running instance (0 once it is working).
        tick: the longest time until ``decide`` is called again. The deadline guarantee
            assumes the next call comes within ``tick``; the operator must poll at least that often.
        price_ratio: spot price / on-demand price for this instance type (e.g. 0.32).
        interruptions: spot preemptions so far.
        launches: instance launches so far (each one cost a changeover).
        spot_hours: time spent running spot instances (including their changeovers).
        on_demand_hours: time spent running on-demand instances (including their changeovers).
        seen_available_hours: time spot was observed available since submission.
        seen_unavailable_hours: time spot was observed unavailable since submission.
        spot_spells: how many separate periods of spot availability were seen (including a
            current one); ``seen_available_hours / spot_spells`` estimates a spot lifetime.
        spell_hours: how long the current availability state (available or not) has lasted.
        running_hours: how long the current instance has been up (0 if nothing runs).
    """

    elapsed: float
    deadline: float
    work_done: float
    work_remaining: float
    changeover: float
    spot_available: bool
    running: Running = None
    setup_remaining: float = 0.0
    tick: float = 1.0 / 6.0
    price_ratio: float = 0.32
    interruptions: int = 0
    launches: int = 0
    spot_hours: float = 0.0
    on_demand_hours: float = 0.0
    seen_available_hours: float = 0.0
    seen_unavailable_hours: float = 0.0
    spot_spells: int = 0
    spell_hours: float = 0.0
    running_hours: float = 0.0

    @property
    def slack(self) -> float:
        """Spare time: time left to the deadline minus work left (may be negative)."""
        return self.deadline - self.elapsed - self.work_remaining


def must_run_on_demand(state: PolicyState, reserve: float = 0.0) -> bool:
    """True when anything but on-demand now could make the job miss its deadline.

    Why this is exact and safe: if we do not run on-demand for the next ``tick``, the worst case
    is zero progress and then a fresh on-demand launch, which finishes at
    ``elapsed + tick + changeover + work_remaining``. So we may only leave on-demand (or stay off
    it) while that is within the deadline. Once the rule fires, the job runs on-demand, its slack
    stops shrinking, and the rule keeps firing: the commitment needs no memory. ``reserve`` adds
    extra required slack (e.g. the paper's ``2 * changeover`` safety net).
    """
    needed = max(state.tick + state.changeover, reserve)
    return state.slack < needed + EPSILON_HOURS
