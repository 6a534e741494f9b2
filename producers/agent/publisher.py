"""Publish through the spool: append every record to the on-disk FIFO, feed Kafka from its
head (at most ``window`` records in flight), acknowledge the spool as deliveries come back.

* The producer is idempotent (``enable.idempotence=true``, ``acks=all``), lz4-compressed
  and lingers 50 ms to batch, so librdkafka's own retries never duplicate or reorder.
* While the broker is unreachable the window fills and stops; later records wait on disk.
  When it returns, librdkafka delivers the window in order, then the backlog drains in
  order, then new records: the spool is one queue.
* ``message.timeout.ms`` defaults to 0 (never): during an outage the window simply waits
  in librdkafka, which keeps per-partition order and never duplicates. A finite timeout
  is allowed, but librdkafka can then deliver a later record of a partition after an
  earlier one timed out (its documented "gap"), and resending the earlier one reorders
  them; with 0 that cannot happen, and nothing is lost since the spool still holds every
  unacknowledged record.
* A delivery failure (a finite ``message.timeout.ms`` expired, or any retriable error)
  sends that record back to the spool: feeding pauses until nothing is in flight, then
  reading rewinds to the first unacknowledged record; records already delivered are
  skipped. A fatal producer error (idempotence state lost) replaces the producer and
  resends everything unacknowledged (duplicates possible only in that case).
  Non-retriable errors (record too large, invalid, no authorisation) are counted as
  dropped and reported; a missing topic is retried (it may be created later).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol

from producers.agent.collector import Notices
from producers.agent.spool import Spool


class ProducerLike(Protocol):
    def produce(self, topic: str, value: bytes | None = ..., key: bytes | None = ...,
                on_delivery: Callable[[Any, Any], None] | None = ...) -> None: ...

    def poll(self, timeout: float = ...) -> int: ...

    def flush(self, timeout: float = ...) -> int: ...

    def __len__(self) -> int: ...


class NullProducer:
    """Delivers everything at the next poll and keeps nothing (benchmarks, --sink null)."""

    def __init__(self) -> None:
        self._pending: list[Callable[[Any, Any], None]] = []
        self.produced = 0
        self.bytes = 0

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                on_delivery: Callable[[Any, Any], None] | None = None) -> None:
        self.produced += 1
        self.bytes += len(value or b"")
        if on_delivery is not None:
            self._pending.append(on_delivery)

    def poll(self, timeout: float = 0.0) -> int:
        done, self._pending = self._pending, []
        for cb in done:
            cb(None, None)
        return len(done)

    def flush(self, timeout: float = 0.0) -> int:
        self.poll()
        return 0

    def __len__(self) -> int:
        return len(self._pending)


def kafka_config(brokers: str, client_id: str, **overrides: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": brokers,
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        "compression.type": "lz4",
        "linger.ms": 50,
        "message.timeout.ms": 0,  # never: the spool, not librdkafka, decides what is lost
        "queue.buffering.max.messages": 100_000,
        "reconnect.backoff.ms": 100,
        "reconnect.backoff.max.ms": 2_000,
        "socket.keepalive.enable": True,
        # connection failures arrive once through error_cb as a notice; librdkafka's own
        # per-retry log lines would flood the agent's stderr during an outage
        "log_level": 2,
    }
    conf.update(overrides)
    return conf


def kafka_producer(brokers: str, client_id: str, notices: Notices | None = None,
                   **overrides: Any) -> ProducerLike:
    from confluent_kafka import Producer

    board = notices or Notices()

    def on_error(err: Any) -> None:
        board.once("kafka:error", f"Kafka: {err.str() if hasattr(err, 'str') else err}; "
                   "records are spooled until it is reachable")

    return Producer(kafka_config(brokers, client_id, error_cb=on_error, **overrides))  # type: ignore[return-value]


def _retriable(err: Any) -> bool:
    try:
        from confluent_kafka import KafkaError
    except ImportError:  # pragma: no cover - confluent-kafka is a dependency
        return True
    permanent = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG,
                 KafkaError.TOPIC_AUTHORIZATION_FAILED,
                 KafkaError._INVALID_ARG}
    code = err.code() if hasattr(err, "code") else None
    if code in (KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT):
        return True
    if code in permanent:
        return False
    return bool(err.retriable()) if hasattr(err, "retriable") else True


def _fatal(err: Any) -> bool:
    try:
        return bool(err.fatal())
    except Exception:
        return False


class SpoolingPublisher:
    def __init__(self, producer: ProducerLike, spool: Spool, window: int = 2000,
                 notices: Notices | None = None, retry_backoff_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic,
                 factory: Callable[[], ProducerLike] | None = None) -> None:
        self.producer = producer
        self.factory = factory
        self.fatal = False
        self.spool = spool
        self.window = window
        self.notices = notices or Notices()
        self.retry_backoff_s = retry_backoff_s
        self.clock = clock
        self.inflight: dict[int, float] = {}  # seq -> when produced
        self.done: set[int] = set()  # delivered, above the acknowledged prefix
        self.next_ack = spool.acked
        self.rewind_pending = False
        self.resume_at = 0.0
        self.delivered = 0
        self.failures = 0
        self.rejected = 0  # non-retriable delivery errors, dropped
        self.last_tick = 0.0

    def publish(self, topic: str, key: str | bytes | None, value: bytes) -> bool:
        """Spool one record for delivery; False if the spool refused it (policy newest)."""
        k = key.encode() if isinstance(key, str) else key
        return self.spool.append(topic, k, value) is not None

    def _callback(self, seq: int) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, msg: Any) -> None:
            self.inflight.pop(seq, None)
            if err is None:
                self.done.add(seq)
                self.delivered += 1
                self.notices.clear("kafka:error", "Kafka reachable again; draining the spool")
                self.notices.clear("kafka:failed")
            elif _fatal(err) or _retriable(err):
                self.fatal = self.fatal or _fatal(err)
                self.failures += 1
                self.rewind_pending = True
                self.notices.once("kafka:failed", f"Kafka delivery failed ({err}); "
                                  "records go back to the spool")
            else:
                self.rejected += 1
                self.done.add(seq)
                self.notices.once(f"kafka:rejected:{err}", f"Kafka rejected a record for good "
                                  f"({err}); dropped and counted")
        return on_delivery

    def _settle(self) -> None:
        if self.spool.acked > self.next_ack:  # the spool dropped its oldest records
            self.next_ack = self.spool.acked
            self.done = {s for s in self.done if s >= self.next_ack}
        while self.next_ack in self.done:
            self.done.discard(self.next_ack)
            self.next_ack += 1
        self.spool.ack_until(self.next_ack)

    def _feed(self) -> None:
        while len(self.inflight) < self.window:
            entries = self.spool.read(min(500, self.window - len(self.inflight)))
            if not entries:
                return
            for e in entries:
                if e.seq in self.done:
                    continue
                try:
                    self.producer.produce(e.topic, e.value, e.key, on_delivery=self._callback(e.seq))
                except BufferError:  # librdkafka's queue is full: try again later
                    self.spool.rewind(e.seq)
                    return
                except Exception as ex:  # e.g. message larger than message.max.bytes
                    self.rejected += 1
                    self.done.add(e.seq)
                    self.notices.once(f"kafka:produce:{type(ex).__name__}",
                                      f"Kafka refused a record ({ex}); dropped and counted")
                    continue
                self.inflight[e.seq] = self.clock()

    def _replace_producer(self) -> None:
        self.notices.once("kafka:fatal", "Kafka producer hit a fatal error; starting a new one "
                          "and resending everything unacknowledged")
        self.notices.clear("kafka:fatal")
        assert self.factory is not None
        self.producer = self.factory()
        self.inflight.clear()
        self.fatal = False
        self.rewind_pending = True

    def pump(self, timeout: float = 0.0) -> None:
        """Serve delivery reports, acknowledge, rewind after failures, feed the window."""
        self.producer.poll(timeout)
        if self.fatal and self.factory is not None:
            self._replace_producer()
        self._settle()
        now = self.clock()
        if self.rewind_pending and not self.inflight:
            self.spool.rewind(self.next_ack)
            self.rewind_pending = False
            self.resume_at = now + self.retry_backoff_s
        if not self.rewind_pending and now >= self.resume_at:
            self._feed()
        if now - self.last_tick >= 1.0:
            self.spool.tick()
            self.last_tick = now

    def flush(self, timeout: float) -> bool:
        """Try to deliver everything spooled within ``timeout`` s; True when all went."""
        deadline = self.clock() + timeout
        while self.spool.pending() and self.clock() < deadline:
            self.pump(min(0.1, max(0.0, deadline - self.clock())))
        return self.spool.pending() == 0

    def close(self, timeout: float = 5.0) -> bool:
        """Flush for up to ``timeout`` s, then drop librdkafka's copies: whatever was not
        acknowledged stays in the spool for the next start."""
        ok = self.flush(timeout)
        purge = getattr(self.producer, "purge", None)
        if callable(purge):
            with contextlib.suppress(Exception):  # shutting down; the spool holds it all
                purge()
        self.spool.close()
        return ok

    @property
    def dropped(self) -> int:
        return self.spool.dropped + self.rejected

    def status(self) -> dict[str, Any]:
        oldest = min(self.inflight.values(), default=None)
        return {"spooled": self.spool.pending(), "spool_bytes": self.spool.total_bytes,
                "in_flight": len(self.inflight), "delivered": self.delivered,
                "failures": self.failures, "dropped": self.dropped,
                "dropped_spool_full": self.spool.dropped, "rejected": self.rejected,
                "oldest_in_flight_s": round(self.clock() - oldest, 1) if oldest else 0.0,
                "spool_policy": self.spool.policy}
