"""The offline optimum: the cheapest way to finish by the deadline, knowing the whole trace.

No policy can beat it (it sees the future), so it is the yardstick the benchmark measures every
policy's cost against ("gap to optimum"). It uses exactly the model of :func:`.simulate`: tick
granularity, a changeover of no progress on every launch or switch paid at the instance's price,
spot preempted at the first 0 tick and not launchable on one, ticks past the end of the trace
unavailable, on-demand always there, per-second billing that stops when the work is done.

How: a dynamic program over ticks whose state is (what runs, changeover still to go, slack used).
The key is the last coordinate, ``sigma = elapsed - work done``: the time not turned into work so
far (idle ticks plus changeover time spent). Work done is ``elapsed - sigma``, so the future of a
run depends only on (tick, instance, setup left, sigma), and the job finishes at
``job + sigma_final``: the deadline is simply ``sigma_final <= deadline - job``. For every state
we keep the least cost to reach it, and take the cheapest finish.

How exact: sigma only ever grows by a whole tick (idle) or by ``min(setup left, tick)``, so it is
always a sum of whole ticks and pieces of the changeover. When the tick and the changeover are
whole multiples of a common unit ``u`` (600 s ticks and 0.2 h give ``u`` = 2 min; any two
durations given in whole seconds have one), every reachable sigma is a multiple of ``u`` and the
program enumerates them all: the result is the exact optimum of the simulator's model, not an
approximation (up to float rounding: "done" and "by the deadline" are tested with 1e-9 h of
slack). The tests check it against every decision sequence run through :func:`.simulate`.
Only if there is no common unit with at most :data:`MAX_GRID` steps of slack (durations that are
not whole milliseconds, or a changeover like 0.2001 h) is the changeover rounded *up* to the next
1/:data:`FALLBACK_STEPS` of a tick: the result is then the exact optimum of that slightly longer
changeover (figures as in that model), an upper bound on the true optimum, and its plan is
achievable in the true model (a shorter changeover never delays or costs more for the same
decisions).

numpy does the work (one vectorised step per tick over all sigma values, and over many start
ticks at once in :func:`optimal_costs`); it is imported only when the optimum is computed, so the
policies themselves stay stdlib-only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from .base import ON_DEMAND, SPOT, WAIT, Decision
from .simulate import RunResult, Trace, trace_data

if TYPE_CHECKING:  # pragma: no cover - typing only
    import numpy as np

MAX_GRID = 200_000
"""Most sigma steps the program may track; beyond that the changeover is rounded up (see module)."""

TOLERANCE_HOURS = 1e-9
"""Float slack when testing "work done" and "finished by the deadline" (3.6 us)."""

FALLBACK_STEPS = 60
"""Grid steps per tick when tick and changeover have no usable common unit (see module)."""

FRACTION_DENOMINATOR = 3_600_000
"""Durations are read as fractions of at most this denominator (1 ms resolution for hours)."""


@dataclass(frozen=True)
class _Model:
    """The job and grid the program runs on: all durations in grid units of ``unit`` hours.

    States are rows: 0 idle, then one row per setup phase for spot, then the same for on-demand.
    ``phases`` are the setup left *after* a tick (descending, the last is 0: working).
    """

    unit: float
    tick: int
    changeover: int
    job: float
    deadline: float
    gap: float
    grid: int
    ticks: int
    phases: tuple[int, ...]
    spot_price: float
    on_demand_price: float

    @property
    def rows(self) -> int:
        return 1 + 2 * len(self.phases)

    def next_phase(self, setup_left: int) -> tuple[int, int]:
        """(index of the phase after one more tick, sigma units that tick adds) from ``setup_left``."""
        spent = min(setup_left, self.tick)
        return self.phases.index(setup_left - spent), spent

    def finish_limit(self, k: int) -> int:
        """Largest sigma (units) at which a working instance finishes the job during tick ``k``."""
        return math.floor(((k + 1) * self.gap - self.job + TOLERANCE_HOURS) / self.unit)


def _as_fraction(hours: float) -> Fraction | None:
    """``hours`` as a short fraction if it is one (to 1e-12 relative), else ``None``."""
    frac = Fraction(hours).limit_denominator(FRACTION_DENOMINATOR)
    return frac if abs(float(frac) - hours) <= 1e-12 * max(1.0, abs(hours)) else None


def _model(
    job: float, deadline: float, changeover: float, gap: float, spot_price: float, on_demand_price: float
) -> _Model:
    """Pick the grid unit (exact if possible, see the module docstring) and the setup phases."""
    if gap <= 0 or job <= 0 or changeover < 0:
        raise ValueError("gap and job must be positive and changeover not negative")
    slack = deadline - job
    if slack < changeover - TOLERANCE_HOURS:
        raise ValueError("infeasible: the deadline is shorter than the job plus one changeover")
    g, d = _as_fraction(gap), _as_fraction(changeover)
    unit: float | None = None
    if g is not None and d is not None:
        common = (
            g
            if d == 0
            else Fraction(
                math.gcd(g.numerator * d.denominator, d.numerator * g.denominator),
                g.denominator * d.denominator,
            )
        )
        if slack / float(common) < MAX_GRID:
            unit, tick_u, change_u = float(common), int(g / common), int(d / common)
    if unit is None:  # no usable common unit: round the changeover up (see the module docstring)
        unit, tick_u = gap / FALLBACK_STEPS, FALLBACK_STEPS
        change_u = math.ceil(changeover / unit - 1e-9)
    grid = math.floor((slack + TOLERANCE_HOURS) / unit + 1e-9) + 1
    phases = [max(0, change_u - tick_u)]
    while phases[-1] > 0:
        phases.append(max(0, phases[-1] - tick_u))
    return _Model(
        unit=unit,
        tick=tick_u,
        changeover=change_u,
        job=job,
        deadline=deadline,
        gap=gap,
        grid=grid,
        ticks=math.ceil((deadline + TOLERANCE_HOURS) / gap) + 1,
        phases=tuple(phases),
        spot_price=spot_price,
        on_demand_price=on_demand_price,
    )


def _numpy() -> Any:
    """numpy, imported on first use so that importing the policies never needs it."""
    try:
        import numpy
    except ImportError as exc:  # pragma: no cover - numpy ships with the provider's dependencies
        raise ImportError("the offline optimum needs numpy (pip install numpy)") from exc
    return numpy


def _shift_into(np_: Any, target: np.ndarray, values: np.ndarray, by: int) -> None:
    """``target[..., s] = min(target[..., s], values[..., s - by])``: sigma grows by ``by`` units."""
    width = target.shape[-1] - by
    if width > 0:
        np_.minimum(target[..., by:], values[..., :width], out=target[..., by:])


def _run(
    model: _Model, avail: np.ndarray, record: bool
) -> tuple[np.ndarray, list[np.ndarray], tuple[int, int, int, float] | None]:
    """Run the program for a batch of availability rows ``avail[b, k]`` (bool, ``model.ticks`` wide).

    Returns the least finishing cost per row (inf if none meets the deadline), and, with
    ``record`` (for row 0; pass one row), the state array at the start of every tick and the best finish as
    ``(tick, state row, sigma, cost before the finishing tick's refund)`` for :func:`_backtrack`.
    """
    np_ = _numpy()
    m = model
    n_phase = len(m.phases)
    spot_rows, od_rows = slice(1, 1 + n_phase), slice(1 + n_phase, 1 + 2 * n_phase)
    work_rows = (n_phase, 2 * n_phase)  # the working phase of spot and of on-demand
    launch_phase, launch_sigma = m.next_phase(m.changeover)
    steps = [m.next_phase(left) for left in m.phases]
    spot_cost, od_cost = m.spot_price * m.gap, m.on_demand_price * m.gap
    sigma_hours = m.job + np_.arange(m.grid) * m.unit  # finish time if the job ends at that sigma
    batch = avail.shape[0]
    inf = np_.inf

    value = np_.full((batch, m.rows, m.grid), inf)
    value[:, 0, 0] = 0.0
    best = np_.full(batch, inf)
    starts: list[np.ndarray] = []
    finish: tuple[int, int, int, float] | None = None
    for k in range(m.ticks):
        if record:
            starts.append(value[0].copy())
        up = avail[:, k]
        if not up.all():  # preemption: a spot instance on a 0 tick is gone, for nothing
            down = ~up
            pre = np_.minimum(value[:, 0], value[:, spot_rows].min(axis=1))
            value[down, 0] = pre[down]
            value[down, spot_rows] = inf
        new = np_.full_like(value, inf)
        spot_min = value[:, spot_rows].min(axis=1)
        od_min = value[:, od_rows].min(axis=1)
        # Wait: from anything, a whole tick of sigma, no cost.
        _shift_into(np_, new[:, 0], np_.minimum(value[:, 0], np_.minimum(spot_min, od_min)), m.tick)
        # Launch (from idle or the other kind): the changeover starts now.
        spot_launch = np_.minimum(value[:, 0], od_min) + spot_cost
        if not up.all():
            spot_launch[~up] = inf
        _shift_into(np_, new[:, 1 + launch_phase], spot_launch, launch_sigma)
        od_launch = np_.minimum(value[:, 0], spot_min) + od_cost
        _shift_into(np_, new[:, 1 + n_phase + launch_phase], od_launch, launch_sigma)
        # Keep running: setup goes on, or work does (spot rows are inf where it is down).
        for phase, (after, spent) in enumerate(steps):
            _shift_into(np_, new[:, 1 + after], value[:, 1 + phase] + spot_cost, spent)
            _shift_into(np_, new[:, 1 + n_phase + after], value[:, 1 + n_phase + phase] + od_cost, spent)
        # Finish: a working instance whose work reaches the job this tick stops paying mid-tick.
        limit = min(m.finish_limit(k), m.grid - 1)
        if limit >= 0:
            refund = sigma_hours[: limit + 1] - (k + 1) * m.gap  # negative: unused part of the tick
            for row, price in zip(work_rows, (m.spot_price, m.on_demand_price), strict=True):
                done = new[:, row, : limit + 1]
                total = done + price * refund
                cheapest = total.min(axis=1)
                if record and cheapest[0] < best[0]:
                    s = int(total[0].argmin())
                    finish = (k, row, s, float(done[0, s]))
                np_.minimum(best, cheapest, out=best)
                done[...] = inf
        value = new
        if not np_.isfinite(value).any():
            break
    return best, starts, finish


def _avail_rows(data: Sequence[int], starts: Sequence[int], ticks: int) -> np.ndarray:
    """Availability ``data[start + k] == 1`` for each start and tick, False outside the trace."""
    np_ = _numpy()
    values = np_.asarray(data, dtype=np_.int64) == 1
    out = np_.zeros((len(starts), ticks), dtype=bool)
    for i, start in enumerate(starts):
        lo, hi = max(start, 0), min(start + ticks, len(values))
        if hi > lo:
            out[i, lo - start : hi - start] = values[lo:hi]
    return out


def _backtrack(
    model: _Model, avail: np.ndarray, starts: list[np.ndarray], finish: tuple[int, int, int, float]
) -> tuple[list[Decision], int]:
    """Rebuild the decisions of the cheapest finish; returns them and the number of preemptions.

    Walks back from the finish: at each tick, the source is whichever predecessor state plus
    that tick's cost reproduces the value (the forward pass computed it the same way).
    """
    np_ = _numpy()
    m = model
    n_phase = len(m.phases)
    spot_rows = range(1, 1 + n_phase)
    od_rows = range(1 + n_phase, 1 + 2 * n_phase)
    launch_phase, launch_sigma = m.next_phase(m.changeover)
    steps = [m.next_phase(left) for left in m.phases]

    def same(a: float, b: float) -> bool:
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)

    tick, row, sigma, target = finish
    decisions: list[Decision] = []
    preemptions = 0
    while tick >= 0:
        raw = starts[tick]
        up = bool(avail[tick])
        idle = raw[0] if up else np_.minimum(raw[0], raw[spot_rows.start : spot_rows.stop].min(axis=0))
        decisions.append(_kind(row, n_phase))
        # (source row, sigma spent, cost added) for every way into ``row`` this tick.
        candidates: list[tuple[int, int, float]] = []
        if row == 0:
            candidates = [(r, m.tick, 0.0) for r in range(m.rows) if up or r not in spot_rows]
        else:
            is_spot = row in spot_rows
            if is_spot and not up:  # pragma: no cover - _run never runs spot on a 0 tick
                raise RuntimeError("optimum: spot on a 0 tick")
            first, other = (1, od_rows) if is_spot else (1 + n_phase, spot_rows)
            added = (m.spot_price if is_spot else m.on_demand_price) * m.gap
            phase = row - first
            if phase == launch_phase:
                candidates += [(r, launch_sigma, added) for r in (0, *other) if up or r not in spot_rows]
            candidates += [
                (first + p, spent, added) for p, (after, spent) in enumerate(steps) if after == phase
            ]
        for source, spent, added in candidates:
            prev = sigma - spent
            if prev < 0:
                continue
            have = idle[prev] if source == 0 else raw[source][prev]
            if same(have + added, target):
                break
        else:  # pragma: no cover - would be a bug in _run
            raise RuntimeError("optimum: could not retrace the cheapest schedule")
        sigma = prev
        if source == 0 and not up and not same(raw[0][sigma], idle[sigma]):
            preemptions += 1  # idle because the spot instance was lost at this tick
            source = next(r for r in spot_rows if same(raw[r][sigma], idle[sigma]))
        row, target, tick = source, float(raw[source][sigma]), tick - 1
    decisions.reverse()
    return decisions, preemptions


def _kind(row: int, n_phase: int) -> Decision:
    """What a state row runs: idle (wait), a spot phase, or an on-demand phase."""
    return WAIT if row == 0 else SPOT if row <= n_phase else ON_DEMAND


def optimal_plan(
    trace: Trace | Sequence[int],
    *,
    job_hours: float,
    deadline_hours: float,
    changeover_hours: float,
    spot_price: float,
    on_demand_price: float,
    start: int = 0,
    gap_hours: float | None = None,
) -> tuple[RunResult, tuple[Decision, ...]]:
    """The cheapest schedule that meets the deadline, and its decision for every tick until done.

    Feeding the decisions to :func:`.simulate` one per tick replays the schedule (that is how the
    tests check it). If no schedule can meet the deadline (deadline < job + changeover, exactly
    when always-on-demand misses it too), the cheapest of those that finish earliest is returned,
    with ``met_deadline=False``.
    """
    data, gap = trace_data(trace, gap_hours)
    feasible = deadline_hours >= job_hours + changeover_hours - TOLERANCE_HOURS
    deadline = deadline_hours if feasible else job_hours + changeover_hours
    model = _model(job_hours, deadline, changeover_hours, gap, spot_price, on_demand_price)
    avail = _avail_rows(data, [start], model.ticks)
    best, starts, finish = _run(model, avail, record=True)
    if finish is None:  # pragma: no cover - always-on-demand is always a candidate
        raise RuntimeError("optimum: no schedule finishes, not even always-on-demand")
    decisions, preemptions = _backtrack(model, avail[0], starts, finish)
    last_tick, _, sigma, _ = finish
    finish_hours = job_hours + sigma * model.unit
    spot_hours = od_hours = 0.0
    launches = 0
    previous: Decision = WAIT
    for k, choice in enumerate(decisions):
        lost = previous == SPOT and not avail[0, k]
        if choice != WAIT and (choice != previous or lost):
            launches += 1
        used = finish_hours - k * gap if k == last_tick else gap
        if choice == SPOT:
            spot_hours += used
        elif choice == ON_DEMAND:
            od_hours += used
        previous = choice
    result = RunResult(
        cost=float(best[0]),
        finish_hours=finish_hours,
        met_deadline=feasible,
        launches=launches,
        interruptions=preemptions,
        spot_hours=spot_hours,
        on_demand_hours=od_hours,
    )
    return result, tuple(decisions)


def optimal_cost(
    trace: Trace | Sequence[int],
    *,
    job_hours: float,
    deadline_hours: float,
    changeover_hours: float,
    spot_price: float,
    on_demand_price: float,
    start: int = 0,
    gap_hours: float | None = None,
) -> RunResult:
    """What the offline optimum pays for one job starting at tick ``start`` (same arguments as
    :func:`.simulate`, without a policy): the least cost of any decision sequence that meets the
    deadline, with its finish time, launches, preemptions and hours. See :func:`optimal_plan`.
    """
    result, _ = optimal_plan(
        trace,
        job_hours=job_hours,
        deadline_hours=deadline_hours,
        changeover_hours=changeover_hours,
        spot_price=spot_price,
        on_demand_price=on_demand_price,
        start=start,
        gap_hours=gap_hours,
    )
    return result


def optimal_costs(
    trace: Trace | Sequence[int],
    starts: Sequence[int],
    *,
    job_hours: float,
    deadline_hours: float,
    changeover_hours: float,
    spot_price: float,
    on_demand_price: float,
    gap_hours: float | None = None,
    batch: int = 32,
) -> list[float]:
    """Only the optimum's cost, for many start ticks at once (what the benchmark needs).

    The same program as :func:`optimal_cost`, run on ``batch`` starts per numpy step: about three
    times faster than one start at a time (larger batches stop paying off once they leave the
    CPU cache). Raises ``ValueError`` if the deadline is shorter than the job plus one
    changeover (no schedule can meet it).
    """
    data, gap = trace_data(trace, gap_hours)
    model = _model(job_hours, deadline_hours, changeover_hours, gap, spot_price, on_demand_price)
    out: list[float] = []
    for first in range(0, len(starts), batch):
        chunk = starts[first : first + batch]
        best, _, _ = _run(model, _avail_rows(data, chunk, model.ticks), record=False)
        out += [float(x) for x in best]
    return out
