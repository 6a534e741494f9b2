"""Verdicts, the mass-failure rule, and the Diagnoses and commands a CBD run emits. Pure.

Aegis §6 (CBD): "if many hosts fail at once, roll back the recent update instead of
isolating them all". Rules:

- a check is *systemic* when the hosts it fails on are at least ``mass_share`` of the hosts
  it could judge (pass or fail; not_applicable and error do not count) and at least
  ``mass_min_hosts`` of them;
- a host is ``hold`` when any check fails (or errors, with ``hold_on_error``), else
  ``deliver``;
- ONE ``systemic`` Diagnosis and ONE ``rollback_update`` command (target: the batch) cover
  every systemic check; failures of systemic checks never isolate a host;
- a host held for a non-systemic failure gets one Diagnosis and one ``isolate_host``
  command; a host held only for errors gets neither (an unverified host is not proven
  bad: re-run CBD);
- batch verdict: ``rollback`` (a systemic finding), else ``deliver`` (nobody held),
  ``hold`` (everybody held) or ``partial``.

Ids are stable (processors.core.base.make_diagnosis over batch, kind, rule, culprits and
the run's start time), so re-publishing a report never issues a command twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from processors.core.base import make_diagnosis
from producers.cbd.config import CbdConfig
from producers.cbd.model import (
    DELIVER,
    ERROR,
    FAIL,
    HOLD,
    PASS,
    BatchReport,
    CheckResult,
    HostVerdict,
)
from schemas.records import Diagnosis, IsolationCommand

DETECTOR = "cbd"
_KIND_RANK = ("critical_error", "slow_network", "slow_compute", "config")


def systemic_checks(results: Mapping[str, Mapping[str, CheckResult]], cfg: CbdConfig
                    ) -> list[dict[str, Any]]:
    by_check: dict[str, dict[str, CheckResult]] = {}
    for host, rs in results.items():
        for name, r in rs.items():
            by_check.setdefault(name, {})[host] = r
    out = []
    for name, rs in sorted(by_check.items()):
        judged = [h for h, r in rs.items() if r.status in (PASS, FAIL)]
        failing = sorted(h for h, r in rs.items() if r.status == FAIL)
        if not judged or len(failing) < cfg.mass_min_hosts:
            continue
        share = len(failing) / len(judged)
        if share >= cfg.mass_share:
            reasons = sorted({rs[h].reason for h in failing})
            out.append({"check": name, "failing": failing, "judged": len(judged),
                        "share": round(share, 4), "threshold": cfg.mass_share,
                        "reasons": reasons[:5]})
    return out


def _command(d: Diagnosis, action: str, target: str) -> IsolationCommand:
    reason = f"{d.kind} by {d.detector} ({d.evidence.get('rule', '')}): {d.summary}"
    return IsolationCommand(id=IsolationCommand.make_id(d.id, action, target), job=d.job,
                            action=action, target=target, reason=reason[:4096],
                            diagnosis_id=d.id, issued_at=d.detected_ts)


def decide(batch: str, results: Mapping[str, Mapping[str, CheckResult]],
           kinds: Mapping[str, str], cfg: CbdConfig, started_ts: float, finished_ts: float,
           *, profile: str = "", mode: str = "direct", wall_s: float = 0.0,
           stage_s: Mapping[str, float] | None = None, hosts: Sequence[str] | None = None
           ) -> BatchReport:
    """``results[host][check]``; ``kinds[check]`` = Diagnosis kind of a host it holds."""
    systemic = systemic_checks(results, cfg)
    sys_names = {s["check"] for s in systemic}
    verdicts: dict[str, HostVerdict] = {}
    diagnoses: list[Diagnosis] = []
    commands: list[IsolationCommand] = []
    for host in hosts or sorted(results):
        rs = dict(results.get(host, {}))
        fails = [r for r in rs.values() if r.status == FAIL]
        errors = [r for r in rs.values() if r.status == ERROR]
        own = [r for r in fails if r.check not in sys_names]
        reasons = [f"{r.check}: {r.reason}" + (" [systemic]" if r.check in sys_names else "")
                   for r in fails]
        reasons += [f"{r.check}: error: {r.reason}" for r in errors] if cfg.hold_on_error else []
        held = bool(fails) or (bool(errors) and cfg.hold_on_error)
        verdicts[host] = HostVerdict(host, HOLD if held else DELIVER, reasons, rs,
                                     sorted(r.check for r in fails if r.check in sys_names))
        if own:
            kind = min((kinds.get(r.check, "config") for r in own),
                       key=lambda k: _KIND_RANK.index(k) if k in _KIND_RANK else 99)
            d = make_diagnosis(
                job=batch, kind=kind, detector=DETECTOR, rule="cbd_hold",
                event_ts=started_ts, detected_ts=finished_ts, hosts=[host],
                evidence={"checks": {r.check: {"status": r.status, "reason": r.reason}
                                     for r in own},
                          "actions": [["isolate_host", host]], "stage": "cbd"},
                confidence=0.9,
                summary=f"CBD holds {host}: " + "; ".join(f"{r.check}: {r.reason}"
                                                         for r in own)[:900])
            diagnoses.append(d)
            commands.append(_command(d, "isolate_host", host))
    if systemic:
        failing = sorted({h for s in systemic for h in s["failing"]})
        names = ", ".join(s["check"] for s in systemic)
        d = make_diagnosis(
            job=batch, kind="systemic", detector=DETECTOR, rule="cbd_mass_failure",
            event_ts=started_ts, detected_ts=finished_ts, hosts=failing,
            evidence={"systemic": systemic, "mass_share": cfg.mass_share,
                      "actions": [["rollback_update", batch]]},
            confidence=0.8,
            summary=(f"{names} failing on {len(failing)} host(s) of batch {batch} "
                     f"(share >= {cfg.mass_share:g}): roll back the recent update instead of "
                     "isolating them (Aegis §6 CBD)"))
        diagnoses.append(d)
        commands.append(_command(d, "rollback_update", batch))
    held_hosts = [h for h, v in verdicts.items() if v.verdict == HOLD]
    if systemic:
        verdict = "rollback"
    elif not held_hosts:
        verdict = "deliver"
    elif len(held_hosts) == len(verdicts):
        verdict = "hold"
    else:
        verdict = "partial"
    return BatchReport(batch=batch, profile=profile, mode=mode, started_ts=started_ts,
                       wall_s=wall_s, verdict=verdict, hosts=verdicts, systemic=systemic,
                       diagnoses=diagnoses, commands=commands, stage_s=dict(stage_s or {}))
