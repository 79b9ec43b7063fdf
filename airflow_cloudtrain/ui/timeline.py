"""A run's attempts as an SVG timeline: one bar per attempt, coloured spot or on-demand, an
interruption marked where the cloud took the instance.

Drawn server-side from plain numbers (stdlib only): the machines that run Airflow often have no
internet, so no chart library or CDN; the same function draws the page's timeline and ``make demo``'s
``timeline.svg``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from html import escape

SPOT_COLOUR = "#e8912d"
ON_DEMAND_COLOUR = "#3b7dd8"
INTERRUPTION_COLOUR = "#d62728"
WIDTH = 760
LABEL_W = 150  # the attempt's name left of its bar
ROW_H = 28
TOP = 34  # the legend
AXIS_H = 44  # the time axis, and under it when the first attempt started


@dataclass(frozen=True)
class Bar:
    """One attempt: ``start``/``end`` unix seconds; ``detail`` is its tooltip."""

    label: str
    start: float
    end: float
    spot: bool
    interrupted: bool
    detail: str = ""


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def _ticks(span: float) -> list[float]:
    """Round steps for the axis, about six of them."""
    for step in (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400):
        if span / step <= 6:
            return [i * step for i in range(int(span // step) + 1)]
    return [0.0, span]


def timeline_svg(bars: list[Bar], title: str = "") -> str:
    """The bars in the order given (attempt order), on one time axis from the first start."""
    height = TOP + ROW_H * max(1, len(bars)) + AXIS_H
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
    ]
    if not bars:
        out.append(f'<text x="{LABEL_W}" y="{TOP + 18}">no attempt priced yet</text></svg>')
        return "".join(out)
    t0 = min(b.start for b in bars)
    span = max(max(b.end for b in bars) - t0, 1.0)
    plot_w = WIDTH - LABEL_W - 20
    scale = plot_w / span

    def x(t: float) -> float:
        return LABEL_W + (t - t0) * scale

    for i, bar in enumerate(bars):
        y = TOP + i * ROW_H
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
        if bar.interrupted:
            out.append(
                f'<path class="ct-interruption" data-index="{i}" d="M{x1 - 6:.1f} {y} l6 10 l6 -10 z" '
                f'fill="{INTERRUPTION_COLOUR}"><title>interrupted: {tip}</title></path>'
                f'<line x1="{x1:.1f}" y1="{y}" x2="{x1:.1f}" y2="{y + ROW_H}" '
                f'stroke="{INTERRUPTION_COLOUR}" stroke-width="2"/>'
            )
    axis_y = TOP + ROW_H * len(bars) + 4
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
