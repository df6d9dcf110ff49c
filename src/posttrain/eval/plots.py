"""Line charts as inline SVG, drawn on the server: no script or font is needed to see them.

Pure functions from numbers to SVG text. Each series is a list of (step, value) points; a chart
gets nice round y ticks, a step axis, one colour per series, a legend, and a ``<title>`` on every
point so that hovering shows its exact value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

# Colour-blind-safe (Okabe & Ito 2008).
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")
WIDTH, HEIGHT = 360, 200
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 26, 34
LEGEND_CHAR = 5.5  # about a 10px system-ui glyph's width: each legend entry is as wide as its label


@dataclass(frozen=True)
class Series:
    label: str
    points: list[tuple[float, float]]


def nice_ticks(low: float, high: float, count: int = 4, integer: bool = False) -> list[float]:
    """About ``count`` round tick values (1, 2 or 5 times a power of ten) covering [low, high];
    ``integer`` ticks are at least 1 apart (train steps)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0]
    # A nearly flat series gets a span of at least 0.1% of its size, so that tick labels stay short.
    floor_span = 1e-3 * max(abs(low), abs(high))
    if high - low < max(floor_span, 1e-12):
        pad = max(floor_span, 1e-12) / 2 if floor_span else 1.0
        mid = (low + high) / 2
        low, high = mid - pad, mid + pad
    raw = (high - low) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    if integer:
        step = max(step, 1.0)
    first = math.floor(low / step) * step
    ticks, value = [], first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < high:
        ticks.append(round(value, 12))
    return ticks


def format_number(value: float) -> str:
    """Short tick and tooltip text: 0.25, 1.2e-05, 1,234."""
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.2g}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def tick_text(value: float, spacing: float) -> str:
    """A tick label with just enough decimals to tell ticks ``spacing`` apart."""
    if abs(value) >= 1e5 or (spacing < 1e-4 and abs(value) < 1e-3):
        return f"{value:.2g}"
    decimals = max(0, -math.floor(math.log10(spacing))) if spacing > 0 else 0
    return f"{value:,.{decimals}f}"


def line_chart(title: str, series: list[Series], y_label: str = "") -> str:
    """One chart; series without finite points are left out, and a chart with none says so."""
    series = [Series(s.label, [(x, y) for x, y in s.points if math.isfinite(x) and math.isfinite(y)])
              for s in series]
    series = [s for s in series if s.points]
    head = (f'<svg class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
            f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>'
            f'<text class="chart-title" x="{LEFT}" y="16">{escape(title)}</text>')
    if not series:
        return head + f'<text class="chart-empty" x="{WIDTH / 2}" y="{HEIGHT / 2}">not logged</text></svg>'
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points]
    y_ticks = nice_ticks(min(ys), max(ys))
    x_ticks = nice_ticks(min(xs), max(xs), count=5, integer=True) if max(xs) > min(xs) else [min(xs)]
    x_lo, x_hi = min(x_ticks[0], min(xs)), max(x_ticks[-1], max(xs))
    y_lo, y_hi = y_ticks[0], y_ticks[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (plot_w / 2 if x_hi == x_lo else (x - x_lo) / (x_hi - x_lo) * plot_w)

    def py(y: float) -> float:
        return TOP + plot_h - (y - y_lo) / (y_hi - y_lo) * plot_h

    parts = [head]
    y_step = y_ticks[1] - y_ticks[0] if len(y_ticks) > 1 else 1.0
    x_step = x_ticks[1] - x_ticks[0] if len(x_ticks) > 1 else 1.0
    for t in y_ticks:
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py(t):.1f}" y2="{py(t):.1f}"/>'
                     f'<text class="tick" x="{LEFT - 4}" y="{py(t) + 3:.1f}" text-anchor="end">'
                     f'{tick_text(t, y_step)}</text>')
    for t in x_ticks:
        if x_lo <= t <= x_hi:
            parts.append(f'<text class="tick" x="{px(t):.1f}" y="{HEIGHT - BOTTOM + 13}" text-anchor="middle">'
                         f'{tick_text(t, x_step)}</text>')
    parts.append(f'<text class="axis-label" x="{LEFT + plot_w / 2}" y="{HEIGHT - 4}" text-anchor="middle">step'
                 f'</text>')
    if y_label:
        parts.append(f'<text class="axis-label" x="12" y="{TOP + plot_h / 2}" text-anchor="middle" '
                     f'transform="rotate(-90 12 {TOP + plot_h / 2})">{escape(y_label)}</text>')
    widths = [24 + LEGEND_CHAR * len(s.label) for s in series]  # swatch, gap, label, space to the next
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        parts.append(f'<polyline class="line" fill="none" stroke="{colour}" points="{path}"/>')
        radius = 2.5 if len(s.points) <= 60 else 1.2
        parts += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="{radius}" fill="{colour}">'
                  f'<title>{escape(s.label)} at step {format_number(x)}: {format_number(y)}</title></circle>'
                  for x, y in s.points]
        if len(series) > 1:  # legend entries on the title line, from the right edge
            lx = WIDTH - RIGHT - sum(widths[i:]) + 10
            parts.append(f'<rect x="{lx}" y="11" width="10" height="3" fill="{colour}"/>'
                         f'<text class="legend" x="{lx + 14}" y="15">{escape(s.label)}</text>')
    parts.append("</svg>")
    return "".join(parts)
