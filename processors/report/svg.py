"""Inline SVG plots, written by hand (no plotting dependency; the report must work offline).

Every plot is an ``<svg>`` with a stable ``id``, the classes ``aegis-plot`` and its kind,
``data-marks`` = how many data marks it drew (the e2e test checks they rendered), axes in
``<g class="axes">`` and the data in ``<g class="marks">``. Times are event-time epoch
seconds, labelled in UTC.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape

NICE_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
              43200, 86400)


def fmt(x: float) -> str:
    """Compact coordinates: 2 decimals, no trailing zeros."""
    s = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if s == "-0" else s


def num_label(x: float) -> str:
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    a = abs(x)
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def time_label(ts: float, step: float) -> str:
    d = datetime.fromtimestamp(ts, UTC)
    return d.strftime("%H:%M:%S" if step < 60 else "%H:%M")


def time_ticks(t0: float, t1: float, target: int = 7) -> list[float]:
    span = max(t1 - t0, 1e-9)
    step = next((s for s in NICE_STEPS if span / s <= target), NICE_STEPS[-1])
    first = math.ceil(t0 / step) * step
    return [first + i * step for i in range(int((t1 - first) // step) + 1)]


@dataclass
class Frame:
    """A plot area: pixel box plus data ranges, with scale helpers."""

    width: float
    height: float
    x0: float
    x1: float
    y0: float
    y1: float
    left: float = 70.0
    right: float = 16.0
    top: float = 12.0
    bottom: float = 26.0

    def x(self, v: float) -> float:
        span = (self.x1 - self.x0) or 1.0
        return self.left + (v - self.x0) / span * (self.width - self.left - self.right)

    def y(self, v: float) -> float:
        span = (self.y1 - self.y0) or 1.0
        return self.height - self.bottom - (v - self.y0) / span * (self.height - self.top - self.bottom)


@dataclass
class Plot:
    """An SVG being built: ``axes`` and ``marks`` are lists of element strings."""

    id: str
    kind: str
    width: float
    height: float
    title: str = ""
    axes: list[str] = field(default_factory=list)
    marks: list[str] = field(default_factory=list)

    def mark(self, element: str) -> None:
        self.marks.append(element)

    def render(self) -> str:
        return (f'<svg id="{escape(self.id)}" class="aegis-plot {escape(self.kind)}" '
                f'data-marks="{len(self.marks)}" role="img" '
                f'width="{fmt(self.width)}" height="{fmt(self.height)}" '
                f'viewBox="0 0 {fmt(self.width)} {fmt(self.height)}">'
                f'<title>{escape(self.title)}</title>'
                f'<g class="axes">{"".join(self.axes)}</g>'
                f'<g class="marks">{"".join(self.marks)}</g></svg>')


def time_axis(p: Plot, f: Frame) -> None:
    ticks = time_ticks(f.x0, f.x1)
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 60.0
    base = f.height - f.bottom
    p.axes.append(f'<line x1="{fmt(f.left)}" y1="{fmt(base)}" x2="{fmt(f.width - f.right)}" '
                  f'y2="{fmt(base)}" class="axis"/>')
    for t in ticks:
        x = f.x(t)
        p.axes.append(f'<line x1="{fmt(x)}" y1="{fmt(f.top)}" x2="{fmt(x)}" y2="{fmt(base)}" '
                      f'class="grid"/><text x="{fmt(x)}" y="{fmt(base + 16)}" '
                      f'text-anchor="middle" class="tick">{time_label(t, step)}</text>')


def value_axis(p: Plot, f: Frame, n: int = 4) -> None:
    p.axes.append(f'<line x1="{fmt(f.left)}" y1="{fmt(f.top)}" x2="{fmt(f.left)}" '
                  f'y2="{fmt(f.height - f.bottom)}" class="axis"/>')
    for i in range(n + 1):
        v = f.y0 + (f.y1 - f.y0) * i / n
        y = f.y(v)
        p.axes.append(f'<text x="{fmt(f.left - 6)}" y="{fmt(y + 4)}" text-anchor="end" '
                      f'class="tick">{num_label(v)}</text>')


def polyline(f: Frame, ts: Sequence[float], vs: Sequence[float]) -> list[str]:
    """Point lists of the finite runs of a series (gaps break the line)."""
    runs: list[str] = []
    cur: list[str] = []
    for t, v in zip(ts, vs, strict=True):
        if v is None or not math.isfinite(v):
            if cur:
                runs.append(" ".join(cur))
            cur = []
            continue
        cur.append(f"{fmt(f.x(t))},{fmt(f.y(v))}")
    if cur:
        runs.append(" ".join(cur))
    return runs


def band_path(f: Frame, ts: Sequence[float], lo: Sequence[float], hi: Sequence[float]) -> str:
    pts = [(t, a, b) for t, a, b in zip(ts, lo, hi, strict=True)
           if math.isfinite(a) and math.isfinite(b)]
    if not pts:
        return ""
    top = " L".join(f"{fmt(f.x(t))},{fmt(f.y(b))}" for t, _, b in pts)
    bottom = " L".join(f"{fmt(f.x(t))},{fmt(f.y(a))}" for t, a, _ in reversed(pts))
    return f"M{top} L{bottom} Z"


# ---- colour scales -------------------------------------------------------------------
def sequential(frac: float, hue: str = "red") -> str:
    """0 → near white, 1 → saturated (red or orange)."""
    frac = min(1.0, max(0.0, frac))
    end = {"red": (178, 24, 43), "orange": (217, 95, 2)}[hue]
    return _hex(tuple(int(round(250 + (c - 250) * frac)) for c in end))


def diverging(ratio: float, spread: float = 0.5) -> str:
    """1.0 → near white; below → blue, above → red; clipped at 1 ± spread."""
    d = max(-1.0, min(1.0, (ratio - 1.0) / spread))
    end = (33, 102, 172) if d < 0 else (178, 24, 43)
    a = abs(d)
    return _hex(tuple(int(round(247 + (c - 247) * a)) for c in end))


def _hex(rgb: tuple[int, ...]) -> str:
    return "#" + "".join(f"{c:02x}" for c in rgb)
