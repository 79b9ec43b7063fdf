"""Pick a spot policy by name, as the operator's ``policy=`` argument does.

Every policy is a pure function of :class:`~.base.PolicyState`, so there is no per-run state to
reset: :func:`get_policy` can hand out the same function to every run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from .base import Decision, PolicyState
from .baselines import greedy, on_demand, uniform_progress
from .deadline import ours

Policy = Callable[[PolicyState], Decision]
"""A policy: ``decide(state) -> "spot" | "on_demand" | "wait"``."""

POLICIES: Mapping[str, Policy] = MappingProxyType(
    {
        "on_demand": on_demand,
        "greedy": greedy,
        "uniform_progress": uniform_progress,
        "ours": ours,
    }
)
"""The policies by their canonical names (read-only)."""

ALIASES: Mapping[str, str] = MappingProxyType({"deadline": "ours"})
"""Other accepted names; ``"deadline"`` is what users write in the operator."""


def available_policies() -> tuple[str, ...]:
    """Every accepted name (canonical names and aliases), sorted."""
    return tuple(sorted({*POLICIES, *ALIASES}))


def get_policy(name: str) -> Policy:
    """Return the policy called ``name``; raise ``ValueError`` listing the valid names if unknown."""
    canonical = ALIASES.get(name, name) if isinstance(name, str) else None
    if canonical not in POLICIES:
        accepted = ", ".join(available_policies())
        raise ValueError(f"unknown spot policy {name!r}; expected one of: {accepted}")
    return POLICIES[canonical]
