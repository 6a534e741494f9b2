"""The /metrics endpoint over real HTTP shows every metric family."""

from __future__ import annotations

import urllib.request

import pytest

from schemas.records import Culprits, DeadLetter, Diagnosis, IsolationCommand
from sinks.base import GuardRefusal
from sinks.metrics import Metrics, MetricsSink, start_metrics_server

pytestmark = pytest.mark.integration

FAMILIES = ("aegis_events_in_total", "aegis_events_out_total", "aegis_dead_letters_total",
            "aegis_diagnoses_total", "aegis_commands_issued_total", "aegis_commands_refused_total",
            "aegis_consumer_lag", "aegis_processing_latency_seconds_bucket",
            "aegis_sink_retries_total")


def test_metrics_endpoint_serves_every_family() -> None:
    m = Metrics()
    m.record_in("aegis.telemetry", 5)
    m.record_out("aegis.diagnoses")
    m.record_dead_letter("aegis.logs", "decode")
    sink = MetricsSink(m)
    sink.add(Diagnosis(id="d", job="j", kind="hang_compute", culprits=Culprits(), evidence={},
                       confidence=0.9, event_ts=1, detected_ts=2, detector="ccl"))
    sink.add(IsolationCommand(id="d:isolate_host:h1", job="j", action="isolate_host",
                              target="h1", reason="r", diagnosis_id="d", issued_at=2))
    sink.add(GuardRefusal("d", "isolate_host", "h2", "blast_radius"))
    sink.add(DeadLetter(topic="aegis.ccl", partition=0, offset=1, raw=b"", error="e"))
    m.set_lag("aegis.telemetry", 3, 17)
    m.observe_latency(0.004)
    m.sink_retries.labels(sink="redis").inc()

    server, port = start_metrics_server(0, registry=m)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            assert resp.status == 200
            text = resp.read().decode()
    finally:
        server.shutdown()
    for family in FAMILIES:
        assert family in text, family
    assert 'aegis_events_in_total{topic="aegis.telemetry"} 5.0' in text
    assert 'aegis_commands_refused_total{reason="blast_radius"} 1.0' in text
    assert 'aegis_consumer_lag{partition="3",topic="aegis.telemetry"} 17.0' in text
    assert 'aegis_diagnoses_total{kind="hang_compute"} 1.0' in text
    assert 'aegis_dead_letters_total{reason="decode",topic="aegis.logs"} 1.0' in text


def test_two_metrics_objects_do_not_collide() -> None:
    a, b = Metrics(), Metrics()
    a.record_in("t")
    assert b"aegis_events_in_total{topic=\"t\"}" not in b.exposition()
