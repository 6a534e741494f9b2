"""Assemble the postmortem report from a replay's outputs and a second pass over its records."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

import numpy as np

from processors.report import plots
from processors.report.collect import CCLCollector, CommData, TelemetryCollector, collect
from processors.report.degradation import Degradation, measure, pacing_comms, percent
from processors.report.html import Raw, legend, page, table
from processors.settings import PipelineConfig
from processors.whatif import SECTIONS, WhatIfDiff, describe, iso
from schemas.inventory import Inventory
from schemas.recording import RecordingEntry, read_recording
from schemas.records import DeadLetter, Diagnosis, IsolationCommand
from sinks.base import GuardRefusal, SinkItem


@dataclass
class ReportInput:
    """What the report is built from: the recording, the replay's outputs, the policy."""

    path: str
    items: Sequence[SinkItem]
    config: PipelineConfig | None = None
    job: str | None = None
    t_from: float | None = None
    t_to: float | None = None
    truth: list[dict[str, Any]] | None = None
    diff: WhatIfDiff | None = None
    title: str = "aegis replay report"
    header: Mapping[str, Any] = field(default_factory=dict)
    max_jobs: int = 20
    max_comms: int = 12
    max_ranks: int = 64
    max_metric_plots: int = 40
    bucket_s: float | None = None  # CCL / degradation bucket; default max(5 s, span/1500)
    span: tuple[float, float] | None = None  # first and last record ts, if already known
    inventory: Inventory | None = None  # names NICs like the detectors; default: the header's


def slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", s)


def _entries(inp: ReportInput) -> Iterable[RecordingEntry]:
    _, entries = read_recording(inp.path)
    for e in entries:
        if inp.job is not None and e.key != inp.job:
            continue
        if (inp.t_from is not None and e.ts < inp.t_from) or (inp.t_to is not None and e.ts >= inp.t_to):
            continue
        yield e


def _span(inp: ReportInput) -> tuple[float, float]:
    lo, hi = math.inf, -math.inf
    for e in _entries(inp):
        lo, hi = min(lo, e.ts), max(hi, e.ts)
    return (lo, hi) if lo <= hi else (0.0, 1.0)


@dataclass
class Outputs:
    diagnoses: list[Diagnosis] = field(default_factory=list)
    commands: list[IsolationCommand] = field(default_factory=list)
    refusals: list[GuardRefusal] = field(default_factory=list)
    dead_letters: int = 0


def split(items: Iterable[SinkItem]) -> Outputs:
    out, seen = Outputs(), set()
    for it in items:
        if isinstance(it, Diagnosis) and it.id not in seen:
            seen.add(it.id)
            out.diagnoses.append(it)
        elif isinstance(it, IsolationCommand):
            out.commands.append(it)
        elif isinstance(it, GuardRefusal):
            out.refusals.append(it)
        elif isinstance(it, DeadLetter):
            out.dead_letters += 1
    return out


def zscore_targets(diagnoses: Iterable[Diagnosis]) -> dict[tuple[str, str], set[str]]:
    """{(job, device kind): metrics} named in the zscore diagnoses' evidence."""
    out: dict[tuple[str, str], set[str]] = {}
    for d in diagnoses:
        for _, metrics in zscore_devices(d):
            out.setdefault((d.job, str(d.evidence.get("device_kind", ""))), set()).update(metrics)
    return out


def zscore_devices(d: Diagnosis) -> list[tuple[str, Mapping[str, Any]]]:
    """(device, {metric: flag evidence}) of a zscore diagnosis: its device, or each GPU of a
    host roll-up (``evidence.devices``)."""
    if d.detector != "zscore":
        return []
    ev = d.evidence
    per = ev.get("devices")
    if isinstance(per, Mapping):
        return [(str(g), v["metrics"]) for g, v in sorted(per.items())
                if isinstance(v, Mapping) and isinstance(v.get("metrics"), Mapping)]
    metrics = ev.get("metrics")
    return [(str(ev.get("device", "")), metrics)] if isinstance(metrics, Mapping) else []


def build_report(inp: ReportInput) -> str:
    cfg = inp.config or PipelineConfig()
    zcfg = cfg.section("zscore")
    outs = split(inp.items)
    first, last = inp.span or _span(inp)
    bucket = inp.bucket_s or max(5.0, (last - first) / 1500)
    t0 = math.floor(first / bucket) * bucket
    targets = zscore_targets(outs.diagnoses)
    inv = inp.inventory
    if inv is None and isinstance(inp.header.get("inventory"), Mapping):
        inv = Inventory.from_wire(inp.header["inventory"])
    tel = TelemetryCollector(targets, zcfg.sub_window_s, inv) if targets else None
    ccl = CCLCollector(t0, bucket, int((last - t0) // bucket) + 1)
    collect(_entries(inp), tel, ccl)
    by_job: dict[str, dict[str, CommData]] = {}
    for (job, comm), cd in ccl.comms.items():
        by_job.setdefault(job, {})[comm] = cd
    degr = {job: _degradation(job, comms, bucket, t0) for job, comms in sorted(by_job.items())}
    truth = inp.truth or []
    jobs = _report_jobs(inp, outs, truth, sorted(by_job))
    sections = [_head(inp, outs, first, last, len(jobs)), _whatif(inp.diff), _degr_table(degr)]
    for job in jobs[: inp.max_jobs]:
        sections.append(_job_section(inp, job, outs, truth, first, last, tel, by_job.get(job, {}),
                                     degr.get(job), zcfg, t0, bucket))
    if len(jobs) > inp.max_jobs:
        sections.append(f"<p>{len(jobs) - inp.max_jobs} more job(s) with findings not shown "
                        f"(use --job).</p>")
    return page(inp.title, sections)


def _degradation(job: str, comms: Mapping[str, CommData], bucket: float, t0: float) -> Degradation:
    pace = pacing_comms({c: cd.hosts for c, cd in comms.items()},
                        {c: sorted(cd.ops) for c, cd in comms.items()})
    ops = sorted({comms[c].op for c in pace})
    return measure(job, {c: comms[c].seq for c in pace}, bucket, t0, ",".join(ops))


def _report_jobs(inp: ReportInput, outs: Outputs, truth: Sequence[Mapping[str, Any]],
                 seen: Sequence[str]) -> list[str]:
    if inp.job is not None:
        return [inp.job]
    named = {d.job for d in outs.diagnoses} | {c.job for c in outs.commands} | \
        {r.job for r in outs.refusals} | {str(f.get("job")) for f in truth if f.get("job")}
    return sorted(named) or list(seen[:1])


def _head(inp: ReportInput, outs: Outputs, first: float, last: float, njobs: int) -> str:
    meta = {k: v for k, v in inp.header.items() if k not in ("inventory", "config", "offsets")}
    rows = [("recording", inp.path), ("event time", f"{iso(first)} → {iso(last)} "
                                                     f"({last - first:.0f} s)"),
            ("job filter", inp.job or "all"), ("jobs in the report", njobs),
            ("diagnoses / commands / refusals / dead letters",
             f"{len(outs.diagnoses)} / {len(outs.commands)} / {len(outs.refusals)} / "
             f"{outs.dead_letters}")]
    rows += [(f"header: {k}", v) for k, v in sorted(meta.items())]
    return f"<h1>{escape(inp.title)}</h1>" + table(("", ""), rows, "meta")


def _whatif(diff: WhatIfDiff | None) -> str:
    if diff is None:
        return ""
    rows: list[tuple[Any, ...]] = []
    for s in SECTIONS:
        d = diff.section(s)
        rows += [(Raw('<span class="appear">appear</span>'), describe(x)) for x in d.appear]
        rows += [(Raw('<span class="disappear">disappear</span>'), describe(x)) for x in d.disappear]
        rows += [(Raw('<span class="change">change</span>'), describe(p.new) + " — " + "; ".join(
            f"{k}: {v[0]} → {v[1]}" for k, v in sorted(p.fields.items()))) for p in d.change]
    body = table(("", "what"), rows, "whatif") if rows else "<p>No difference.</p>"
    return '<h2 id="whatif">What-if</h2>' + body


def _degr_table(degr: Mapping[str, Degradation]) -> str:
    rows = [(d.job, percent(d.fraction), f"{d.lost_s:.0f}", f"{d.running_s:.0f}",
             f"{d.stalled_s:.0f}",
             f"{1000 * d.normal_launch_s:.1f}" if d.normal_launch_s else "n/a",
             f"{d.op} × {len(d.comms)}") for d in degr.values()]
    return ('<h2 id="degradation">Degradation (Aegis §5)</h2><p>Ts = 1.2 × the normal iteration '
            'time; degradation = Σ(Tk − Ts)/ΣTk over iterations with Tk &gt; Ts. Iteration time '
            'is derived from the progress of the job\'s data-parallel collective (min seq over '
            'ranks per bucket); see docs/replay.md.</p>'
            + table(("job", "degradation", "lost s", "running s", "stalled s",
                     "normal ms / launch", "pacing op × comms"), rows, "degradation"))


def _diag_rows(ds: Sequence[Diagnosis]) -> list[tuple[Any, ...]]:
    return [(d.kind, ", ".join((*d.culprits.hosts, *d.culprits.gpus, *d.culprits.links)),
             d.evidence.get("rule", ""), d.detector, iso(d.event_ts), iso(d.detected_ts),
             d.confidence, "; ".join(" ".join(map(str, a)) for a in d.evidence.get("actions", [])),
             d.summary) for d in ds]


def _job_section(inp: ReportInput, job: str, outs: Outputs, truth: Sequence[Mapping[str, Any]],
                 first: float, last: float, tel: TelemetryCollector | None,
                 comms: Mapping[str, CommData], deg: Degradation | None, zcfg: Any,
                 t0: float, bucket: float) -> str:
    ds = [d for d in outs.diagnoses if d.job == job]
    cs = [c for c in outs.commands if c.job == job]
    rs = [r for r in outs.refusals if r.job == job]
    fs = [f for f in truth if f.get("job") == job]
    sj = slug(job)
    parts = [f'<h2 id="job-{sj}">Job {escape(job)}</h2>',
             legend({k: v for k, v in plots.KIND_COLOUR.items() if any(d.kind == k for d in ds)}),
             plots.timeline(f"timeline-{sj}", job, first, max(last, first + 1), fs, ds, cs,
                            rs).render()]
    if fs:
        parts.append(table(("fault", "scenario", "culprit", "start", "end", "expected"), [
            (f.get("fault_id", ""), f.get("scenario", ""), f.get("culprit", ""),
             iso(float(f.get("start_ts", 0))), iso(float(f.get("end_ts", 0))),
             ", ".join(f.get("expected_kinds", []))) for f in fs], "truth"))
    parts.append(table(("kind", "culprits", "rule", "detector", "first evidence", "detected",
                        "confidence", "actions", "summary"), _diag_rows(ds), "diagnoses"))
    if cs or rs:
        parts.append(table(("", "action", "target", "at", "why"),
                           [("command", c.action, c.target, iso(c.issued_at), c.reason) for c in cs]
                           + [("refused", r.action, r.target, iso(r.ts), f"{r.reason}: {r.detail}")
                              for r in rs], "commands"))
    if deg is not None:
        parts.append(f"<h3>Degradation: {percent(deg.fraction)}</h3>"
                     + plots.degradation_plot(f"degradation-{sj}", deg).render())
    parts.append(_zscore_parts(inp, sj, ds, tel, zcfg))
    parts.append(_tree_parts(sj, ds))
    parts.append(_comm_parts(inp, sj, ds, comms, t0, bucket))
    return "".join(parts)


METRIC_LEGEND = legend({"the device's sub-window mean": "#111", "λ (job mean)": "#2166ac",
                        "λ±2δ": "#92c5de", "bound (with tolerance floors)": "#b2182b",
                        "persistence window (streak start → flagged)": "#fddbc7"})


def _zscore_parts(inp: ReportInput, sj: str, ds: Sequence[Diagnosis],
                  tel: TelemetryCollector | None, zcfg: Any) -> str:
    parts, shown = [], 0
    if tel is None:
        return ""
    for d in ds:
        devices = zscore_devices(d)
        if not devices:
            continue
        kind, rows = str(d.evidence.get("device_kind", "")), []
        parts.append(f"<h3>{escape(d.kind)} on {escape(str(d.evidence.get('device', '')))} "
                     f"(Aegis §5.1, T = {d.evidence.get('window_s', '')} s)</h3>" + METRIC_LEGEND)
        for device, m, ev in [(g, m, e) for g, ms in devices for m, e in sorted(ms.items())]:
            rows.append((device, m, ev.get("direction"), ev.get("value"), ev.get("mean"),
                         ev.get("std"), ev.get("bound"), ev.get("window_s"),
                         iso(float(ev.get("streak_start", 0))),
                         iso(float(ev.get("flagged_at", 0)))))
            series = tel.series(d.job, kind, m, device, zcfg)
            if series is None or shown >= inp.max_metric_plots:
                continue
            shown += 1
            side = "above the upper" if ev.get("direction") != "low" else "below the lower"
            parts.append(f'<p class="caption"><b>{escape(m)}</b> of {escape(device)}: '
                         f'{side} bound from {iso(float(ev.get("streak_start", 0)))}</p>')
            pid = f"{slug(d.id)}-{slug(m)}" if len(devices) == 1 else \
                f"{slug(d.id)}-{slug(device)}-{slug(m)}"
            parts.append(plots.metric_plot(f"metric-{pid}", series, ev, d.detected_ts).render())
        parts.append(table(("device", "metric", "side", "value", "λ", "δ", "bound", "T s",
                            "streak start", "flagged at"), rows, "zscore-evidence"))
    return "".join(parts)


def _tree_parts(sj: str, ds: Sequence[Diagnosis]) -> str:
    parts = []
    for d in ds:
        path = d.evidence.get("path")
        if not isinstance(path, list | tuple) or not path:
            continue
        parts.append(f"<h3>Decision tree (Aegis Algorithm 1): {escape(d.kind)} — "
                     f"{escape(d.summary)}</h3>")
        parts.append(plots.tree_path(f"tree-{slug(d.id)}", [str(x) for x in path]).render())
        lines = d.evidence.get("lines", [])
        parts.append(table(("host", "time", "rule", "line"), [
            (ln.get("host", ""), iso(float(ln.get("ts", 0))), ln.get("rule", ""),
             Raw(f'<span class="mono">{escape(str(ln.get("line", "")))}</span>'))
            for ln in lines if isinstance(ln, Mapping)], "tree-evidence"))
    return "".join(parts)


def comm_priority(ds: Sequence[Diagnosis], comms: Mapping[str, CommData]) -> list[str]:
    """Communicators named in evidence first, then those holding culprit GPUs, then culprit
    hosts, then the ones spanning most hosts."""
    named: set[str] = set()
    gpus: set[tuple[str, int]] = set()
    hosts: set[str] = set()
    for d in ds:
        ev = d.evidence
        if isinstance(ev.get("comm"), str):
            named.add(ev["comm"])
        for x in ev.get("lagging_in", []) or []:
            if isinstance(x, Mapping) and isinstance(x.get("comm"), str):
                named.add(x["comm"])
        hosts.update(d.culprits.hosts)
        for g in d.culprits.gpus:
            h, _, tail = g.partition("/gpu")
            if tail.isdigit():
                gpus.add((h, int(tail)))

    def rank(c: str) -> tuple[int, int, str]:
        mem = set(comms[c].members.values())
        level = 0 if c in named else 1 if mem & gpus else 2 if {h for h, _ in mem} & hosts else 3
        return level, -len(comms[c].hosts), c

    return sorted(comms, key=rank)


def _comm_parts(inp: ReportInput, sj: str, ds: Sequence[Diagnosis],
                comms: Mapping[str, CommData], t0: float, bucket: float) -> str:
    if not comms:
        return ""
    order = comm_priority(ds, comms)
    parts = [f"<h3>Communicators (Aegis §4.2 CL/WR/WC, §5.2 TD): {min(len(order), inp.max_comms)}"
             f" of {len(order)}</h3><p>Red: CL behind the communicator's leader (a lagging "
             f"rank); orange: WR − WC (work requests outstanding); blue/red: TD relative to "
             f"the communicator's mean (blue = short TD, the slow-compute rank).</p>"]
    for c in order[: inp.max_comms]:
        cd = comms[c]
        vals, step = plots.heatmap_values(cd)
        ranks = _pick_ranks(cd, vals, inp.max_ranks)
        parts.append(f"<h3 class=\"comm\">communicator {escape(c)}: {cd.size} ranks on "
                     f"{len(cd.hosts)} host(s), pacing op {escape(cd.op)}</h3>")
        for metric in ("cl_lag", "wr_wc", "td_ratio"):
            parts.append(plots.heatmap(f"heat-{sj}-{slug(c)}-{metric}", cd, metric,
                                       vals[metric][ranks], t0, step * bucket, ranks).render())
    return "".join(parts)


def _pick_ranks(cd: CommData, vals: Mapping[str, Any], limit: int) -> list[int]:
    n = cd.size
    if n <= limit:
        return list(range(n))
    with np.errstate(invalid="ignore"):
        score = (np.nan_to_num(vals["cl_lag"]).max(axis=1)
                 + np.nan_to_num(vals["wr_wc"]).max(axis=1)
                 + np.nan_to_num(np.abs(vals["td_ratio"] - 1.0)).max(axis=1))
    top = np.argsort(-score, kind="stable")[:limit]
    return sorted(int(r) for r in top)
