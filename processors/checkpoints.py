"""Exactly-once effect for stateful Faust agents: hold acks until the state that covers
an event is in the changelog.

An agent iterates ``stream.noack()``; after processing an event it ``hold``s it under its
job. When the job's detector state is written to the Table (every ``every_s`` of event
time, or at once when a diagnosis came out), the producer is flushed and only then is
every held event of that job acked, so a committed offset is always covered by a durable
snapshot. (Faust also flushes before committing, but a kill -9 between the two was seen
to lose the last table writes of already-acked events.) After a crash the worker restores the snapshot
and re-reads from the committed offset; records the snapshot already counted are
recognised as duplicates by the detectors (per-host last event time), and diagnoses
carry stable ids, so nothing is lost or counted twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _JobHold:
    partition: int
    events: list[Any] = field(default_factory=list)
    last_ckpt_ts: float = float("-inf")
    last_wall: float = 0.0


class AckHolder:
    """Per-job held events and checkpoint timing (event time), for one agent."""

    def __init__(self, every_s: float, quiet_wall_s: float = 5.0) -> None:
        self.every_s = every_s
        self.quiet_wall_s = quiet_wall_s
        self._jobs: dict[str, _JobHold] = {}

    def hold(self, job: str, partition: int, event: Any, wall: float) -> None:
        h = self._jobs.get(job)
        if h is None or h.partition != partition:
            h = self._jobs[job] = _JobHold(partition)
        h.events.append(event)
        h.last_wall = wall

    def due(self, job: str, event_ts: float, force: bool = False) -> bool:
        h = self._jobs.get(job)
        return h is not None and (force or event_ts - h.last_ckpt_ts >= self.every_s)

    def quiet_jobs(self, partition: int, wall: float, except_job: str | None) -> list[str]:
        """Jobs of this partition holding events and idle for ``quiet_wall_s`` of wall time."""
        return [j for j, h in self._jobs.items()
                if j != except_job and h.partition == partition and h.events
                and wall - h.last_wall >= self.quiet_wall_s]

    def checkpointed(self, job: str, event_ts: float, ack: Callable[[Any], Any]) -> int:
        h = self._jobs.get(job)
        if h is None:
            return 0
        n = len(h.events)
        for ev in h.events:
            ack(ev)
        h.events.clear()
        h.last_ckpt_ts = event_ts
        return n

    def held(self) -> int:
        return sum(len(h.events) for h in self._jobs.values())


CHUNK_BYTES = 512 * 1024  # well under Kafka's default 1 MB message limit


def save_chunked(table: Any, prefix: str, data: bytes) -> None:
    """Write ``data`` under ``prefix`` as chunks of a new generation, then the manifest.

    A 10,000-GPU job's Z-score state is several MB, over Kafka's message limit, so state is
    split. Chunks of generation g' are written before the manifest that points at them, so
    a crash in between leaves the previous generation (still intact) in force.
    """
    import hashlib

    import msgpack

    old = table.get(prefix.encode())
    gen = 1 - int(msgpack.unpackb(bytes(old))["gen"]) if old is not None else 0
    n = max(1, -(-len(data) // CHUNK_BYTES))
    for i in range(n):
        table[f"{prefix}@{gen}#{i}".encode()] = data[i * CHUNK_BYTES:(i + 1) * CHUNK_BYTES]
    table[prefix.encode()] = msgpack.packb(
        {"gen": gen, "chunks": n, "sha256": hashlib.sha256(data).hexdigest()})


def load_chunked(table: Any, prefix: str) -> bytes | None:
    """The state saved by :func:`save_chunked`, or None (never saved, or inconsistent)."""
    import hashlib

    import msgpack

    raw = table.get(prefix.encode())
    if raw is None:
        return None
    m = msgpack.unpackb(bytes(raw))
    parts = [table.get(f"{prefix}@{m['gen']}#{i}".encode()) for i in range(int(m["chunks"]))]
    if any(p is None for p in parts):
        return None
    data = b"".join(bytes(p) for p in parts)
    return data if hashlib.sha256(data).hexdigest() == m["sha256"] else None
