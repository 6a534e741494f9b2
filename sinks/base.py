"""The sink contract and the guard's refusal value.

Every sink has ``setup()`` / ``add(item)`` / ``flush()`` (practices §9): ``add`` buffers,
``flush`` delivers everything buffered or raises :class:`~schemas.errors.ServiceUnavailable`
with the buffer intact, so the caller commits its input offsets only after a successful
flush (at-least-once; ids make it exactly-once in effect, see docs/sinks.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from schemas.records import DeadLetter, Diagnosis, IsolationCommand

REFUSAL_REASONS = (
    "blast_radius",  # the job's isolation cap in the window is reached (Aegis §6, CBD lesson)
    "cluster_rate_limit",  # the cluster-wide isolation budget for the window is spent
    "config_no_isolation",  # a config diagnosis never isolates hardware (Aegis Alg. 1)
    "follows_refused_isolation",  # restart_job whose diagnosis' isolations were refused
    "repeat",  # the same action on the same target was issued recently
    "already_localised",  # run_offline_diag for a job whose culprit another detector named
    "already_isolated",  # the host (or one of its GPUs) was isolated for this incident
    "explained_by_config",  # a config diagnosis explained the host's failure (its consequence)
    "endpoint_down",  # run_netdiag of a link whose other end is a host shown down
    "peers_down",  # isolating a RootDiag root whose failed connections all end at down hosts
    "unknown_action",  # not one of schemas.records.ACTIONS
    "malformed_action",  # not an [action, target] pair of non-empty strings
)


@dataclass(frozen=True, slots=True)
class GuardRefusal:
    """A recommended action the guard did not turn into a command, and why."""

    diagnosis_id: str
    action: str
    target: str
    reason: str  # one of REFUSAL_REASONS
    job: str = ""
    detail: str = ""
    ts: float = 0.0  # event time of the refused diagnosis (detected_ts)

    def to_wire(self) -> dict[str, Any]:
        return {"diagnosis_id": self.diagnosis_id, "action": self.action, "target": self.target,
                "reason": self.reason, "job": self.job, "detail": self.detail, "ts": self.ts}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> GuardRefusal:
        return cls(str(d["diagnosis_id"]), str(d["action"]), str(d["target"]), str(d["reason"]),
                   str(d.get("job", "")), str(d.get("detail", "")), float(d.get("ts", 0.0)))


SinkItem = Diagnosis | IsolationCommand | GuardRefusal | DeadLetter


@runtime_checkable
class Sink(Protocol):
    """What the worker and the in-process engine write to."""

    def setup(self) -> None:
        """Connect and check the destination; raise ServiceUnavailable if it can't be reached."""

    def add(self, item: SinkItem) -> None:
        """Buffer one output. Never blocks on the network."""

    def flush(self) -> None:
        """Deliver everything buffered, or raise ServiceUnavailable keeping the buffer."""
