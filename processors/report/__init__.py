"""The postmortem report: ONE self-contained HTML file (inline CSS and SVG, works offline).

Contents (docs/replay.md): the job's timeline (ground-truth faults, diagnoses, commands,
guard refusals); per Z-score diagnosis the flagged metrics against λ and λ±2δ with the
persistence window shaded (Aegis §5.1); per communicator ranks × time heatmaps of CL lag,
WR − WC and TD (Aegis §4.2, §5.2); per Phase-1 diagnosis the decision-tree path and its log
lines (Algorithm 1); the degradation measure per job (Aegis §5); the what-if diff.

    write_report("job.html", ReportInput(path="job.aegis", items=outputs, job="job-007"))
"""

from __future__ import annotations

import os

from processors.report.build import ReportInput, build_report


def write_report(path: str, inp: ReportInput) -> None:
    """Build the report and write it atomically to ``path``."""
    text = build_report(inp)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


__all__ = ["ReportInput", "build_report", "write_report"]
