"""The CBD contracts: what a check returns, what a check is, and what a batch run reports.

Aegis §6 (CBD): every check runs on every host in parallel, under a time budget. A check on
a host without the hardware it needs says ``not_applicable`` with the reason; it never fakes
a pass. Statuses:

- ``pass``: measured and within limits;
- ``fail``: measured and out of limits (the host is held);
- ``not_applicable``: nothing to measure here (no GPU, no NVML, no path configured);
- ``error``: the check could not finish (timeout, tool crashed). The host is held
  (``hold_on_error``) but not isolated: an unverified host is not a proven bad one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from producers.cbd.config import CbdConfig
    from producers.cbd.targets import HostTarget
    from schemas.records import Diagnosis, IsolationCommand

PASS, FAIL, NOT_APPLICABLE, ERROR = "pass", "fail", "not_applicable", "error"
STATUSES = (PASS, FAIL, NOT_APPLICABLE, ERROR)
STAGES = ("config", "single_host", "multi_host")
DELIVER, HOLD = "deliver", "hold"
# batch verdicts: every host delivered / some held / none deliverable / mass failure
BATCH_VERDICTS = ("deliver", "partial", "hold", "rollback")


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check on one host."""

    check: str
    status: str
    reason: str = ""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check {self.check}: status {self.status!r} not one of {STATUSES}")

    def to_wire(self) -> dict[str, Any]:
        return {"check": self.check, "status": self.status, "reason": self.reason,
                "evidence": dict(self.evidence), "duration_s": round(self.duration_s, 4)}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> CheckResult:
        if not isinstance(d, Mapping) or not isinstance(d.get("check"), str):
            raise ValueError(f"CheckResult: not a result mapping: {d!r:.200}")
        ev = d.get("evidence", {})
        return cls(str(d["check"]), str(d.get("status")), str(d.get("reason", "")),
                   dict(ev) if isinstance(ev, Mapping) else {},
                   float(d.get("duration_s", 0.0)))

    def timed(self, duration_s: float) -> CheckResult:
        return CheckResult(self.check, self.status, self.reason, self.evidence, duration_s)


def na(check: str, reason: str, **evidence: Any) -> CheckResult:
    return CheckResult(check, NOT_APPLICABLE, reason, evidence)


@dataclass
class CheckContext:
    """Everything a check may read besides its own host: the batch's facts and settings.

    ``facts[host]`` is the on-host collector's output (producers.cbd.facts); it is filled
    before any check runs, so configuration checks compare a host with the whole batch.
    """

    batch: str
    hosts: Sequence[str]
    addrs: Mapping[str, str]
    facts: Mapping[str, Mapping[str, Any]]
    config: CbdConfig
    baseline: Mapping[str, float] = field(default_factory=dict)
    progress: Callable[[str], None] = lambda _msg: None
    ports: Mapping[str, int] = field(default_factory=dict)  # host -> probe/collective port
    plan: Any = None  # producers.cbd.planner.Plan: link-disjoint test groups, or None

    def stages(self, hosts: Sequence[str]) -> list[list[list[str]]]:
        """Multi-host test groups per stage (one group of every host without a plan)."""
        if self.plan is None:
            return [[list(hosts)]]
        keep = set(hosts)
        return [[[h for h in g.hosts if h in keep] for g in stage] for stage in self.plan.stages]

    def peers(self, host: str) -> list[str]:
        return [h for h in self.hosts if h != host]


class Check(Protocol):
    """A per-host check. ``compare`` (optional, may return the input) judges a host against
    the batch once every host has a result (batch median, baseline)."""

    name: str
    stage: str
    timeout_s: float
    diagnosis_kind: str  # Diagnosis.kind for a host held by this check

    def run(self, target: HostTarget, ctx: CheckContext) -> CheckResult: ...

    def compare(self, results: Mapping[str, CheckResult], ctx: CheckContext
                ) -> dict[str, CheckResult]: ...


class BatchCheck(Protocol):
    """A multi-host check: runs once over the batch and returns one result per host."""

    name: str
    stage: str
    timeout_s: float
    diagnosis_kind: str

    def run_batch(self, targets: Mapping[str, HostTarget], ctx: CheckContext
                  ) -> dict[str, CheckResult]: ...


@dataclass
class HostVerdict:
    host: str
    verdict: str  # deliver | hold
    reasons: list[str]
    results: dict[str, CheckResult]
    systemic_checks: list[str] = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        return {"host": self.host, "verdict": self.verdict, "reasons": list(self.reasons),
                "systemic_checks": list(self.systemic_checks),
                "results": [r.to_wire() for r in self.results.values()]}


@dataclass
class BatchReport:
    batch: str
    profile: str
    mode: str
    started_ts: float
    wall_s: float
    verdict: str
    hosts: dict[str, HostVerdict]
    systemic: list[dict[str, Any]]
    diagnoses: list[Diagnosis]
    commands: list[IsolationCommand]
    stage_s: dict[str, float] = field(default_factory=dict)
    plan: dict[str, Any] | None = None

    @property
    def held(self) -> list[str]:
        return sorted(h for h, v in self.hosts.items() if v.verdict == HOLD)

    @property
    def delivered(self) -> list[str]:
        return sorted(h for h, v in self.hosts.items() if v.verdict == DELIVER)

    def to_wire(self) -> dict[str, Any]:
        return {"batch": self.batch, "profile": self.profile, "mode": self.mode,
                "started_ts": self.started_ts, "wall_s": round(self.wall_s, 3),
                "verdict": self.verdict, "deliver": self.delivered, "hold": self.held,
                "stage_s": {k: round(v, 3) for k, v in self.stage_s.items()},
                "plan": self.plan,
                "systemic": list(self.systemic),
                "hosts": {h: v.to_wire() for h, v in sorted(self.hosts.items())},
                "diagnoses": [d.to_wire() for d in self.diagnoses],
                "commands": [c.to_wire() for c in self.commands]}
