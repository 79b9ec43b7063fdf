"""``ours_plan``: a policy that plans (a stochastic dynamic program) instead of following rules.

Why: the offline optimum (:mod:`.optimum`) is a dynamic program over (time, work, instance) with
the trace known. Its online counterpart is the same program over the *expected* future: fit a
small model of spot availability to what the run has seen so far, solve the program backwards
once for that model, and act by its decision for the current state. The program prices slack
(the value of time) and changeovers by itself, where ``ours`` needs a rule for each decision
(leave on-demand, wait out an outage, fall back, launch from idle).

**Model** (semi-Markov, :class:`SpellModel`): spot spells and outages each last a random time
whose distribution is a mixture of three exponentials (a falling hazard: an old spell is likely
to last longer). Its shape, :data:`PRIOR_UP` / :data:`PRIOR_DOWN`, was fitted (EM) once to the
spells of the shipped ``aws-10-26-2022`` traces (docs/spot_policy.md says which results are
therefore in-sample); the run scales both time axes by what it has seen: its mean spell and mean
outage, shrunk towards the prior's by :data:`PRIOR_SPELLS` spells. The chain's state is
(up or down, age bucket): ages 0, 1, 2-3, 4-7, ... steps, the last bucket open.

**Program** (:func:`solve`): state (time left, slack, what runs, availability state) on a grid of
``step`` hours (the larger of the poll tick and :data:`PLAN_STEP`). Time left and slack are the
natural axes: working keeps slack and spends a step of time, waiting spends a step of both, a
launch spends a changeover of both (interpolated between grid rows), so each row of time left
depends only on the last few rows (a ring buffer) and the solve is one numpy pass over rows,
vectorised over slack, availability states and what runs. Missing the deadline costs :data:`MISS_COST`. The decisions are cached per
(step, changeover, price ratio, grid, model scales rounded to :data:`SCALE_BIN`), so most
decisions are a table look-up.

**Hard deadline.** :func:`.base.must_run_on_demand` overrides the program first, exactly as in
``ours``: a poor model can cost money, never a deadline.

Needs numpy (imported on first solve; the rule-based policies stay stdlib-only).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from .base import ON_DEMAND, SPOT, WAIT, Decision, PolicyState, must_run_on_demand

PLAN_STEP = 1.0 / 12.0
"""Smallest grid step of the program (hours): 5 minutes. The program steps at the poll tick when
that is longer (the shipped traces: 10 and 5 minutes); a step longer than the tick (10 min on the
5-minute traces) cost 1.7 points of gap, a shorter one (5 min on 10-minute traces) was no better."""

PRIOR_UP = ((0.7211, 0.4887), (0.2346, 3.3314), (0.0443, 13.8131))
"""(weight, mean hours) of the spot spell length mixture, fitted to ``aws-10-26-2022`` (mean 1.75 h)."""

PRIOR_DOWN = ((0.7649, 0.3751), (0.2123, 3.0425), (0.0228, 18.6972))
"""The same for outages (mean 1.36 h): many one-tick blips, a few outages of a day."""

PRIOR_SPELLS = 3.0
"""How many spells the prior's means are worth before the run's own dominate."""

SCALE_BIN = 2.0
"""Model scales are rounded to powers of this (the cache key): a run re-plans when its mean spell
or outage moves past a factor of 2 (measured: as good as 1.25, for a quarter of the CPU)."""

MISS_COST = 1000.0
"""Cost (on-demand hours) of ending the plan past the deadline: far above any real bill."""

CODES: tuple[Decision, ...] = (WAIT, SPOT, ON_DEMAND)
"""Decision codes stored in the solved tables."""


def _mean(mix: tuple[tuple[float, float], ...]) -> float:
    return sum(w * m for w, m in mix)


class SpellModel:
    """Length distribution of one kind of spell: the prior mixture, time scaled by ``scale``."""

    def __init__(self, mix: tuple[tuple[float, float], ...], scale: float) -> None:
        self.mix = tuple((w, m * scale) for w, m in mix)

    def survival(self, hours: float) -> float:
        """P(length > hours)."""
        return sum(w * math.exp(-hours / m) for w, m in self.mix)

    def residual(self, age: float) -> float:
        """Mean remaining life of a spell that has lasted ``age`` hours."""
        return sum(w * m * math.exp(-age / m) for w, m in self.mix) / max(self.survival(age), 1e-300)

    def end_chance(self, age: float, step: float) -> float:
        """P(the spell ends within the next ``step`` hours | it has lasted ``age``)."""
        return 1.0 - self.survival(age + step) / max(self.survival(age), 1e-300)


@lru_cache(maxsize=8)
def bucket_edges(step: float, longest: float = 16.0) -> tuple[int, ...]:
    """Age bucket starts in steps: 0, 1, 2, 4, 8, ... until one starts past ``longest`` hours."""
    edges = [0, 1]
    while edges[-1] * step < longest:
        edges.append(edges[-1] * 2)
    return tuple(edges)


def age_bucket(age_hours: float, step: float) -> int:
    """Bucket of a spell ``age_hours`` old (see :func:`bucket_edges`)."""
    steps = age_hours / step + 1e-9
    return max(b for b, e in enumerate(bucket_edges(step)) if e <= steps)


def chain(step: float, up: SpellModel, down: SpellModel) -> tuple[list[list[float]], list[bool]]:
    """Transition matrix over one step of (up buckets..., down buckets...), and which are up.

    In bucket ``b`` (ages ``e_b .. e_{b+1}-1`` steps) the spell ends with the hazard at the
    bucket's middle age; otherwise it moves to the next bucket with chance ``1 / width`` (a
    Coxian approximation of the ageing). The last bucket ends with ``step / mean residual life``.
    """
    edges = bucket_edges(step)
    nb = len(edges)
    size = 2 * nb
    p = [[0.0] * size for _ in range(size)]
    for kind, model in ((0, up), (1, down)):
        for b, e in enumerate(edges):
            row = p[kind * nb + b]
            if b == nb - 1:
                end = 1.0 - math.exp(-step / model.residual(e * step))
                advance = 0.0
            else:
                width = edges[b + 1] - e
                end = model.end_chance((e + (width - 1) / 2.0) * step, step)
                advance = (1.0 - end) / width
            row[(1 - kind) * nb] += end
            if advance:
                row[kind * nb + b + 1] += advance
            row[kind * nb + b] += 1.0 - end - advance
    return p, [i < nb for i in range(size)]


@lru_cache(maxsize=64)
def solve(
    step: float, changeover: float, ratio: float, rows: int, cols: int, bin_up: int, bin_down: int
) -> Any:
    """Decision table ``[time left, slack, availability state]`` (uint8 numpy), 2 bits per running.

    ``rows`` / ``cols``: grid size in steps of time left / slack. Bits ``2r, 2r+1`` hold the code
    (an index of :data:`CODES`) when ``r`` runs: 0 nothing, 1 spot, 2 on-demand. Costs are in
    on-demand hours.
    """
    import numpy as np

    up = SpellModel(PRIOR_UP, SCALE_BIN**bin_up)
    down = SpellModel(PRIOR_DOWN, SCALE_BIN**bin_down)
    p_list, up_list = chain(step, up, down)
    pt = np.array(p_list).T
    is_up = np.array(up_list)
    n_a = len(up_list)
    delta = max(changeover / step, 1.0)
    d0, frac = int(delta), delta - int(delta)
    pad = d0 + 2
    keep = d0 + 2  # rows of time left the recursion looks back at: a ring buffer of them
    # ev[r, t % keep, pad + j, a]: expected value, one step on, of running r at time left t and
    # slack j; j < 0 (the first ``pad`` columns) is a missed deadline, time left 0 is done.
    ev = np.full((3, keep, cols + pad, n_a), MISS_COST)
    ev[:, 0, pad:, :] = 0.0
    table = np.zeros((rows, cols, n_a), dtype=np.uint8)
    j = np.arange(cols)
    now = slice(pad, pad + cols)
    for t in range(1, rows):
        last, far, farther = (
            ev[:, (t - 1) % keep],
            ev[:, max(t - d0, 0) % keep],
            ev[:, max(t - d0 - 1, 0) % keep],
        )
        wait = last[0, pad - 1 : pad - 1 + cols]
        launch = (1.0 - frac) * far[:, pad - d0 : pad - d0 + cols] + frac * farther[
            :, pad - d0 - 1 : pad - d0 - 1 + cols
        ]
        od_go, od_run = changeover + launch[2], step + last[2, now]
        spot_go = np.where(is_up, ratio * changeover + launch[1], np.inf)
        spot_run = np.where(is_up, ratio * step + last[1, now], np.inf)
        spot_opt = np.stack((spot_go, spot_run, spot_go))  # by what runs now: nothing, spot, on-demand
        od_opt = np.stack((od_go, od_go, od_run))
        low = np.minimum(wait, spot_opt)
        code = (spot_opt < wait).astype(np.uint8)
        code[od_opt < low] = 2
        table[t] = code[0] | (code[1] << 2) | (code[2] << 4)
        values = np.where((j >= t)[:, None], 0.0, np.minimum(low, od_opt))  # j >= t: no work left
        values[1] = np.where(is_up, values[1], values[0])  # spot in an outage: preempted, nothing runs
        ev[:, t % keep, pad:] = values @ pt
    return table


def model_scales(state: PolicyState) -> tuple[int, int]:
    """Bins of the run's spell and outage scales against the prior (see :data:`SCALE_BIN`)."""
    n_up = float(state.spot_spells)
    n_down = n_up - 0.5 + (0.0 if state.spot_available else 1.0)
    n_down = max(n_down, 1.0 if state.seen_unavailable_hours > 0 else 0.0)
    out = []
    for seen, n, mix in (
        (state.seen_available_hours, n_up, PRIOR_UP),
        (state.seen_unavailable_hours, n_down, PRIOR_DOWN),
    ):
        prior = _mean(mix)
        mean = (seen + PRIOR_SPELLS * prior) / (n + PRIOR_SPELLS)
        out.append(max(-6, min(6, round(math.log(mean / prior) / math.log(SCALE_BIN)))))
    return out[0], out[1]


def _grid_hours(hours: float) -> float:
    """Grid extents rounded up to 8 h, so runs of similar jobs share solved tables."""
    return 8.0 * math.ceil(max(hours, 1e-9) / 8.0 - 1e-9)


def plan(state: PolicyState) -> Decision:
    """Decide by the program's table for the current state; the safety net overrides it."""
    if must_run_on_demand(state):
        return ON_DEMAND
    step = max(state.tick, PLAN_STEP)
    work_total = state.work_done + state.work_remaining
    slack_total = state.deadline - work_total
    rows = int(round((_grid_hours(work_total) + _grid_hours(slack_total)) / step)) + 1
    cols = int(round(_grid_hours(slack_total) / step)) + 1
    bin_up, bin_down = model_scales(state)
    table = solve(step, state.changeover, round(state.price_ratio, 3), rows, cols, bin_up, bin_down)
    slack = state.slack - (state.setup_remaining if state.running else 0.0)
    j = min(cols - 1, max(0, int(round(slack / step))))
    t = min(rows - 1, max(1, int(round((state.work_remaining + slack) / step))))
    nb = len(bucket_edges(step))
    a = age_bucket(state.spell_hours, step) + (0 if state.spot_available else nb)
    r = {None: 0, SPOT: 1, ON_DEMAND: 2}[state.running]
    choice = CODES[(int(table[t, j, a]) >> (2 * r)) & 3]
    if choice == SPOT and not state.spot_available:  # cannot happen (spot is priced inf there)
        return ON_DEMAND if state.running == ON_DEMAND else WAIT
    return choice


def plan_zones(state: PolicyState, zones: int) -> Decision:
    """``ours_plan`` over a zone set: the same program, on the availability of the zones it looks at.

    In :func:`.multizone.simulate_zones` each wait during an outage tries the next ranked zone, so
    the outages the run sees are those of every zone at once and the fitted model learns that
    they are short: the program then waits (tries) instead of falling back by itself. Forcing a
    try of every zone first, as ``ours_zones`` does, was measured worse (docs/spot_policy.md).
    """
    del zones
    return plan(state)
