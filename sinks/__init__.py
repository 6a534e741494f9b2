"""aegis-stream: sinks. Where diagnoses become decisions and leave the pipeline.

    base.py            Sink protocol (setup/add/flush), GuardRefusal, SinkItem
    guard.py           Guard: Diagnosis -> IsolationCommands / refusals / systemic diagnosis
    memory.py          MemorySink (in-process engine, tests)
    jsonl.py           JsonlSink (aegis diagnose), read_jsonl
    delivery.py        RetryPolicy, retry_call, RetryingSink, FanoutSink
    redis_queue.py     RedisCommandQueue (Redis Streams isolation queue), RedisOptions
    redis_consumer.py  CommandConsumer (XREADGROUP / XACK / XAUTOCLAIM)
    kafka_writer.py    KafkaWriter (diagnoses, commands, dead letters as JSON)
    metrics.py         Metrics (own registry), MetricsSink, start_metrics_server
    remediate.py       `aegis remediate`, the reference remediation consumer

Only the pure modules are imported here; the Redis, Kafka and Prometheus ones are imported
where they are used, so the in-process engine needs none of those clients.
"""

from sinks.base import GuardRefusal, Sink, SinkItem
from sinks.delivery import FanoutSink, RetryingSink, RetryPolicy, retry_call
from sinks.guard import Guard, GuardConfig, GuardDecision
from sinks.jsonl import JsonlSink, read_jsonl
from sinks.memory import MemorySink

__all__ = [
    "FanoutSink", "Guard", "GuardConfig", "GuardDecision", "GuardRefusal", "JsonlSink",
    "MemorySink", "RetryPolicy", "RetryingSink", "Sink", "SinkItem", "read_jsonl", "retry_call",
]
