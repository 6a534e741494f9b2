"""Kafka sink: Diagnoses and IsolationCommands as JSON (``kcat -C -t aegis.diagnoses | jq``),
keyed by job; dead letters keyed by their source topic (schemas/topics.py).

The producer is idempotent with ``acks=all``, so librdkafka's own retries never duplicate or
reorder within a partition. ``add`` hands records to librdkafka at once (no blocking);
``flush`` waits for every delivery report. A message whose delivery failed (broker down past
``message_timeout_ms``) is produced again at the next flush, and ``flush`` raises
ServiceUnavailable while anything is undelivered, so the caller does not commit its input
offsets (sinks/delivery.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from schemas.codec import encode
from schemas.errors import AegisError, ServiceUnavailable
from schemas.records import DeadLetter, Diagnosis, IsolationCommand
from schemas.topics import COMMANDS, DEADLETTER, DIAGNOSES, Topic
from sinks.base import SinkItem

_Msg = tuple[str, bytes, bytes]  # topic, key, value


class KafkaWriter:
    """Sink for the diagnoses, commands and dead-letter topics."""

    def __init__(self, bootstrap: str, *, diagnoses_topic: str = DIAGNOSES.name,
                 commands_topic: str = COMMANDS.name, deadletter_topic: str = DEADLETTER.name,
                 flush_timeout_s: float = 30.0, message_timeout_ms: int = 120_000,
                 config: Mapping[str, Any] | None = None, producer: Any = None) -> None:
        self.bootstrap = bootstrap
        self.topics = {"diagnoses": diagnoses_topic, "commands": commands_topic,
                       "deadletter": deadletter_topic}
        self.flush_timeout_s = flush_timeout_s
        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 10, "compression.type": "lz4", "client.id": "aegis-sinks",
            "message.timeout.ms": int(message_timeout_ms),
        }
        conf.update(config or {})  # security.protocol, sasl.* ...: never printed
        self._conf = conf
        self._producer = producer
        self._unsent: list[_Msg] = []  # not yet accepted by librdkafka (queue full / failed)
        self._inflight = 0
        self._fatal: str | None = None
        self.delivered = 0
        self.redelivered = 0  # messages produced again after a failed delivery

    def __repr__(self) -> str:
        return f"KafkaWriter({self.bootstrap!r}, topics={self.topics})"

    @property
    def producer(self) -> Any:
        if self._producer is None:
            self._producer = Producer(self._conf)
        return self._producer

    @property
    def pending(self) -> int:
        """Messages not yet confirmed by the broker."""
        return len(self._unsent) + self._inflight

    def setup(self) -> None:
        try:
            self.producer.list_topics(timeout=10)
        except KafkaException as e:
            raise ServiceUnavailable(f"kafka {self.bootstrap}: setup: unreachable: {e}") from e

    def _message(self, item: SinkItem) -> _Msg | None:
        if isinstance(item, Diagnosis):
            return self.topics["diagnoses"], item.job.encode(), encode(item)
        if isinstance(item, IsolationCommand):
            return self.topics["commands"], item.job.encode(), encode(item)
        if isinstance(item, DeadLetter):
            return self.topics["deadletter"], item.topic.encode(), encode(item)
        return None  # guard refusals are not a wire record; metrics and JSONL keep them

    def add(self, item: SinkItem) -> None:
        msg = self._message(item)
        if msg is not None:
            self._produce(msg)
            self.producer.poll(0)

    def add_dead_letter(self, dead: DeadLetter) -> None:
        self.add(dead)

    def _produce(self, msg: _Msg) -> bool:
        topic, key, value = msg

        def on_delivery(err: KafkaError | None, _m: Any) -> None:
            self._inflight -= 1
            if err is None:
                self.delivered += 1
            elif err.fatal():
                self._fatal = str(err)
                self._unsent.append(msg)
            else:
                self._unsent.append(msg)

        try:
            self.producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
        except BufferError:
            self._unsent.append(msg)
            return False
        except KafkaException as e:
            raise ServiceUnavailable(f"kafka {self.bootstrap}: produce to {topic}: {e}") from e
        self._inflight += 1
        return True

    def flush(self) -> None:
        """Wait for every delivery; re-send failed ones; raise if any is still undelivered."""
        if self._fatal:
            raise AegisError(f"kafka {self.bootstrap}: producer failed fatally ({self._fatal}); "
                             "restart the worker (uncommitted input will be replayed)")
        retry, self._unsent = self._unsent, []
        for i, msg in enumerate(retry):
            if not self._produce(msg):
                self.producer.poll(0.1)
                self._unsent.extend(retry[i + 1:])
                break
            self.redelivered += 1
        remaining = self.producer.flush(self.flush_timeout_s)
        if remaining or self._unsent:
            raise ServiceUnavailable(
                f"kafka {self.bootstrap}: {remaining} message(s) still in flight and "
                f"{len(self._unsent)} failed after {self.flush_timeout_s:g}s; kept for retry")

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self.flush_timeout_s)
            self._producer = None


def create_topics(bootstrap: str, topics: Iterable[Topic], *, replication: int = 1,
                  config: Mapping[str, Any] | None = None, timeout_s: float = 30.0) -> list[str]:
    """Create catalogue topics that don't exist yet (partitions, retention, compaction)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, **(config or {})})
    new = [NewTopic(t.name, num_partitions=t.partitions, replication_factor=replication,
                    config={"retention.ms": str(t.retention_ms),
                            "cleanup.policy": "compact" if t.compacted else "delete"})
           for t in topics]
    created: list[str] = []
    for name, fut in admin.create_topics(new, request_timeout=timeout_s).items():
        try:
            fut.result(timeout=timeout_s)
            created.append(name)
        except KafkaException as e:
            if e.args and e.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise ServiceUnavailable(f"kafka {bootstrap}: create topic {name}: {e}") from e
    return created
