"""Human-readable CBD reports and baselines written from a healthy run."""

from __future__ import annotations

import statistics
from typing import Any

from producers.cbd.model import BatchReport


def render_text(report: BatchReport) -> str:
    lines = [f"CBD {report.profile} ({report.mode}) batch {report.batch}: {report.verdict.upper()}"
             f" - deliver {len(report.delivered)}, hold {len(report.held)}, "
             f"{report.wall_s:.1f}s"]
    width = max((len(h) for h in report.hosts), default=4)
    for h, v in sorted(report.hosts.items()):
        counts: dict[str, int] = {}
        for r in v.results.values():
            counts[r.status] = counts.get(r.status, 0) + 1
        summary = " ".join(f"{k}={n}" for k, n in sorted(counts.items()))
        lines.append(f"  {h.ljust(width)}  {v.verdict:<7}  {summary}")
        lines += [f"  {'':{width}}    - {r}" for r in v.reasons]
    for s in report.systemic:
        lines.append(f"  systemic: {s['check']} failing on {len(s['failing'])}/{s['judged']} "
                     f"hosts (share {s['share']:.2f} >= {s['threshold']:g})")
    for c in report.commands:
        lines.append(f"  command: {c.action} {c.target}  (id {c.id})")
    if report.stage_s:
        lines.append("  stages: " + ", ".join(f"{k} {v:.1f}s" for k, v in report.stage_s.items()))
    return "\n".join(lines)


def _median(values: list[float]) -> float | None:
    vals = [v for v in values if v and v > 0]
    return round(statistics.median(vals), 4) if vals else None


def baseline_from_report(report: BatchReport) -> dict[str, float]:
    """Batch medians of every measured metric, for ``--baseline`` on later runs."""
    ev: dict[str, list[dict[str, Any]]] = {}
    for v in report.hosts.values():
        for r in v.results.values():
            if r.status == "pass":
                ev.setdefault(r.check, []).append(dict(r.evidence))
    values: dict[str, list[float]] = {}

    def add(key: str, x: Any) -> None:
        if isinstance(x, int | float):
            values.setdefault(key, []).append(float(x))

    for e in ev.get("cpu_matmul", []):
        add("cpu_gflops", e.get("gflops"))
    for e in ev.get("memory_bandwidth", []):
        add("mem_copy_gbps", e.get("copy_gbps"))
    for e in ev.get("read_speed", []):
        add("read_mbps", e.get("mbps"))
    for e in ev.get("gpu_bench", []):
        for g in e.get("gpus", []):
            for m, key in (("tflops", "gpu_tflops"), ("hbm_gbps", "gpu_hbm_gbps"),
                           ("pcie_gbps", "gpu_pcie_gbps"), ("nvlink_gbps", "gpu_nvlink_gbps")):
                add(key, g.get(m))
    for e in ev.get("probe_mesh", []):
        for link in e.get("links", {}).values():
            for x in link.get("gbps", {}).values():
                add("link_gbps", x)
    for e in ev.get("collective", []):
        add("busbw_gbps", e.get("busbw_gbps"))
    out: dict[str, float] = {}
    for key, vals in sorted(values.items()):
        med = _median(vals)
        if med is not None:
            out[key] = med
    return out
