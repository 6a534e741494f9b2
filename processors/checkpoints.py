"""Exactly-once effect for stateful Faust agents: hold acks until the state that covers
an event is on the broker.

An agent iterates ``stream.noack()``; after processing an event it ``hold``s it under its
job. When the job's detector state is written to the Table (every ``every_s`` of event
time, or at once when a diagnosis came out), the agent waits until the broker has
acknowledged those changelog records and the diagnoses it sent (:class:`PendingWrites`),
and only then acks the job's held events, in offset order per partition. A committed
offset is therefore always covered by a durable snapshot. After a crash the worker
restores the snapshot and re-reads from the committed offset; records the snapshot
already counted are recognised as duplicates by the detectors (per-host last event time),
and diagnoses carry stable ids, so nothing is lost or counted twice.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Held:
    event: Any
    released: bool = False


@dataclass
class _JobHold:
    partition: int
    held: list[_Held] = field(default_factory=list)
    last_ckpt_ts: float = float("-inf")
    last_wall: float = 0.0


class AckHolder:
    """Per-job held events and checkpoint timing (event time), for one agent.

    Events are released per job when that job's state is written, but handed back for
    acking strictly in offset order per partition: an event is acked only once every
    earlier event of its partition is released too. Faust commits the highest run of
    consecutive acked offsets and does not notice a single missing offset right after
    the committed one (faust-streaming 0.15 ``Consumer._new_offset``), so out-of-order
    acks could commit past an event whose state was never written.
    """

    def __init__(self, every_s: float, quiet_wall_s: float = 5.0) -> None:
        self.every_s = every_s
        self.quiet_wall_s = quiet_wall_s
        self._jobs: dict[str, _JobHold] = {}
        self._order: dict[int, deque[_Held]] = {}

    def hold(self, job: str, partition: int, event: Any, wall: float) -> None:
        h = self._jobs.get(job)
        if h is None or h.partition != partition:
            if h is not None:  # the job's key moved partition (a rebalance): never block
                for old in h.held:
                    old.released = True
            h = self._jobs[job] = _JobHold(partition)
        entry = _Held(event)
        h.held.append(entry)
        self._order.setdefault(partition, deque()).append(entry)
        h.last_wall = wall

    def due(self, job: str, event_ts: float, force: bool = False) -> bool:
        h = self._jobs.get(job)
        return h is not None and (force or event_ts - h.last_ckpt_ts >= self.every_s)

    def quiet_jobs(self, partition: int, wall: float, except_job: str | None) -> list[str]:
        """Jobs of this partition holding events and idle for ``quiet_wall_s`` of wall time."""
        return [j for j, h in self._jobs.items()
                if j != except_job and h.partition == partition and h.held
                and wall - h.last_wall >= self.quiet_wall_s]

    def checkpointed(self, job: str, event_ts: float) -> list[Any]:
        """Release ``job``'s held events; return the events now ackable, in offset order."""
        h = self._jobs.get(job)
        if h is None:
            return []
        for entry in h.held:
            entry.released = True
        h.held.clear()
        h.last_ckpt_ts = event_ts
        return self._drain(h.partition)

    def release(self, partition: int, event: Any) -> list[Any]:
        """An event with no state to wait for (a dead letter): ackable in its turn."""
        self._order.setdefault(partition, deque()).append(_Held(event, released=True))
        return self._drain(partition)

    def _drain(self, partition: int) -> list[Any]:
        queue = self._order.get(partition)
        out = []
        while queue and queue[0].released:
            out.append(queue.popleft().event)
        return out

    def held(self) -> int:
        """Events not yet handed back for acking."""
        return sum(len(q) for q in self._order.values())


class PendingWrites:
    """Records produced for the current events (table changelog writes, diagnoses) that
    the broker has not yet acknowledged. ``settled()`` waits for every one added before
    the call; only then may the events they cover be acked.

    Faust's ``producer.flush()`` is not enough: its buffer flush gives up after 0.1 s
    without progress, and a message taken from the buffer but not yet handed to the
    client is in neither, so a kill -9 right after a commit lost the last table writes.
    Awaiting each record's own delivery future has no such gap.
    """

    def __init__(self) -> None:
        self._futures: list[Any] = []

    def add(self, future: Any) -> None:
        self._futures.append(future)

    async def settled(self) -> None:
        waiting = list(self._futures)
        if waiting:
            await asyncio.gather(*waiting)  # a failed delivery raises: nothing is acked
        self._futures = [f for f in self._futures if not f.done()]

    def __len__(self) -> int:
        return len(self._futures)

    async def ack_after(self, stream: Any, events: list[Any]) -> None:
        """Ack ``events`` (in the order given) on ``stream`` once every write so far is on
        the broker."""
        if events:
            await self.settled()
            for ev in events:
                await stream.ack(ev)


def tracked_table(app: Any, name: str, pending: PendingWrites, **kwargs: Any) -> Any:
    """``app.Table(name, **kwargs)`` whose changelog writes are added to ``pending``."""
    table_cls = app.conf.Table

    class TrackedTable(table_cls):  # type: ignore[misc, valid-type]
        def send_changelog(self, *args: Any, **kw: Any) -> Any:
            future = super().send_changelog(*args, **kw)
            pending.add(future)
            return future

    return app.tables.add(TrackedTable(app, name=name, beacon=app.tables.beacon, **kwargs))


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
