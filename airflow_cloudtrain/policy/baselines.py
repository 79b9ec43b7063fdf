"""Reference policies: always on-demand, greedy, and the paper's Uniform Progress.

They exist so ``ours`` (see :mod:`.deadline`) is always measured against something: the
benchmark and the tests run all of them through the same simulator. Each is a pure function of
:class:`~.base.PolicyState`.
"""

from __future__ import annotations

from .base import ON_DEMAND, SPOT, WAIT, Decision, PolicyState, must_run_on_demand


def on_demand(state: PolicyState) -> Decision:
    """Always on-demand: the price every other policy is compared with (and never late)."""
    return ON_DEMAND


def greedy(state: PolicyState) -> Decision:
    """Spot whenever it is there, wait otherwise, on-demand for good once the slack is gone.

    This is the "obvious" rule. It spends all its slack waiting early on, so by the end it is
    stuck on on-demand while spot may well be available again.
    """
    if must_run_on_demand(state):
        return ON_DEMAND
    return SPOT if state.spot_available else WAIT


def expected_progress(state: PolicyState, at: float) -> float:
    """Work that a straight line from (0, 0) to (deadline, total work) has done at time ``at``."""
    total = state.work_done + state.work_remaining
    return total * min(at, state.deadline) / state.deadline


def uniform_progress(state: PolicyState) -> Decision:
    """Uniform Progress, as in Wu et al., "Can't Be Late" (NSDI 2024), section 5.2.

    With cp(t) = work done and ep(t) = total * t / deadline, the paper's rules are:

    1. Uniform Progress: when idle and cp(t) < ep(t), go on-demand to catch up.
    2. Taking Risks: take spot whenever it is available and stay on it until preempted.
    3. Hysteresis: once on on-demand, stay on it until cp(t) >= ep(t + 2d).
    4. Safety Net: when remaining time < remaining work + 2d, on-demand until the end.

    Rule 4 uses ``max(2d, tick + d)`` so that it stays safe when decisions are a tick apart.
    """
    d = state.changeover
    if must_run_on_demand(state, reserve=2.0 * d):
        return ON_DEMAND
    if state.running == ON_DEMAND and state.work_done < expected_progress(state, state.elapsed + 2.0 * d):
        return ON_DEMAND
    if state.spot_available:
        return SPOT
    if state.work_done < expected_progress(state, state.elapsed):
        return ON_DEMAND
    return WAIT
