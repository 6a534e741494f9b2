"""The report's plots: job timeline, metric vs λ±2δ, communicator heatmaps, decision-tree
path and the degradation ratio. Each returns a :class:`~processors.report.svg.Plot`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

import numpy as np

from processors.report.collect import CommData, MetricSeries
from processors.report.degradation import SLOW_FACTOR, Degradation
from processors.report.svg import (
    Frame,
    Plot,
    band_path,
    diverging,
    fmt,
    polyline,
    sequential,
    time_axis,
    value_axis,
)
from processors.whatif import iso
from schemas.records import Diagnosis, IsolationCommand
from sinks.base import GuardRefusal

WIDTH = 1200.0
LANES = ("faults (truth)", "diagnoses", "commands", "refusals")
KIND_COLOUR = {"critical_error": "#b2182b", "dist_error": "#d6604d", "hang_compute": "#762a83",
               "hang_network": "#2166ac", "slow_compute": "#9970ab", "slow_network": "#4393c3",
               "outlier": "#878787", "config": "#1b7837", "offline_needed": "#8c510a",
               "systemic": "#e08214", "host_dark": "#4d4d4d"}


def _tip(text: str) -> str:
    return f"<title>{escape(text)}</title>"


def timeline(pid: str, job: str, t0: float, t1: float, faults: Sequence[Mapping[str, Any]],
             diagnoses: Sequence[Diagnosis], commands: Sequence[IsolationCommand],
             refusals: Sequence[GuardRefusal]) -> Plot:
    """One lane each for ground-truth faults, diagnoses (event_ts → detected_ts), commands
    and guard refusals."""
    lane_h = 34.0
    p = Plot(pid, "timeline", WIDTH, 40 + lane_h * len(LANES), f"timeline of {job}")
    f = Frame(WIDTH, p.height, t0, t1, 0, len(LANES), left=120)
    time_axis(p, f)
    for i, name in enumerate(LANES):
        y = f.top + i * lane_h
        p.axes.append(f'<text x="{fmt(f.left - 8)}" y="{fmt(y + lane_h / 2 + 4)}" '
                      f'text-anchor="end" class="lane">{escape(name)}</text>')

    def lane_y(i: int) -> float:
        return f.top + i * lane_h + lane_h / 2

    for fa in faults:
        a, b = float(fa.get("start_ts", t0)), float(fa.get("end_ts", t1))
        x0, x1 = f.x(max(a, t0)), f.x(min(b, t1))
        p.mark(f'<rect class="fault" x="{fmt(x0)}" y="{fmt(lane_y(0) - 9)}" '
               f'width="{fmt(max(2.0, x1 - x0))}" height="18">'
               f'{_tip(str(fa.get("fault_id", fa.get("scenario", "fault"))) + " " + str(fa.get("culprit", "")))}'
               f'</rect>')
    for d in diagnoses:
        colour = KIND_COLOUR.get(d.kind, "#444")
        xa, xb, y = f.x(d.event_ts), f.x(d.detected_ts), lane_y(1)
        tip = _tip(f"{d.kind} {d.summary} (first evidence {iso(d.event_ts)}, "
                   f"detected {iso(d.detected_ts)})")
        p.mark(f'<g class="diagnosis" data-id="{escape(d.id)}"><line x1="{fmt(xa)}" y1="{fmt(y)}" '
               f'x2="{fmt(xb)}" y2="{fmt(y)}" stroke="{colour}" stroke-width="4"/>'
               f'<circle cx="{fmt(xb)}" cy="{fmt(y)}" r="6" fill="{colour}">{tip}</circle></g>')
    for c in commands:
        x, y = f.x(c.issued_at), lane_y(2)
        p.mark(f'<path class="command" d="M{fmt(x)},{fmt(y - 8)} L{fmt(x + 7)},{fmt(y + 6)} '
               f'L{fmt(x - 7)},{fmt(y + 6)} Z">{_tip(f"{c.action} {c.target} at {iso(c.issued_at)}")}</path>')
    for r in refusals:
        x, y = f.x(r.ts), lane_y(3)
        p.mark(f'<path class="refusal" d="M{fmt(x - 6)},{fmt(y - 6)} L{fmt(x + 6)},{fmt(y + 6)} '
               f'M{fmt(x + 6)},{fmt(y - 6)} L{fmt(x - 6)},{fmt(y + 6)}">'
               f'{_tip(f"refused {r.action} {r.target}: {r.reason}")}</path>')
    return p


def metric_plot(pid: str, s: MetricSeries, ev: Mapping[str, Any], detected_ts: float) -> Plot:
    """Aegis §5.1: the device's metric against λ and λ±2δ, persistence window shaded."""
    p = Plot(pid, "metric", WIDTH, 220, f"{s.device} {s.metric} vs λ±{s.sigma:g}δ")
    ts = [t + s.sub_window_s / 2 for t in s.t]
    lo_band = [m - s.sigma * d for m, d in zip(s.mean, s.std, strict=True)]
    hi_band = [m + s.sigma * d for m, d in zip(s.mean, s.std, strict=True)]
    vals = [v for v in (*s.value, *hi_band, *lo_band, *s.upper, *s.lower) if math.isfinite(v)]
    if not ts or not vals:
        return p
    lo, hi = min(vals), max(vals)
    pad = (hi - lo) * 0.08 or max(abs(hi), 1.0) * 0.1
    f = Frame(WIDTH, p.height, s.t[0], s.t[-1] + s.sub_window_s, lo - pad, hi + pad)
    time_axis(p, f)
    value_axis(p, f)
    start, flagged = ev.get("streak_start"), ev.get("flagged_at", detected_ts)
    if isinstance(start, int | float) and isinstance(flagged, int | float):
        x0, x1 = f.x(max(float(start), f.x0)), f.x(min(float(flagged), f.x1))
        p.mark(f'<rect class="persistence" x="{fmt(x0)}" y="{fmt(f.top)}" '
               f'width="{fmt(max(1.0, x1 - x0))}" height="{fmt(f.height - f.top - f.bottom)}">'
               f'{_tip(f"beyond the bound since {iso(float(start))}, flagged {iso(float(flagged))}")}</rect>')
    band = band_path(f, ts, lo_band, hi_band)
    if band:
        p.mark(f'<path class="band" d="{band}">{_tip(f"λ±{s.sigma:g}δ")}</path>')
    for cls, series in (("mean", s.mean), ("bound", s.upper if ev.get("direction") != "low"
                                          else s.lower), ("value", s.value)):
        for pts in polyline(f, ts, series):
            p.mark(f'<polyline class="{cls}" points="{pts}"/>')
    x = f.x(detected_ts)
    p.mark(f'<line class="detected" x1="{fmt(x)}" y1="{fmt(f.top)}" x2="{fmt(x)}" '
           f'y2="{fmt(f.height - f.bottom)}">{_tip(f"detected {iso(detected_ts)}")}</line>')
    return p


def _columns(n: int, max_cols: int) -> list[slice]:
    step = max(1, math.ceil(n / max_cols))
    return [slice(i, min(n, i + step)) for i in range(0, n, step)]


def _last(a: np.ndarray, cols: list[slice]) -> np.ndarray:
    """Per display column, each row's newest non-NaN value (NaN if none)."""
    out = np.full((a.shape[0], len(cols)), np.nan)
    for j, sl in enumerate(cols):
        block = a[:, sl]
        ok = ~np.isnan(block)
        has = ok.any(axis=1)
        idx = block.shape[1] - 1 - np.argmax(ok[:, ::-1], axis=1)
        out[has, j] = block[has, idx[has]]
    return out


def heatmap_values(cd: CommData, max_cols: int = 120) -> tuple[dict[str, np.ndarray], int]:
    """Per display column (``step`` buckets each): CL behind the communicator's leader,
    WR−WC, TD / mean TD; and ``step``."""
    cols = _columns(cd.cl.shape[1], max_cols)
    cl, out, td = _last(cd.cl, cols), _last(cd.outstanding, cols), _last(cd.td, cols)
    with np.errstate(invalid="ignore", divide="ignore"):
        lead = np.where(np.isnan(cl), -np.inf, cl).max(axis=0, initial=-np.inf)
        lag = np.where(np.isnan(cl), np.nan, lead[None, :] - cl)
        have = (~np.isnan(td)).sum(axis=0)
        mean_td = np.where(have > 0, np.nansum(td, axis=0) / np.maximum(have, 1), np.nan)
        ratio = td / mean_td[None, :]
    step = cols[0].stop - cols[0].start if cols else 1
    return {"cl_lag": lag, "wr_wc": out, "td_ratio": ratio}, step


def heatmap(pid: str, cd: CommData, metric: str, values: np.ndarray, t0: float,
            col_s: float, ranks: Sequence[int]) -> Plot:
    """Ranks × time; runs of one colour in a row are one rect (small files)."""
    ncols = values.shape[1]
    row_h = max(6.0, min(18.0, 220.0 / max(1, len(ranks))))
    label = {"cl_lag": "CL behind leader", "wr_wc": "WR − WC", "td_ratio": "TD / mean TD"}[metric]
    p = Plot(pid, f"heatmap {metric}", WIDTH, 44 + row_h * len(ranks),
             f"communicator {cd.comm} {label}")
    span = max(1, ncols) * col_s
    f = Frame(WIDTH, p.height, t0, t0 + span, 0, len(ranks), left=150, top=6)
    time_axis(p, f)
    finite = values[np.isfinite(values)]
    top = float(finite.max()) if finite.size else 0.0
    col_w = (f.width - f.left - f.right) / max(1, ncols)
    for i, rank in enumerate(ranks):
        host, gpu = cd.members.get(rank, ("?", -1))
        y = f.top + i * row_h
        p.axes.append(f'<text x="{fmt(f.left - 6)}" y="{fmt(y + row_h * 0.75)}" '
                      f'text-anchor="end" class="rank">r{rank} {escape(host)}/gpu{gpu}</text>')
        row = values[i]
        j = 0
        while j < ncols:
            v = row[j]
            colour = _colour(metric, v, top)
            k = j + 1
            while k < ncols and _colour(metric, row[k], top) == colour:
                k += 1
            if colour is not None:
                tip = f"rank {rank} {label}: {v:.4g}" if math.isfinite(v) else ""
                p.mark(f'<rect class="cell" x="{fmt(f.left + j * col_w)}" y="{fmt(y)}" '
                       f'width="{fmt((k - j) * col_w)}" height="{fmt(row_h - 1)}" '
                       f'fill="{colour}">{_tip(tip)}</rect>')
            j = k
    return p


def _colour(metric: str, v: float, top: float) -> str | None:
    if not math.isfinite(v):
        return None
    if metric == "td_ratio":
        return diverging(round(v * 20) / 20)
    # one launch behind / one WR in flight is a snapshot taken mid-op: pale, not alarming;
    # a lag that persists shows as a stripe along the lagging rank's row
    frac = max(0.0, v) / max(top, 2.0)
    return sequential(round(frac * 12) / 12, "red" if metric == "cl_lag" else "orange")


def tree_path(pid: str, path: Sequence[str]) -> Plot:
    """Aegis Algorithm 1: the steps a Phase-1 diagnosis went through, the last one its verdict."""
    box_w, gap, h = 150.0, 28.0, 64.0
    p = Plot(pid, "tree-path", max(300.0, len(path) * (box_w + gap) + 20), h, "decision tree path")
    for i, step in enumerate(path):
        name, _, outcome = step.partition(":")
        x = 10 + i * (box_w + gap)
        cls = "hit" if i == len(path) - 1 else ("miss" if outcome == "miss" else "pass")
        if i < len(path) - 1:
            p.axes.append(f'<line x1="{fmt(x + box_w)}" y1="{fmt(h / 2)}" x2="{fmt(x + box_w + gap)}" '
                          f'y2="{fmt(h / 2)}" class="arrow"/>')
        p.mark(f'<g class="step {cls}"><rect x="{fmt(x)}" y="8" width="{fmt(box_w)}" height="48" '
               f'rx="6"/><text x="{fmt(x + box_w / 2)}" y="28" text-anchor="middle">{escape(name)}'
               f'</text><text x="{fmt(x + box_w / 2)}" y="46" text-anchor="middle" '
               f'class="outcome">{escape(outcome or "verdict")}</text></g>')
    return p


def degradation_plot(pid: str, deg: Degradation) -> Plot:
    """r_i = iteration time / normal (from DP progress) against Ts = 1.2 (Aegis §5)."""
    p = Plot(pid, "degradation", WIDTH, 180, f"iteration time ratio of {deg.job}")
    if not deg.ratio:
        return p
    ts = [deg.t0 + (i + 0.5) * deg.bucket_s for i in range(len(deg.ratio))]
    shown = [min(v, 3.0) if not math.isnan(v) else math.nan for v in deg.ratio]
    f = Frame(WIDTH, p.height, deg.t0, deg.t0 + len(deg.ratio) * deg.bucket_s, 0.0, 3.0)
    time_axis(p, f)
    value_axis(p, f, 3)
    y = f.y(SLOW_FACTOR)
    p.axes.append(f'<line x1="{fmt(f.left)}" y1="{fmt(y)}" x2="{fmt(f.width - f.right)}" '
                  f'y2="{fmt(y)}" class="threshold"/>')
    for t, v in zip(ts, shown, strict=True):
        if math.isfinite(v) and v > SLOW_FACTOR:
            x0 = f.x(t - deg.bucket_s / 2)
            p.mark(f'<rect class="slow" x="{fmt(x0)}" y="{fmt(f.y(v))}" '
                   f'width="{fmt(max(1.0, f.x(t + deg.bucket_s / 2) - x0))}" '
                   f'height="{fmt(f.y(SLOW_FACTOR) - f.y(v))}"/>')
    for pts in polyline(f, ts, shown):
        p.mark(f'<polyline class="ratio" points="{pts}"/>')
    return p
