"""Run the simulator into real Kafka topics (with a test prefix) and read results back."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import orjson
import redis

from producers.sim.kafka_out import KafkaSimSink
from producers.sim.simulation import SimConfig, Simulation
from schemas import Diagnosis, IsolationCommand, decode
from sinks.redis_queue import stream_key
from tests.kafkautil import consume


def publish_sim(bootstrap: str, prefix: str, config: SimConfig,
                topics: Iterable[str] | None = None) -> Simulation:
    """Simulate ``config`` and produce its records to ``prefix + topic``; returns the sim."""
    sim = Simulation(config)
    sink = KafkaSimSink(bootstrap, prefix)
    keep = set(topics) if topics is not None else None
    for topic, key, ts, value in sim.iter_encoded():
        if keep is None or topic in keep:
            sink.emit_encoded(topic, key, ts, value)
    sink.flush()
    return sim


def read_diagnoses(bootstrap: str, topic: str, until: Any = None, timeout: float = 60) -> list[Diagnosis]:
    msgs = consume(bootstrap, topic, timeout=timeout,
                   until=(lambda ms: until([decode(Diagnosis, m.value()) for m in ms])) if until else None)
    out = [decode(Diagnosis, m.value()) for m in msgs]
    assert all(isinstance(d, Diagnosis) for d in out)
    return out  # type: ignore[return-value]


def topic_end(bootstrap: str, topic: str) -> int:
    """Records in ``topic``: the sum of its partitions' high watermarks (no compaction)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"end-{time.time_ns()}"})
    try:
        meta = c.list_topics(topic, timeout=10).topics[topic]
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for p in meta.partitions)
    finally:
        c.close()


def redis_commands(redis_url: str, cluster: str) -> list[IsolationCommand]:
    r = redis.Redis.from_url(redis_url)
    out = []
    for _id, fields in r.xrange(stream_key(cluster)):
        raw = fields.get(b"cmd")
        cmd = decode(IsolationCommand, raw)
        assert isinstance(cmd, IsolationCommand), raw
        out.append(cmd)
    return out


def wait_for(fn: Any, timeout: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last={last!r}")


def as_json(items: Iterable[Any]) -> list[dict]:
    return [orjson.loads(orjson.dumps(i.to_wire())) for i in items]
