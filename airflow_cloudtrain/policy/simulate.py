"""Replay a spot-availability trace through a policy, tick by tick.

The simulator calls the very ``decide`` function the operator uses, so what the benchmark
measures is what runs in production. Model (as in Wu et al., NSDI 2024):

* Trace: ``{"metadata": {"gap_seconds": N}, "data": [0 or 1, ...]}``; ``1`` means a spot
  instance can be had during that tick. Ticks past the end of the trace count as unavailable.
* Every launch (first start, relaunch after a preemption, any switch) costs ``changeover`` hours
  of no progress (boot + setup + work lost since the last checkpoint), paid at that instance's
  price.
* A running spot instance is preempted at the first tick whose value is 0; spot cannot be
  launched on a 0 tick (a policy that asks for it is buggy and gets :class:`SimulationError`).
* On-demand is always available. Billing is per second; the job stops paying when work is done.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .base import ON_DEMAND, SPOT, WAIT, Decision, PolicyState

DecideFn = Callable[[PolicyState], Decision]


class SimulationError(RuntimeError):
    """The policy asked for something impossible (spot while none is available, or garbage)."""


@dataclass(frozen=True)
class Trace:
    """A spot-availability trace: ``data[i]`` is 1 if spot was available in tick ``i``."""

    name: str
    gap_hours: float
    data: tuple[int, ...]


def load_trace(path: str | Path) -> Trace:
    """Read a trace file in the skypilot-org/spot-traces JSON format."""
    path = Path(path)
    raw = json.loads(path.read_text())
    gap_seconds = float(raw["metadata"]["gap_seconds"])
    data = tuple(1 if int(v) else 0 for v in raw["data"])
    return Trace(name=path.stem, gap_hours=gap_seconds / 3600.0, data=data)


def tick_use(
    setup_left: float, gap: float, done: float, job_hours: float
) -> tuple[float, float, float, bool]:
    """One tick of a running instance: (changeover spent, work done, hours paid, whether the job ends in
    it). The changeover is paid first; a job that ends mid-tick pays only up to its end (per second)."""
    setup_part = min(setup_left, gap)
    work_part = gap - setup_part
    finishing = done + work_part >= job_hours - 1e-12
    used = setup_part + (job_hours - done) if finishing else gap
    return setup_part, work_part, used, finishing


@dataclass(frozen=True)
class RunResult:
    """Outcome of one simulated job. Hours and currency units as given to :func:`simulate`."""

    cost: float
    finish_hours: float | None
    met_deadline: bool
    launches: int
    interruptions: int
    spot_hours: float
    on_demand_hours: float


def trace_data(trace: Trace | Sequence[int], gap_hours: float | None) -> tuple[Sequence[int], float]:
    """(values, tick hours) of a :class:`Trace` or of a bare sequence plus ``gap_hours``."""
    if isinstance(trace, Trace):
        return trace.data, trace.gap_hours
    if gap_hours is None:
        raise ValueError("gap_hours is required when trace is a plain sequence")
    return tuple(trace), gap_hours


def simulate(
    trace: Trace | Sequence[int],
    decide: DecideFn,
    *,
    job_hours: float,
    deadline_hours: float,
    changeover_hours: float,
    spot_price: float,
    on_demand_price: float,
    start: int = 0,
    gap_hours: float | None = None,
    max_hours: float | None = None,
) -> RunResult:
    """Run one job that starts at tick ``start`` of ``trace`` and return what it cost.

    ``gap_hours`` is needed only when ``trace`` is a bare sequence. The job keeps running past a
    missed deadline (so its full cost is known) until ``max_hours`` (default: twice the deadline
    plus the job), after which it is reported unfinished.
    """
    data, gap = trace_data(trace, gap_hours)
    if max_hours is None:
        max_hours = 2.0 * deadline_hours + job_hours
    max_ticks = int(max_hours / gap) + 1
    n = len(data)
    price_ratio = spot_price / on_demand_price
    d = changeover_hours

    done = 0.0
    running: str | None = None
    setup_left = running_hours = 0.0
    cost = spot_hours = od_hours = 0.0
    launches = interruptions = spells = 0
    seen_up = seen_down = spell = 0.0
    prev_avail: bool | None = None

    for k in range(max_ticks):
        i = start + k
        avail = 0 <= i < n and data[i] == 1
        if prev_avail is None or avail != prev_avail:
            spell = 0.0
            spells += avail
        else:
            spell += gap
        if running == SPOT and not avail:
            running, setup_left, running_hours = None, 0.0, 0.0
            interruptions += 1

        elapsed = k * gap
        choice = decide(
            PolicyState(
                elapsed=elapsed,
                deadline=deadline_hours,
                work_done=done,
                work_remaining=job_hours - done,
                changeover=d,
                spot_available=avail,
                running=running,  # type: ignore[arg-type]
                setup_remaining=setup_left,
                tick=gap,
                price_ratio=price_ratio,
                interruptions=interruptions,
                launches=launches,
                spot_hours=spot_hours,
                on_demand_hours=od_hours,
                seen_available_hours=seen_up,
                seen_unavailable_hours=seen_down,
                spot_spells=spells,
                spell_hours=spell,
                running_hours=running_hours,
            )
        )
        if choice == WAIT:
            target = None
        elif choice in (SPOT, ON_DEMAND):
            target = choice
            if choice == SPOT and not avail:
                raise SimulationError(f"policy chose spot at hour {elapsed:.2f} but none is available")
        else:
            raise SimulationError(f"policy returned {choice!r}; expected 'spot', 'on_demand' or 'wait'")
        if target != running:
            running, running_hours = target, 0.0
            if target is not None:
                launches += 1
                setup_left = d

        if avail:
            seen_up += gap
        else:
            seen_down += gap
        prev_avail = avail
        if running is None:
            continue

        price = spot_price if running == SPOT else on_demand_price
        setup_part, work_part, used, finishing = tick_use(setup_left, gap, done, job_hours)
        cost += price * used
        if running == SPOT:
            spot_hours += used
        else:
            od_hours += used
        if finishing:
            finish = elapsed + used
            return RunResult(
                cost=cost,
                finish_hours=finish,
                met_deadline=finish <= deadline_hours + 1e-9,
                launches=launches,
                interruptions=interruptions,
                spot_hours=spot_hours,
                on_demand_hours=od_hours,
            )
        done += work_part
        setup_left -= setup_part
        running_hours += gap

    return RunResult(
        cost=cost,
        finish_hours=None,
        met_deadline=False,
        launches=launches,
        interruptions=interruptions,
        spot_hours=spot_hours,
        on_demand_hours=od_hours,
    )
