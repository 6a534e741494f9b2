"""The Kafka implementation of :class:`producers.cbd.agents.Bus` (confluent-kafka).

One producer; one consumer per (topic, group), created on first poll, reading from the end
of the topic (a coordinator or agent never replays old requests). Values are JSON bytes;
keys are UTF-8 (host on the command topic, batch on the results topic).
"""

from __future__ import annotations

import time
from typing import Any

from schemas.errors import ServiceUnavailable


class KafkaBus:
    def __init__(self, bootstrap: str, client_id: str = "aegis-cbd") -> None:
        from confluent_kafka import Producer

        self.bootstrap = bootstrap
        self.producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id,
                                  "acks": "all", "linger.ms": 5, "log_level": 2})
        self.consumers: dict[tuple[str, str], Any] = {}

    def publish(self, topic: str, key: str, value: bytes) -> None:
        self.producer.produce(topic, value=value, key=key.encode())
        if self.producer.flush(15) > 0:
            raise ServiceUnavailable(f"Kafka at {self.bootstrap}: {topic} not acknowledged "
                                     "within 15s")

    def _consumer(self, topic: str, group: str) -> Any:
        from confluent_kafka import Consumer

        c = self.consumers.get((topic, group))
        if c is None:
            c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": group,
                          "auto.offset.reset": "latest", "enable.auto.commit": True,
                          "log_level": 2})
            c.subscribe([topic])
            end = time.monotonic() + 15
            while not c.assignment() and time.monotonic() < end:
                c.poll(0.2)  # join the group before anything we wait for is produced
            self.consumers[(topic, group)] = c
        return c

    def poll(self, topic: str, group: str, timeout_s: float) -> list[tuple[str, bytes]]:
        c = self._consumer(topic, group)
        out = []
        for m in c.consume(num_messages=500, timeout=max(0.0, timeout_s)):
            if m.error() is None and m.value() is not None:
                out.append(((m.key() or b"").decode(errors="replace"), m.value()))
        return out

    def close(self) -> None:
        for c in self.consumers.values():
            c.close()
        self.producer.flush(5)
