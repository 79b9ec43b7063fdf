"""Spot policy engine: finish before the deadline for the least money.

A policy is a pure function ``decide(PolicyState) -> "spot" | "on_demand" | "wait"``. The
operator calls it at every launch, relaunch and poll; :func:`simulate` replays availability traces
through the very same function. Pure stdlib, no cloud calls (the offline optimum, :func:`optimal_cost`, an analysis tool, imports
numpy when called). All durations are hours.
"""

from __future__ import annotations

from .base import ON_DEMAND, SPOT, WAIT, Decision, PolicyState, Running, must_run_on_demand
from .baselines import greedy, on_demand, uniform_progress
from .deadline import ours
from .optimum import optimal_cost, optimal_costs, optimal_plan
from .registry import ALIASES, POLICIES, Policy, available_policies, get_policy
from .simulate import RunResult, SimulationError, Trace, load_trace, simulate

__all__ = [
    "ALIASES",
    "ON_DEMAND",
    "POLICIES",
    "SPOT",
    "WAIT",
    "Decision",
    "Policy",
    "PolicyState",
    "RunResult",
    "Running",
    "SimulationError",
    "Trace",
    "available_policies",
    "get_policy",
    "greedy",
    "load_trace",
    "must_run_on_demand",
    "on_demand",
    "optimal_cost",
    "optimal_costs",
    "optimal_plan",
    "ours",
    "simulate",
    "uniform_progress",
]
