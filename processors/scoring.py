"""Score diagnoses and commands against the simulator's ground truth: per fault, was the
right culprit diagnosed, was the right action issued, how long after the fault started
(event time); over the run, isolation precision and recall and false isolations.

Matching rules (docs/simulator.md has the truth format):
- a command matches an expected ``[action, target]`` when the action is equal and the
  target is equal, or, for ``run_netdiag``, the expected NIC is an endpoint of the target
  link (or its host is the target), or, for ``isolate_gpu``, the GPU's host is isolated;
- ``restart_job`` alone never makes a fault detected: it follows the key action;
- an isolation (isolate_host / isolate_gpu) of a host that is no fault's culprit is a
  false isolation.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas.records import Diagnosis, IsolationCommand

ISOLATE = ("isolate_host", "isolate_gpu")
KEY_ACTIONS = (*ISOLATE, "run_netdiag", "run_offline_diag", "rollback_update")


def _host(target: str) -> str:
    return target.split("/", 1)[0]


def _endpoints(link: str) -> list[str]:
    return link.split("<->") if "<->" in link else [link]


def action_matches(expected: Sequence[str], cmd: IsolationCommand) -> bool:
    action, target = expected[0], expected[1]
    if cmd.action != action:
        return action == "isolate_gpu" and cmd.action == "isolate_host" and cmd.target == _host(target)
    if cmd.target == target:
        return True
    if action == "run_netdiag":
        ends = _endpoints(cmd.target)
        return target in ends or _host(target) in ends
    return False


def diagnosis_matches(fault: Mapping[str, Any], d: Diagnosis) -> bool:
    if d.job != fault["job"] or d.kind not in fault.get("expected_kinds", ()):
        return False
    c = fault.get("culprit", {})
    if not (d.culprits.hosts or d.culprits.gpus or d.culprits.links):
        return True  # a job-wide finding (config, systemic): the job and kind are the match
    d_hosts = set(d.culprits.hosts) | {_host(g) for g in d.culprits.gpus}
    d_ends = {e for link in d.culprits.links for e in _endpoints(link)}
    return bool(set(c.get("hosts", ())) & (d_hosts | {_host(e) for e in d_ends})
                or set(c.get("gpus", ())) & set(d.culprits.gpus)
                or set(c.get("nics", ())) & d_ends)


@dataclass
class FaultResult:
    fault: Mapping[str, Any]
    diagnoses: list[Diagnosis] = field(default_factory=list)
    commands: list[IsolationCommand] = field(default_factory=list)
    wrong_isolations: list[IsolationCommand] = field(default_factory=list)
    delay_s: float | None = None

    @property
    def expects_action(self) -> bool:
        return any(a[0] in KEY_ACTIONS for a in self.fault.get("expected_actions", ()))

    @property
    def correct(self) -> bool:
        if self.expects_action:
            return bool(self.commands)
        # no action due: right if nothing was isolated for it, and (when a kind is
        # expected and must be detected) a matching diagnosis exists
        if self.wrong_isolations:
            return False
        must = self.fault.get("must_detect") and self.fault.get("expected_kinds")
        return bool(self.diagnoses) if must else True


@dataclass
class Score:
    results: list[FaultResult]
    commands: list[IsolationCommand]
    precision: float
    recall: float
    false_isolations: int
    median_delay_s: float | None
    unmatched_commands: list[IsolationCommand]
    isolation_precision: float = 1.0  # over isolate_host / isolate_gpu commands only

    def summary(self) -> dict[str, Any]:
        return {"faults": len(self.results),
                "actionable_faults": sum(r.expects_action for r in self.results),
                "correct": sum(r.correct for r in self.results),
                "precision": round(self.precision, 4), "recall": round(self.recall, 4),
                "isolation_precision": round(self.isolation_precision, 4),
                "false_isolations": self.false_isolations,
                "median_delay_s": None if self.median_delay_s is None else round(self.median_delay_s, 2),
                "commands": len(self.commands)}


def score(truth: Iterable[Mapping[str, Any]], diagnoses: Iterable[Diagnosis],
          commands: Iterable[IsolationCommand]) -> Score:
    faults = list(truth)
    diags = list(diagnoses)
    cmds = [c for c in commands if c.action in KEY_ACTIONS]
    results = [FaultResult(f) for f in faults]
    used: set[str] = set()
    culprit_hosts = {h for f in faults for h in f.get("culprit", {}).get("hosts", ())}
    for r in results:
        f = r.fault
        start, end = float(f["start_ts"]), float(f.get("end_ts") or float("inf"))
        r.diagnoses = [d for d in diags if diagnosis_matches(f, d) and d.detected_ts >= start - 1]
        for c in cmds:
            if c.job != f["job"] or c.issued_at < start - 1 or c.issued_at > end + 600:
                continue
            if any(action_matches(a, c) for a in f.get("expected_actions", ()) if a[0] in KEY_ACTIONS):
                r.commands.append(c)
                used.add(c.id)
        if r.commands:
            r.delay_s = min(c.issued_at for c in r.commands) - start
        if not r.expects_action:
            hosts = set(f.get("culprit", {}).get("hosts", ()))
            r.wrong_isolations = [c for c in cmds if c.job == f["job"] and c.action in ISOLATE
                                  and start - 1 <= c.issued_at <= end + 600
                                  and (_host(c.target) in hosts or not hosts)]
    unmatched = [c for c in cmds if c.id not in used]
    false_iso = [c for c in cmds if c.action in ISOLATE and c.id not in used
                 and _host(c.target) not in culprit_hosts]
    false_iso += [c for r in results for c in r.wrong_isolations if c not in false_iso]
    actionable = [r for r in results if r.expects_action]
    recall = sum(bool(r.commands) for r in actionable) / len(actionable) if actionable else 1.0
    precision = (len(cmds) - len(unmatched)) / len(cmds) if cmds else 1.0
    delays = [r.delay_s for r in results if r.delay_s is not None]
    iso = [c for c in cmds if c.action in ISOLATE]
    iso_ok = [c for c in iso if c.id in used]
    return Score(results, cmds, precision, recall, len(false_iso),
                 statistics.median(delays) if delays else None, unmatched,
                 len(iso_ok) / len(iso) if iso else 1.0)
