"""The Kafka writer on a real broker: JSON that decodes to exactly what was sent, keyed by job."""

from __future__ import annotations

import base64
import uuid

import orjson
import pytest
from confluent_kafka import Consumer

from schemas.errors import ServiceUnavailable
from schemas.records import Culprits, DeadLetter, Diagnosis, IsolationCommand
from schemas.topics import Topic
from sinks.base import GuardRefusal
from sinks.kafka_writer import KafkaWriter, create_topics

pytestmark = pytest.mark.integration


def _topics(uid: str) -> dict[str, str]:
    return {k: f"test.{k}.{uid}" for k in ("diagnoses", "commands", "deadletter")}


def _read(bootstrap: str, topic: str, n: int) -> list[tuple[bytes, bytes]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    got: list[tuple[bytes, bytes]] = []
    try:
        for _ in range(120):
            if len(got) >= n:
                break
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append((m.key() or b"", m.value() or b""))
    finally:
        c.close()
    return got


def test_writer_json_round_trips_on_the_broker(kafka_bootstrap: str, uid: str) -> None:
    names = _topics(uid)
    create_topics(kafka_bootstrap, [Topic(n, "x", "json", "job", 2, 3_600_000)
                                    for n in names.values()])
    d = Diagnosis(id="abc123", job=f"job-{uid}", kind="critical_error",
                  culprits=Culprits(("h0017",), ("h0017/gpu3",)),
                  evidence={"rule": "xid79", "actions": [["isolate_host", "h0017"]],
                            "lines": ["NVRM: Xid 79 ünïcode"], "value": 1.5},
                  confidence=0.95, event_ts=1700000000.123, detected_ts=1700000001.5,
                  detector="logs", summary="GPU fell off the bus")
    c = IsolationCommand(id=IsolationCommand.make_id(d.id, "isolate_host", "h0017"), job=d.job,
                         action="isolate_host", target="h0017", reason="critical_error",
                         diagnosis_id=d.id, issued_at=d.detected_ts)
    dl = DeadLetter(topic="aegis.telemetry", partition=3, offset=42, raw=b"\xff\x00bad",
                    error="DecodeError: not msgpack", extra={"key": "j1"})
    w = KafkaWriter(kafka_bootstrap, diagnoses_topic=names["diagnoses"],
                    commands_topic=names["commands"], deadletter_topic=names["deadletter"])
    w.setup()
    w.add(d)
    w.add(c)
    w.add(GuardRefusal(d.id, "isolate_host", "h9", "blast_radius"))  # not a wire record: skipped
    w.add_dead_letter(dl)
    w.flush()
    assert w.pending == 0 and w.delivered == 3

    ((dk, dv),) = _read(kafka_bootstrap, names["diagnoses"], 1)
    ((ck, cv),) = _read(kafka_bootstrap, names["commands"], 1)
    ((lk, lv),) = _read(kafka_bootstrap, names["deadletter"], 1)
    assert dk == d.job.encode() and ck == d.job.encode() and lk == b"aegis.telemetry"
    assert orjson.loads(dv) == d.to_wire()
    assert Diagnosis.from_wire(orjson.loads(dv)) == d
    assert IsolationCommand.from_wire(orjson.loads(cv)) == c
    assert base64.b64decode(orjson.loads(lv)["raw_b64"]) == dl.raw
    assert DeadLetter.from_wire(orjson.loads(lv)) == dl


def test_flush_raises_and_keeps_messages_when_the_broker_is_down(uid: str) -> None:
    from localservices import free_port  # scripts/, put on sys.path by conftest

    w = KafkaWriter(f"127.0.0.1:{free_port()}", flush_timeout_s=1.0, message_timeout_ms=500,
                    diagnoses_topic=f"t.{uid}")
    w.add(Diagnosis(id="x", job="j", kind="outlier", culprits=Culprits(), evidence={},
                    confidence=0.5, event_ts=1, detected_ts=2, detector="t"))
    with pytest.raises(ServiceUnavailable):
        w.flush()
    assert w.pending == 1  # kept for the next flush, not dropped
    with pytest.raises(ServiceUnavailable):
        w.flush()
    assert w.pending == 1 and w.redelivered == 1
