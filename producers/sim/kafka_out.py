"""Publish simulator output to Kafka (``aegis simulate --out kafka``): the simulator's sink
with the same ``emit_encoded`` signature as the recording writer, keyed by job."""

from __future__ import annotations

import sys
from typing import Any

from schemas.errors import ServiceUnavailable


class KafkaSimSink:
    """confluent-kafka producer: idempotent, lz4, batched; ``flush`` waits for delivery."""

    def __init__(self, bootstrap: str, topic_prefix: str = "", config: dict[str, Any] | None = None
                 ) -> None:
        from confluent_kafka import Producer

        self.prefix = topic_prefix
        self.errors: list[str] = []
        self.sent = 0
        self._producer = Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "compression.type": "lz4", "linger.ms": 20, "batch.size": 1 << 20,
            "queue.buffering.max.messages": 500_000, "queue.buffering.max.kbytes": 1 << 20,
            **(config or {})})

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))

    def emit_encoded(self, topic: str, key: str, ts: float, value: bytes) -> None:
        while True:
            try:
                self._producer.produce(self.prefix + topic, value=value, key=key.encode(),
                                       timestamp=int(ts * 1000), on_delivery=self._delivered)
                break
            except BufferError:
                self._producer.poll(0.05)
        self.sent += 1
        if self.sent % 1000 == 0:
            self._producer.poll(0)

    def emit_encoded_batch(self, batch: list[tuple[str, str, float, bytes]]) -> None:
        for topic, key, ts, value in batch:
            self.emit_encoded(topic, key, ts, value)

    def flush(self, timeout: float = 120.0) -> None:
        left = self._producer.flush(timeout)
        if left or self.errors:
            raise ServiceUnavailable(f"Kafka: {left} messages undelivered, "
                                     f"{len(self.errors)} delivery errors (first: {self.errors[:1]})")


def make_kafka_sink(bootstrap: str, topic_prefix: str = "") -> KafkaSimSink:
    try:
        return KafkaSimSink(bootstrap, topic_prefix)
    except Exception as e:  # librdkafka config errors
        print(f"aegis simulate: cannot create a Kafka producer for {bootstrap}: {e}", file=sys.stderr)
        raise
