"""Prometheus metrics for the worker and the in-process engine.

Each :class:`Metrics` owns its own CollectorRegistry (never the global default), so tests
and several engines in one process don't collide. Families (names as exposed):

    aegis_events_in_total{topic}                    records consumed
    aegis_events_out_total{topic}                   records produced
    aegis_dead_letters_total{topic,reason}          records dead-lettered
    aegis_diagnoses_total{kind}                     diagnoses emitted
    aegis_commands_issued_total{action}             isolation commands issued by the guard
    aegis_commands_refused_total{reason}            recommended actions the guard refused
    aegis_consumer_lag{topic,partition}             high watermark - committed offset
    aegis_processing_latency_seconds                wall time from consume to flush (histogram)
    aegis_sink_retries_total{sink}                  failed flushes retried (sinks.delivery)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from sinks.base import GuardRefusal, SinkItem

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0, 60.0)


class Metrics:
    """The metric families, registered on ``registry`` (a fresh one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None, namespace: str = "aegis") -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r, ns = self.registry, namespace
        self.events_in = Counter("events_in", "Records consumed, by topic", ["topic"],
                                 namespace=ns, registry=r)
        self.events_out = Counter("events_out", "Records produced, by topic", ["topic"],
                                  namespace=ns, registry=r)
        self.dead_letters = Counter("dead_letters", "Records dead-lettered, by topic and reason",
                                    ["topic", "reason"], namespace=ns, registry=r)
        self.diagnoses = Counter("diagnoses", "Diagnoses emitted, by kind", ["kind"],
                                 namespace=ns, registry=r)
        self.commands_issued = Counter("commands_issued", "Isolation commands issued, by action",
                                       ["action"], namespace=ns, registry=r)
        self.commands_refused = Counter("commands_refused",
                                        "Recommended actions refused by the guard, by reason",
                                        ["reason"], namespace=ns, registry=r)
        self.consumer_lag = Gauge("consumer_lag", "Messages behind the high watermark",
                                  ["topic", "partition"], namespace=ns, registry=r)
        self.processing_latency = Histogram(
            "processing_latency_seconds", "Wall time from consuming a record to flushing its "
            "outputs", namespace=ns, registry=r, buckets=LATENCY_BUCKETS)
        self.sink_retries = Counter("sink_retries", "Failed sink flushes that were retried",
                                    ["sink"], namespace=ns, registry=r)

    # -- helpers -----------------------------------------------------------------------------
    def record_in(self, topic: str, n: int = 1) -> None:
        self.events_in.labels(topic=topic).inc(n)

    def record_out(self, topic: str, n: int = 1) -> None:
        self.events_out.labels(topic=topic).inc(n)

    def record_dead_letter(self, topic: str, reason: str) -> None:
        """``reason`` should be a small closed set (decode, version, validation, process...)."""
        self.dead_letters.labels(topic=topic, reason=reason).inc()

    def record_items(self, items: Iterable[SinkItem]) -> None:
        """Count the guard's outputs: diagnoses by kind, commands by action, refusals by reason."""
        from schemas.records import DeadLetter, Diagnosis, IsolationCommand

        for item in items:
            if isinstance(item, Diagnosis):
                self.diagnoses.labels(kind=item.kind).inc()
            elif isinstance(item, IsolationCommand):
                self.commands_issued.labels(action=item.action).inc()
            elif isinstance(item, GuardRefusal):
                self.commands_refused.labels(reason=item.reason).inc()
            elif isinstance(item, DeadLetter):
                self.dead_letters.labels(topic=item.topic, reason=item.stage).inc()

    def set_lag(self, topic: str, partition: int, lag: int) -> None:
        self.consumer_lag.labels(topic=topic, partition=str(partition)).set(max(0, lag))

    def observe_latency(self, seconds: float) -> None:
        self.processing_latency.observe(max(0.0, seconds))

    def exposition(self) -> bytes:
        """The text format, as /metrics serves it."""
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))


class MetricsSink:
    """A sink that only counts what passes through it (put it in a FanoutSink)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def setup(self) -> None:
        return None

    def add(self, item: SinkItem) -> None:
        self.metrics.record_items((item,))

    def flush(self) -> None:
        return None


def start_metrics_server(port: int, addr: str = "127.0.0.1", *,
                         registry: CollectorRegistry | Metrics) -> tuple[Any, int]:
    """Serve ``/metrics`` on ``addr:port`` (0 = a free port) in a daemon thread.

    Returns ``(server, port)``; ``server.shutdown()`` stops it. Binds loopback by default:
    pass ``addr="0.0.0.0"`` deliberately to expose it.
    """
    reg = registry.registry if isinstance(registry, Metrics) else registry
    server, _thread = start_http_server(port, addr=addr, registry=reg)
    return server, int(server.server_port)
