"""A fast, certified optimum over one or many zones: a Lagrangian relaxation of "work done".

The exact program (:mod:`.optimum`) keeps, per tick, a value for every (instance, setup phase,
slack used) state: at 15-second ticks and a 0.2 h changeover that is 97 rows x 5,760 slack steps
x 17,280 ticks per run, hours per run. This module drops the slack axis instead. The deadline
constraint "work done >= job" is priced: every hour of work earns ``lam`` dollars, and for a fixed
``lam`` the cheapest schedule over the window is a shortest path through 3 states per zone
(idle / spot / on-demand, checkpoint in that zone), a handful of numpy operations per tick for a
whole batch of runs and prices at once.

Why the answer is trustworthy (per run, not on average):

* **Lower bound.** For every ``lam`` and every schedule ``S`` that does the job by the deadline,
  ``cost(S) - lam * work(S) + lam * job <= cost(S)`` (its work is the job, plus less than one tick
  if its last tick is counted whole), so ``L(lam) = min over schedules (cost - lam * work) +
  lam * job - max(0, on_demand - lam) * tick`` is <= the optimum. We keep the best ``L`` seen.
* **Upper bound.** The minimising schedule at a ``lam`` whose work reaches the job is a real,
  achievable schedule (the transitions are exactly the simulator's moves); its cost, billing
  stopped when the work is done, is >= the optimum.
* So ``lower <= optimum <= upper`` for every run, and ``upper / lower - 1`` is a certificate:
  the benchmark reports ``upper`` and the largest certificate, and (single zone) re-solves with
  the exact program any run whose certificate exceeds its tolerance.

Moves that are never optimal are left out, which is exact: a launch whose setup is preempted
(waiting instead is as slow and free), abandoning a setup, or switching mid-spell later than at
its start. So a launch is one transition that lands ``ceil(setup / tick)`` ticks later in the
working state, with the work of the setup's last partial tick.

Zones: a spot launch in another zone than the checkpoint's adds ``restore_hours`` to the setup,
one in another region also ``transfer_hours`` and ``egress_usd``; on-demand runs where the
checkpoint is. Complexity: O(ticks x zones x runs x prices) per pass, 3 passes of 4 prices plus
one that keeps the schedules' cost and work; memory O(zones x runs x prices).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    import numpy as np

TOLERANCE = 1e-9


@dataclass(frozen=True)
class Moves:
    """What moving the checkpoint costs: extra setup hours and dollars per spot launch elsewhere."""

    restore_hours: float = 0.0
    transfer_hours: float = 0.0
    egress_usd: float = 0.0


@dataclass(frozen=True)
class Bounds:
    """Per run: ``lower <= optimum <= upper`` (numpy arrays; inf upper if nothing met the deadline)."""

    lower: np.ndarray
    upper: np.ndarray

    @property
    def certificate(self) -> np.ndarray:
        """``upper / lower - 1`` per run: how far ``upper`` may be above the true optimum."""
        return self.upper / self.lower - 1.0


def _np() -> Any:
    import numpy

    return numpy


def _run_lengths(np_: Any, data: np.ndarray) -> np.ndarray:
    """``out[z, i]``: consecutive available ticks from ``i`` on in zone ``z`` (0 where unavailable)."""
    zones, n = data.shape
    idx = np_.arange(n)
    zero_at = np_.where(data == 0, idx, n)
    next_zero = np_.minimum.accumulate(zero_at[:, ::-1], axis=1)[:, ::-1]
    return (next_zero - idx).astype(np_.int64)


class _Program:
    """One batch of runs (same deadline) over aligned zone traces; see the module docstring."""

    def __init__(
        self,
        data: np.ndarray,
        regions: Sequence[str],
        starts: Sequence[int],
        *,
        job: float,
        deadline: float,
        changeover: float,
        gap: float,
        spot_price: float,
        on_demand_price: float,
        moves: Moves,
    ) -> None:
        np_ = _np()
        self.np = np_
        self.ticks = int(math.floor(deadline / gap + 1e-9))
        self.job, self.gap = job, gap
        self.ps, self.po = spot_price, on_demand_price
        setups = [changeover, changeover + moves.restore_hours]
        setups.append(setups[1] + moves.transfer_hours)
        self.setups = setups
        self.lengths = [max(1, math.ceil(s / gap - 1e-9)) for s in setups]
        self.egress = moves.egress_usd
        self.starts = np_.asarray(starts, dtype=np_.int64)
        if len(self.starts) and self.starts.min() < 0:
            raise ValueError("start ticks must not be negative")
        width = max(data.shape[1], int(self.starts.max(initial=0))) + self.ticks + max(self.lengths) + 1
        padded = np_.zeros((data.shape[0], width), dtype=np_.int8)
        padded[:, : data.shape[1]] = data != 0
        self.avail = padded.astype(bool)
        self.runlen = _run_lengths(np_, padded)
        names = list(dict.fromkeys(regions))
        self.region_of = np_.asarray([names.index(r) for r in regions])
        self.n_regions = len(names)

    def run(self, lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One pass for prices ``lam`` (runs x prices): min of cost - lam * work, and the billed
        cost of each minimising schedule (inf where its work falls short of the job)."""
        np_, gap, job = self.np, self.gap, self.job
        zones, runs, prices = self.avail.shape[0], len(self.starts), lam.shape[1]
        shape = (zones, runs, prices)
        inf = np_.inf
        ring = max(self.lengths) + 1
        lam_ = lam[None]
        # value, cost, work, cost at the moment the work reached the job (the bill), per state
        fields = 4

        def full(v: float) -> list[np.ndarray]:
            return [np_.full(shape, v), np_.zeros(shape), np_.zeros(shape), np_.full(shape, inf)]

        idle, spot, od = full(0.0), full(inf), full(inf)
        arr_spot = [full(inf) for _ in range(ring)]
        arr_od = [full(inf) for _ in range(ring)]

        def better(a: list[np.ndarray], b: list[np.ndarray]) -> list[np.ndarray]:
            take = b[0] < a[0]
            return [np_.where(take, y, x) for x, y in zip(a, b, strict=True)]

        def add(s: list[np.ndarray], price: float, hours: float, work: float, usd: float = 0.0):
            value = s[0] + (price * hours + usd) - lam_ * work
            cost, done = s[1] + price * hours + usd, s[2] + work
            crossed = (s[2] < job - TOLERANCE) & (done >= job - TOLERANCE)
            bill = np_.where(crossed, cost - price * (done - job), s[3])
            return [value, cost, done, bill]

        def mask(s: list[np.ndarray], ok: np.ndarray) -> list[np.ndarray]:
            return [np_.where(ok[..., None], s[0], inf), *s[1:]]

        def region_min(s: list[np.ndarray]) -> list[list[np.ndarray]]:
            out = []
            for r in range(self.n_regions):
                members = [z for z in range(zones) if self.region_of[z] == r]
                best = [f[members[0]] for f in s]
                for z in members[1:]:
                    best = better(best, [f[z] for f in s])
                out.append(best)
            return out

        def launch_spot(src: list[np.ndarray], k: int) -> None:
            pos = self.starts + k
            per_region = region_min(src)
            for kind, (setup, length) in enumerate(zip(self.setups, self.lengths, strict=True)):
                if kind == 2 and self.n_regions < 2:
                    break
                if kind == 1 and self.n_regions == zones:
                    continue  # no region has two zones: a same-region move is impossible
                ok = self.runlen[:, pos] >= length  # zones x runs
                if not ok.any():
                    continue
                if kind == 0:
                    cand = src
                else:
                    rows = []
                    for z in range(zones):
                        r = self.region_of[z]
                        if kind == 1:
                            rows.append(per_region[r])
                        else:
                            others = [per_region[q] for q in range(self.n_regions) if q != r]
                            best = others[0]
                            for o in others[1:]:
                                best = better(best, o)
                            rows.append(best)
                    cand = [np_.stack([row[f] for row in rows]) for f in range(fields)]
                usd = self.egress if kind == 2 else 0.0
                cand = add(cand, self.ps, length * gap, length * gap - setup, usd)
                slot = (k + length) % ring
                arr_spot[slot] = better(arr_spot[slot], mask(cand, ok))

        for k in range(self.ticks):
            slot = k % ring
            spot, od = better(spot, arr_spot[slot]), better(od, arr_od[slot])
            arr_spot[slot], arr_od[slot] = full(inf), full(inf)
            up = self.avail[:, self.starts + k]  # zones x runs
            if not up.all():  # preemption: a spot instance on a 0 tick is gone, for nothing
                idle = better(idle, mask(spot, ~up))
                spot = mask(spot, up)
            launch_spot(better(idle, od), k)
            length = self.lengths[0]
            cand = add(better(idle, spot), self.po, length * gap, length * gap - self.setups[0])
            arr_od[(k + length) % ring] = better(arr_od[(k + length) % ring], cand)
            idle = better(idle, better(spot, od))
            spot = add(spot, self.ps, gap, gap)
            od = add(od, self.po, gap, gap)
        last = self.ticks % ring
        spot, od = better(spot, arr_spot[last]), better(od, arr_od[last])
        final = better(idle, better(spot, od))
        best = [f[0] for f in final]
        for z in range(1, zones):
            best = better(best, [f[z] for f in final])
        return best[0], np_.where(best[2] >= job - TOLERANCE, best[3], inf)


def optimum_bounds(
    data: np.ndarray | Sequence[Sequence[int]],
    starts: Sequence[int],
    *,
    job_hours: float,
    deadline_hours: float,
    changeover_hours: float,
    gap_hours: float,
    spot_price: float,
    on_demand_price: float,
    regions: Sequence[str] | None = None,
    moves: Moves = Moves(),
    rounds: int = 3,
    prices_per_round: int = 4,
    batch: int = 2048,
) -> Bounds:
    """Certified bounds on the offline optimum for each start tick, over zones ``data[z]``.

    ``data`` holds one availability row per zone (any value > 0 is available; aligned ticks,
    ``gap_hours`` apart); ``regions[z]`` names each zone's region (default: all one region).
    Each run may use any zone, paying ``moves`` to take its checkpoint elsewhere. With one zone
    this bounds :func:`.optimum.optimal_cost`. ``rounds`` x ``prices_per_round`` narrows the
    price of work by bisection per run: more rounds, tighter bounds.
    """
    np_ = _np()
    rows = np_.atleast_2d(np_.asarray(data))
    if regions is None:
        regions = ["region"] * rows.shape[0]
    if len(regions) != rows.shape[0]:
        raise ValueError("regions must name one region per zone row of data")
    if deadline_hours < job_hours + changeover_hours - TOLERANCE:
        raise ValueError("infeasible: the deadline is shorter than the job plus one changeover")
    lower, upper = [], []
    for first in range(0, len(starts), batch):
        program = _Program(
            rows,
            regions,
            starts[first : first + batch],
            job=job_hours,
            deadline=deadline_hours,
            changeover=changeover_hours,
            gap=gap_hours,
            spot_price=spot_price,
            on_demand_price=on_demand_price,
            moves=moves,
        )
        lo, up = _search(np_, program, rounds, prices_per_round)
        lower.append(lo)
        upper.append(up)
    return Bounds(lower=np_.concatenate(lower), upper=np_.concatenate(upper))


def _search(np_: Any, program: _Program, rounds: int, per_round: int) -> tuple[np.ndarray, np.ndarray]:
    """Bisect the price of work per run; return (best lower bound, least achievable bill seen)."""
    runs = len(program.starts)
    po, gap, job = program.po, program.gap, program.job
    length, setup = program.lengths[0], program.setups[0]
    # at this price always-on-demand earns more than it pays per tick, so its work reaches the job
    hi = np_.full(runs, 1.05 * po * length * gap / max(length * gap - setup, 1e-9) + po)
    lo = np_.zeros(runs)
    lower = np_.full(runs, -np_.inf)
    upper = np_.full(runs, np_.inf)
    frac = np_.arange(1, per_round + 1) / (per_round + 1)
    for r in range(rounds + 1):
        # the last pass tries the top of the bracket, whose schedule is known to do the job
        lam = hi[:, None] + 0.0 * frac[None, :1] if r == rounds else lo[:, None] + (hi - lo)[:, None] * frac
        value, bill = program.run(lam)
        bound = value + lam * job - np_.maximum(0.0, po - lam) * gap
        lower = np_.maximum(lower, bound.max(axis=1))
        upper = np_.minimum(upper, bill.min(axis=1))
        enough = np_.isfinite(bill)
        hi = np_.minimum(hi, np_.where(enough, lam, np_.inf).min(axis=1))
        lo = np_.minimum(np_.maximum(lo, np_.where(enough, 0.0, lam).max(axis=1)), hi)
    return lower, np_.maximum(upper, lower)
