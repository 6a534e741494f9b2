"""Every record type round-trips producer → real Kafka topic → consumer, decoding equal."""

from __future__ import annotations

import pytest

from schemas import decode, encode
from tests.kafkautil import consume, create_topics, produce
from tests.unit.test_schemas import RECORDS

pytestmark = pytest.mark.integration


def test_every_record_type_round_trips_through_kafka(kafka_bootstrap: str, uid: str) -> None:
    topic = f"roundtrip-{uid}"
    create_topics(kafka_bootstrap, [topic], partitions=1)
    produce(kafka_bootstrap, topic, [(type(r).__name__.encode(), encode(r)) for r in RECORDS])
    msgs = consume(kafka_bootstrap, topic, until=lambda ms: len(ms) >= len(RECORDS), timeout=60)
    assert len(msgs) == len(RECORDS)
    for sent, m in zip(RECORDS, msgs, strict=True):
        assert m.key() == type(sent).__name__.encode()
        assert decode(type(sent), m.value()) == sent
