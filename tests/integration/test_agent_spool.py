"""The agent's publisher against a real broker that goes away: records spool to disk while
it is down and all arrive, in order and once each, after it comes back."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from producers.agent.collector import Notices
from producers.agent.publisher import SpoolingPublisher, kafka_producer
from producers.agent.spool import Spool

pytestmark = pytest.mark.integration

N = 10_000


def make_topic(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)]).values():
        f.result(timeout=30)


def consume_all(bootstrap: str, topic: str, expect: int, timeout: float = 60.0) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for m in c.consume(num_messages=5000, timeout=1.0):
                assert m.error() is None, m.error()
                out.append(m.value() or b"")
            if len(out) >= expect:
                # read a little longer: a duplicate would show up right behind
                for m in c.consume(num_messages=5000, timeout=2.0):
                    out.append(m.value() or b"")
                break
    finally:
        c.close()
    return out


def pump_until(pub: SpoolingPublisher, done: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        pub.pump(0.05)
    assert done(), f"timed out: {pub.status()}"


def outage_round(broker: Any, tmp_path: Path, topic: str, **conf: Any) -> SpoolingPublisher:
    make_topic(broker.bootstrap, topic)
    notices = Notices(lambda _: None)

    def factory() -> Any:
        return kafka_producer(broker.bootstrap, "agent-test", notices, **conf)

    pub = SpoolingPublisher(factory(), Spool(tmp_path / topic), notices=notices, factory=factory,
                            retry_backoff_s=0.5)
    pub.publish(topic, "job", b"warm-up")
    assert pub.flush(30.0), pub.status()
    broker.stop()
    for i in range(N):
        pub.publish(topic, "job", b"seq=%d" % i)
        if i % 1000 == 0:
            pub.pump()
    pump_until(pub, lambda: len(pub.inflight) > 0, 10.0)
    assert pub.spool.pending() == N and pub.delivered == 1  # all of it waits on disk
    if "message.timeout.ms" in conf:  # deliveries time out and go back to the spool
        pump_until(pub, lambda: pub.failures > 0, 30.0)
        assert pub.spool.pending() == N
    broker.start()
    assert pub.flush(120.0), pub.status()
    return pub


def test_outage_spools_then_delivers_in_order_once(private_kafka: Any, tmp_path: Path, uid: str) -> None:
    topic = f"agent-spool-{uid}"
    pub = outage_round(private_kafka, tmp_path, topic)
    got = consume_all(private_kafka.bootstrap, topic, N + 1)
    assert got[0] == b"warm-up"
    seqs = [int(v.split(b"=")[1]) for v in got[1:]]
    assert seqs == list(range(N)), f"{len(seqs)} records, first bad at " \
        f"{next((i for i, s in enumerate(seqs) if s != i), None)}"
    assert pub.dropped == 0 and pub.spool.pending() == 0
    # the second round: a finite message timeout, so librdkafka fails the waiting window
    # and it goes back to the spool before the broker returns
    topic2 = f"agent-spool-timeout-{uid}"
    pub2 = outage_round(private_kafka, tmp_path, topic2, **{"message.timeout.ms": 2000})
    got2 = consume_all(private_kafka.bootstrap, topic2, N + 1)
    seqs2 = [int(v.split(b"=")[1]) for v in got2[1:]]
    assert pub2.failures > 0
    assert sorted(seqs2) == list(range(N))  # none lost, none twice
    assert seqs2 == list(range(N))  # and in order
