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

from .bounds_c import run_pass

if TYPE_CHECKING:  # pragma: no cover - typing only
    import numpy as np

TOLERANCE = 1e-9


@dataclass(frozen=True)
class Moves:
    """What moving the checkpoint costs: extra setup hours and dollars per spot launch elsewhere."""

    restore_hours: float = 0.0
    transfer_hours: float = 0.0
    egress_usd: float = 0.0


NO_MOVES = Moves()
"""One zone, or moves for free."""


@dataclass(frozen=True)
class Bounds:
    """Per run: ``lower <= optimum <= upper`` (numpy arrays). ``upper`` is inf where no schedule seen
    met the deadline, and everywhere when the deadline is not a whole number of ticks."""

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
        zone_of_run: Sequence[int] | None,
    ) -> None:
        np_ = _np()
        self.np = np_
        # through the end of the tick holding the deadline: a schedule finishing mid-tick fits. If
        # that tick ends after the deadline the horizon is a relaxation: lower stays valid, and
        # upper (whose finish is not tracked) is not reported.
        self.ticks = int(math.ceil(deadline / gap - 1e-9))
        self.whole = abs(self.ticks * gap - deadline) <= 1e-9
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
        if zone_of_run is None:  # every run may use every zone
            self.rows = np_.repeat(np_.arange(data.shape[0])[:, None], len(self.starts), axis=1)
            names = list(dict.fromkeys(regions))
            self.region_of = np_.asarray([names.index(r) for r in regions])
        else:  # independent single-zone runs batched together: run b sees only its own zone
            self.rows = np_.asarray(zone_of_run, dtype=np_.int64)[None, :]
            names, self.region_of = ["region"], np_.zeros(1, dtype=np_.int64)
        self.n_regions = len(names)

    def run(self, lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One pass for prices ``lam`` (runs x prices): min of cost - lam * work, and the billed
        cost of each minimising schedule (inf where its work falls short of the job).

        Each state is one array ``(4, zones, runs, prices)``: value, cost, work, and the bill (the
        cost when the work reached the job), so that keeping the better of two is one ``where``.
        """
        compiled = run_pass(self, lam)
        if compiled is not None:
            return compiled
        np_, gap, job = self.np, self.gap, self.job
        zones, runs, prices = self.rows.shape[0], len(self.starts), lam.shape[1]
        inf = np_.inf
        ring = max(self.lengths) + 1
        lam_ = lam[None]

        def full(v: float) -> np.ndarray:
            out = np_.zeros((4, zones, runs, prices))
            out[0], out[3] = v, inf
            return out

        def better(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return np_.where((b[0] < a[0])[None], b, a)

        def add(s: np.ndarray, price: float, hours: float, work: float, usd: float = 0.0) -> np.ndarray:
            out = np_.empty_like(s)
            out[0] = s[0] + (price * hours + usd) - lam_ * work
            out[1] = s[1] + (price * hours + usd)
            out[2] = s[2] + work
            crossed = (s[2] < job - TOLERANCE) & (out[2] >= job - TOLERANCE)
            out[3] = np_.where(crossed, out[1] - price * (out[2] - job), s[3])
            return out

        def mask(s: np.ndarray, ok: np.ndarray) -> np.ndarray:
            out = s.copy()
            out[0][~ok] = inf
            return out

        members = [[z for z in range(zones) if self.region_of[z] == r] for r in range(self.n_regions)]

        def launch_spot(src: np.ndarray, k: int) -> None:
            pos = self.starts[None, :] + k
            per_region = []
            for group in members:
                best = src[:, group[0]]
                for z in group[1:]:
                    best = better(best, src[:, z])
                per_region.append(best)
            for kind, (setup, length) in enumerate(zip(self.setups, self.lengths, strict=True)):
                if kind == 2 and self.n_regions < 2:
                    break
                if kind == 1 and self.n_regions == zones:
                    continue  # no region has two zones: a same-region move is impossible
                ok = self.runlen[self.rows, pos] >= length  # zones x runs
                if not ok.any():
                    continue
                if kind == 0:
                    cand = src
                else:
                    picked = []
                    for z in range(zones):
                        r = self.region_of[z]
                        if kind == 1:
                            picked.append(per_region[r])
                            continue
                        others = [per_region[q] for q in range(self.n_regions) if q != r]
                        best = others[0]
                        for o in others[1:]:
                            best = better(best, o)
                        picked.append(best)
                    cand = np_.stack(picked, axis=1)
                usd = self.egress if kind == 2 else 0.0
                cand = mask(add(cand, self.ps, length * gap, length * gap - setup, usd), ok)
                slot = (k + length) % ring
                arr_spot[slot] = better(arr_spot[slot], cand)

        idle, spot, od = full(0.0), full(inf), full(inf)
        arr_spot = [full(inf) for _ in range(ring)]
        arr_od = [full(inf) for _ in range(ring)]
        od_len, od_setup = self.lengths[0], self.setups[0]
        for k in range(self.ticks):
            slot = k % ring
            spot, od = better(spot, arr_spot[slot]), better(od, arr_od[slot])
            arr_spot[slot], arr_od[slot] = full(inf), full(inf)
            up = self.avail[self.rows, self.starts[None, :] + k]  # zones x runs
            if not up.all():  # preemption: a spot instance on a 0 tick is gone, for nothing
                idle = better(idle, mask(spot, ~up))
                spot = mask(spot, up)
            launch_spot(better(idle, od), k)
            cand = add(better(idle, spot), self.po, od_len * gap, od_len * gap - od_setup)
            arr_od[(k + od_len) % ring] = better(arr_od[(k + od_len) % ring], cand)
            idle = better(idle, better(spot, od))
            spot = add(spot, self.ps, gap, gap)
            od = add(od, self.po, gap, gap)
        last = self.ticks % ring
        spot, od = better(spot, arr_spot[last]), better(od, arr_od[last])
        final = better(idle, better(spot, od))
        best = final[:, 0]
        for z in range(1, zones):
            best = better(best, final[:, z])
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
    moves: Moves = NO_MOVES,
    zone_of_run: Sequence[int] | None = None,
    rounds: int = 4,
    prices_per_round: int = 4,
    batch: int = 4096,
) -> Bounds:
    """Certified bounds on the offline optimum for each start tick, over zones ``data[z]``.

    ``data`` holds one availability row per zone (any value > 0 is available; aligned ticks,
    ``gap_hours`` apart); ``regions[z]`` names each zone's region (default: all one region).
    Each run may use any zone, paying ``moves`` to take its checkpoint elsewhere. With one zone
    this bounds :func:`.optimum.optimal_cost`. ``rounds`` x ``prices_per_round`` narrows the
    price of work by bisection per run: more rounds, tighter bounds. With ``zone_of_run`` (one
    zone index per start) the runs are independent single-zone runs, each in its own zone, batched
    together for speed.
    """
    np_ = _np()
    rows = np_.atleast_2d(np_.asarray(data))
    if regions is None:
        regions = ["region"] * rows.shape[0]
    if zone_of_run is not None and len(zone_of_run) != len(starts):
        raise ValueError("zone_of_run must give one zone per start")
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
            zone_of_run=None if zone_of_run is None else zone_of_run[first : first + batch],
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
    if not program.whole:
        upper[:] = np_.inf
    return lower, np_.maximum(upper, lower)
