"""Metrics count what passes through, on a private registry."""

from __future__ import annotations

from schemas.records import Culprits, Diagnosis
from sinks.base import GuardRefusal
from sinks.guard import Guard
from sinks.metrics import Metrics


def _value(m: Metrics, name: str, labels: dict[str, str]) -> float:
    v = m.registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


def test_guard_outputs_are_counted_by_label() -> None:
    g, m = Guard(), Metrics()
    for i in range(4):
        d = Diagnosis(id=f"d{i}", job="j", kind="critical_error", culprits=Culprits((f"h{i}",)),
                      evidence={"actions": [["isolate_host", f"h{i}"], ["restart_job", "j"]]},
                      confidence=0.9, event_ts=1.0 + i, detected_ts=2.0 + i, detector="logs")
        m.record_items([d, *g.decide(d).items()])
    assert _value(m, "aegis_diagnoses_total", {"kind": "critical_error"}) == 4
    assert _value(m, "aegis_diagnoses_total", {"kind": "systemic"}) == 1
    assert _value(m, "aegis_commands_issued_total", {"action": "isolate_host"}) == 2
    assert _value(m, "aegis_commands_issued_total", {"action": "rollback_update"}) == 1
    assert _value(m, "aegis_commands_refused_total", {"reason": "blast_radius"}) == 2
    m.record_items([GuardRefusal("x", "a", "t", "repeat")])
    assert _value(m, "aegis_commands_refused_total", {"reason": "repeat"}) == 1


def test_latency_and_lag() -> None:
    m = Metrics()
    m.observe_latency(0.003)
    m.observe_latency(-1)  # clock skew never makes a negative observation
    m.set_lag("aegis.ccl", 2, -5)
    assert _value(m, "aegis_processing_latency_seconds_count", {}) == 2
    assert _value(m, "aegis_consumer_lag", {"topic": "aegis.ccl", "partition": "2"}) == 0
