"""The baseline of the live benches (bench/pipeline.py, bench/zscore.py): a confluent-kafka
Consumer reading the same topics from the beginning and calling ``schemas.codec.decode`` on
each value, timed from its first message to its last."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from schemas.codec import decode
from schemas.errors import WireError


@dataclass
class RawResult:
    messages: int
    wall_s: float
    cpu_s: float
    bad: int = 0
    by_topic: dict[str, int] = field(default_factory=dict)

    def figures(self) -> dict[str, Any]:
        return {"raw_messages": self.messages, "raw_wall_s": round(self.wall_s, 3),
                "raw_msgs_per_s": round(self.messages / self.wall_s, 1),
                "raw_cpu_us_per_msg": round(self.cpu_s / self.messages * 1e6, 1),
                "raw_decode_errors": self.bad}


def raw_consume_decode(bootstrap: str, topics: dict[str, type], total: int,
                       timeout: float = 120.0) -> RawResult:
    """Read ``total`` messages of ``topics`` (full name → record type) from the beginning with
    confluent-kafka (batched ``consume``) and decode each; first message to last."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-raw-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    md = c.list_topics(timeout=10)
    c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in topics
              for p in md.topics[t].partitions])
    n = bad = 0
    counts: Counter[str] = Counter()
    t0 = c0 = None
    deadline = time.monotonic() + timeout
    try:
        while n < total and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                if m.error():
                    continue
                if t0 is None:
                    t0, c0 = time.perf_counter(), time.process_time()
                topic = m.topic() or ""
                if isinstance(decode(topics[topic], m.value() or b""), WireError):
                    bad += 1
                counts[topic] += 1
                n += 1
        t1, c1 = time.perf_counter(), time.process_time()
    finally:
        c.close()
    if n < total or t0 is None or c0 is None:
        raise TimeoutError(f"raw consumer read {n} of {total} in {timeout:.0f}s")
    return RawResult(n, t1 - t0, c1 - c0, bad, dict(counts))
