"""A run's attempts as an SVG timeline: one bar per attempt, coloured spot or on-demand, an
interruption marked where the cloud took the instance, the checkpoints (and the step restored) as
ticks on the bar, an attempt still running drawn up to now with an open end, the deadline policy's
deadline as a vertical line; for a fleet, one bar per worker with the items it finished as ticks and,
above them, the workers running and the items done over time (``Series``).

Drawn server-side from plain numbers (stdlib only): the machines that run Airflow often have no
internet, so no chart library or CDN; the same function draws the page's timeline and ``make demo``'s
``timeline.svg``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from html import escape

SPOT_COLOUR = "#e8912d"
ON_DEMAND_COLOUR = "#3b7dd8"
INTERRUPTION_COLOUR = "#d62728"
CHECKPOINT_COLOUR = "#2ca02c"
RESTORE_COLOUR = "#7b3fb5"
ITEM_COLOUR = "#1f4e2c"
STATE_COLOUR = "#333333"
DEADLINE_COLOUR = "#8b0000"
SERIES_COLOURS = ("#3b7dd8", "#2ca02c")
SERIES_H = 70  # the band of the series, above the bars
WIDTH = 760
LABEL_W = 150  # the attempt's name left of its bar
ROW_H = 28
TOP = 34  # the legend
AXIS_H = 44  # the time axis, and under it when the first attempt started


@dataclass(frozen=True)
class Mark:
    """A moment on a bar: ``kind`` is ``checkpoint`` (one completed), ``restore`` (the step the
    attempt started from), ``item`` (a fleet's item finished on that worker) or ``state`` (a Vertex
    AI job's state change: created, running, its end)."""

    at: float
    kind: str
    label: str = ""


@dataclass(frozen=True)
class Bar:
    """One attempt (or a fleet's worker): ``start``/``end`` unix seconds (``running``: ``end`` is now,
    it goes on); ``detail`` is its tooltip."""

    label: str
    start: float
    end: float
    spot: bool
    interrupted: bool
    detail: str = ""
    marks: tuple[Mark, ...] = ()
    running: bool = False
    instance_id: str = ""  # whose marks it carries


@dataclass(frozen=True)
class Series:
    """A count over time, drawn as a step line above the bars (a fleet's workers, its items done)."""

    name: str
    points: tuple[tuple[float, float], ...]  # (unix time, value), in time order


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def _ticks(span: float) -> list[float]:
    """Round steps for the axis, about six of them."""
    for step in (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400):
        if span / step <= 6:
            return [i * step for i in range(int(span // step) + 1)]
    return [0.0, span]


def _mark_svg(mark: Mark, x: float, y: float, index: int) -> str:
    """A checkpoint or restore as a dot on the bar, a finished item as a thin tick, a state change as
    a tick across the row."""
    colour = {"checkpoint": CHECKPOINT_COLOUR, "restore": RESTORE_COLOUR, "state": STATE_COLOUR}.get(
        mark.kind, ITEM_COLOUR
    )
    tip = f"<title>{escape(f'{mark.kind}: {mark.label}' if mark.label else mark.kind)}</title>"
    if mark.kind in ("item", "state"):
        top, height = (y + 4, ROW_H - 8) if mark.kind == "item" else (y, ROW_H)
        shape = f'<rect x="{x - 1:.1f}" y="{top}" width="2" height="{height}" fill="{colour}">{tip}</rect>'
    else:
        shape = f'<circle cx="{x:.1f}" cy="{y + ROW_H / 2:.1f}" r="4" fill="{colour}" stroke="#fff">{tip}</circle>'
    return f'<g class="ct-mark ct-{mark.kind}" data-index="{index}">{shape}</g>'


def _series_svg(series: list[Series], x: Callable[[float], float], top: int, right: float) -> list[str]:
    """Step lines in the band at ``top``, each scaled to its own maximum (named, with it, on the left)."""
    out = []
    for n, s in enumerate(series):
        peak = max(max(v for _, v in s.points), 1.0)
        colour = SERIES_COLOURS[n % len(SERIES_COLOURS)]

        def y(v: float, peak: float = peak) -> float:
            return top + SERIES_H - 6 - (SERIES_H - 16) * v / peak

        (t_first, v_first), rest = s.points[0], s.points[1:]
        steps = [f"M{x(t_first):.1f} {y(v_first):.1f}"] + [f"H{x(t):.1f} V{y(v):.1f}" for t, v in rest]
        out.append(
            f'<path class="ct-series" data-name="{escape(s.name)}" d="{" ".join(steps)} H{right:.1f}" '
            f'fill="none" stroke="{colour}" stroke-width="2"><title>{escape(s.name)}</title></path>'
            f'<text x="4" y="{top + 14 + 14 * n}" fill="{colour}">{escape(s.name)} (max {peak:g})</text>'
        )
    return out


def timeline_svg(
    bars: list[Bar],
    title: str = "",
    deadline: float | None = None,
    series: list[Series] | None = None,
) -> str:
    """The bars in the order given (attempt order), on one time axis from the first start; the
    ``deadline`` line and the ``series`` band when given."""
    series = [s for s in series or [] if s.points]
    band = SERIES_H if series else 0
    height = TOP + band + ROW_H * max(1, len(bars)) + AXIS_H
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="ct-timeline" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">',
        f"<title>{escape(title or 'attempts')}</title>",
        '<rect width="100%" height="100%" fill="#ffffff"/>',
        f'<rect x="{LABEL_W}" y="8" width="12" height="12" fill="{SPOT_COLOUR}"/>'
        f'<text x="{LABEL_W + 16}" y="18">spot</text>',
        f'<rect x="{LABEL_W + 60}" y="8" width="12" height="12" fill="{ON_DEMAND_COLOUR}"/>'
        f'<text x="{LABEL_W + 76}" y="18">on-demand</text>',
        f'<path d="M{LABEL_W + 160} 8 l6 12 l6 -12 z" fill="{INTERRUPTION_COLOUR}"/>'
        f'<text x="{LABEL_W + 178}" y="18">interrupted</text>',
        f'<circle cx="{LABEL_W + 262}" cy="14" r="4" fill="{CHECKPOINT_COLOUR}"/>'
        f'<text x="{LABEL_W + 270}" y="18">checkpoint</text>',
        f'<circle cx="{LABEL_W + 350}" cy="14" r="4" fill="{RESTORE_COLOUR}"/>'
        f'<text x="{LABEL_W + 358}" y="18">restored</text>',
    ]
    if any(m.kind == "state" for b in bars for m in b.marks):
        out.append(
            f'<rect x="{LABEL_W + 424}" y="6" width="2" height="16" fill="{STATE_COLOUR}"/>'
            f'<text x="{LABEL_W + 432}" y="18">job state</text>'
        )
    if not bars:
        out.append(f'<text x="{LABEL_W}" y="{TOP + 18}">no attempt priced yet</text></svg>')
        return "".join(out)
    t0 = min(b.start for b in bars)
    span = max(max([b.end for b in bars] + ([deadline] if deadline else [])) - t0, 1.0)
    plot_w = WIDTH - LABEL_W - 20
    scale = plot_w / span

    def x(t: float) -> float:
        return LABEL_W + (t - t0) * scale

    out.extend(_series_svg(series, x, TOP, LABEL_W + plot_w))
    for i, bar in enumerate(bars):
        y = TOP + band + i * ROW_H
        kind = "spot" if bar.spot else "ondemand"
        colour = SPOT_COLOUR if bar.spot else ON_DEMAND_COLOUR
        x0, x1 = x(bar.start), x(max(bar.end, bar.start))
        tip = escape(f"{bar.label}: {bar.detail}" if bar.detail else bar.label)
        out.append(f'<text x="4" y="{y + 17}">{escape(bar.label)}</text>')
        out.append(
            f'<rect class="ct-bar {kind}" data-index="{i}" x="{x0:.1f}" y="{y + 4}" '
            f'width="{max(x1 - x0, 2.0):.1f}" height="{ROW_H - 8}" rx="3" fill="{colour}">'
            f"<title>{tip}</title></rect>"
        )
        if bar.running:  # it goes on: an open end
            out.append(
                f'<path class="ct-running" data-index="{i}" d="M{x1:.1f} {y + 4} l8 {(ROW_H - 8) / 2} '
                f'l-8 {(ROW_H - 8) / 2} z" fill="{colour}" opacity="0.5"><title>running now</title></path>'
            )
        for mark in bar.marks:
            if bar.start <= mark.at <= bar.end:
                out.append(_mark_svg(mark, x(mark.at), y, i))
        if bar.interrupted:
            out.append(
                f'<path class="ct-interruption" data-index="{i}" d="M{x1 - 6:.1f} {y} l6 10 l6 -10 z" '
                f'fill="{INTERRUPTION_COLOUR}"><title>interrupted: {tip}</title></path>'
                f'<line x1="{x1:.1f}" y1="{y}" x2="{x1:.1f}" y2="{y + ROW_H}" '
                f'stroke="{INTERRUPTION_COLOUR}" stroke-width="2"/>'
            )
    axis_y = TOP + band + ROW_H * len(bars) + 4
    if deadline:
        dx = x(deadline)
        out.append(
            f'<line class="ct-deadline" x1="{dx:.1f}" y1="{TOP}" x2="{dx:.1f}" y2="{axis_y}" '
            f'stroke="{DEADLINE_COLOUR}" stroke-width="2" stroke-dasharray="6 3"><title>deadline '
            f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(deadline))}</title></line>"
            f'<text x="{dx - 4:.1f}" y="{TOP + 10}" text-anchor="end" fill="{DEADLINE_COLOUR}">deadline</text>'
        )
    out.append(f'<line x1="{LABEL_W}" y1="{axis_y}" x2="{LABEL_W + plot_w}" y2="{axis_y}" stroke="#888"/>')
    for tick in _ticks(span):
        tx = LABEL_W + tick * scale
        out.append(
            f'<line x1="{tx:.1f}" y1="{axis_y}" x2="{tx:.1f}" y2="{axis_y + 4}" stroke="#888"/>'
            f'<text x="{tx:.1f}" y="{axis_y + 16}" text-anchor="middle" fill="#555">+{_clock(tick)}</text>'
        )
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t0))
    out.append(f'<text x="{LABEL_W}" y="{axis_y + 32}" fill="#555">from {started}</text></svg>')
    return "".join(out)
