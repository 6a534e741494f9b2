"""The remediation side of the isolation queue: claim, act, ack; reclaim from the dead.

A consumer in group ``remediation`` on ``aegis:{C}:commands`` (layout: sinks/redis_queue.py):
- :meth:`CommandConsumer.history` — XREADGROUP from 0: this consumer's own un-acked
  entries (held when it last stopped); call once at start.
- :meth:`CommandConsumer.claim` — XREADGROUP ``>``: new entries.
- :meth:`CommandConsumer.ack` — XACK once the action succeeded. A failed action is simply
  not acked: the entry stays pending and is retried after ``min_idle_ms``.
- :meth:`CommandConsumer.reclaim` — XAUTOCLAIM entries idle longer than ``min_idle_ms``,
  from any consumer (one that crashed, or this one after a failure).
- :meth:`CommandConsumer.bury` — after ``max_deliveries`` attempts, or an undecodable entry,
  move it to ``aegis:{C}:commands:dead`` and ack it, in one MULTI/EXEC.
- :meth:`CommandConsumer.peek` — read-only view of what the group would process next
  (pending + undelivered), for ``--dry-run``; it changes no group state.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from schemas.codec import decode
from schemas.errors import ConfigError, WireError
from schemas.records import IsolationCommand
from sinks.redis_queue import (
    DEFAULT_GROUP,
    RedisOptions,
    dead_key,
    ensure_group,
    stream_key,
    unavailable_as,
)


def default_consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, slots=True)
class Delivery:
    """One stream entry handed to this consumer."""

    entry_id: str
    command: IsolationCommand | None  # None when the entry could not be decoded
    fields: dict[str, str] = field(default_factory=dict)  # cmd omitted
    error: str = ""  # why command is None
    reclaimed: bool = False  # taken over from an idle consumer (or ourselves) by XAUTOCLAIM


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def to_delivery(entry_id: Any, raw: dict[Any, Any] | None, reclaimed: bool = False) -> Delivery:
    eid = _text(entry_id)
    if not raw:
        return Delivery(eid, None, {}, "entry deleted from the stream (trimmed?)", reclaimed)
    fields = {_text(k): _text(v) for k, v in raw.items() if _text(k) != "cmd"}
    payload = raw.get(b"cmd", raw.get("cmd"))
    if payload is None:
        return Delivery(eid, None, fields, "entry has no 'cmd' field", reclaimed)
    data = payload if isinstance(payload, bytes) else str(payload).encode()
    cmd = decode(IsolationCommand, data)
    if isinstance(cmd, WireError):
        return Delivery(eid, None, fields, str(cmd), reclaimed)
    return Delivery(eid, cmd, fields, "", reclaimed)


class CommandConsumer:
    """One named consumer of a cluster's command stream (see the module docstring)."""

    def __init__(self, options: RedisOptions | str, *, cluster: str = "default",
                 group: str = DEFAULT_GROUP, consumer: str | None = None, count: int = 16,
                 min_idle_ms: int = 60_000, max_deliveries: int = 5,
                 client: redis.Redis | None = None) -> None:
        self.options = RedisOptions(options) if isinstance(options, str) else options
        if count < 1 or min_idle_ms < 0 or max_deliveries < 1:
            raise ConfigError("consumer: need count >= 1, min_idle_ms >= 0, max_deliveries >= 1")
        self.cluster, self.group = cluster, group
        self.consumer = consumer or default_consumer_name()
        self.count, self.min_idle_ms, self.max_deliveries = count, min_idle_ms, max_deliveries
        self.stream, self.dead_stream = stream_key(cluster), dead_key(cluster)
        self._client = client
        self._where = self.options.shown

    def __repr__(self) -> str:
        return (f"CommandConsumer({self._where!r}, cluster={self.cluster!r}, "
                f"group={self.group!r}, consumer={self.consumer!r})")

    @property
    def client(self) -> Any:  # redis.Redis; its stubs type replies as sync|async unions
        if self._client is None:
            self._client = self.options.connect()
        return self._client

    def setup(self) -> None:
        """Check Redis answers and create the group (at id 0) if needed."""
        with unavailable_as(self._where, "setup"):
            self.client.ping()
            ensure_group(self.client, self.stream, self.group)

    def history(self) -> list[Delivery]:
        """This consumer's own un-acked entries (what it held when it last stopped)."""
        out: list[Delivery] = []
        cursor = "0"
        with unavailable_as(self._where, "XREADGROUP history"):
            while got := self._read(cursor, None):
                out += got
                cursor = got[-1].entry_id
        return out

    def claim(self, block_ms: int | None = None) -> list[Delivery]:
        """New entries (``>``) for this consumer; ``block_ms=None`` returns at once,
        otherwise waits up to ``block_ms`` for some to arrive."""
        with unavailable_as(self._where, "XREADGROUP"):
            return self._read(">", block_ms)

    def _read(self, start: str, block_ms: int | None) -> list[Delivery]:
        kw: dict[str, Any] = {"count": self.count}
        if block_ms is not None and block_ms > 0:
            kw["block"] = block_ms
        resp = self.client.xreadgroup(self.group, self.consumer, {self.stream: start}, **kw)
        out: list[Delivery] = []
        for _stream, entries in resp or []:
            out += [to_delivery(eid, raw) for eid, raw in entries]
        return out

    def reclaim(self, min_idle_ms: int | None = None, limit: int | None = None) -> list[Delivery]:
        """XAUTOCLAIM every entry idle for at least ``min_idle_ms`` (default: the consumer's),
        scanning the group's pending list once (pages of ``count``), up to ``limit`` entries."""
        idle = self.min_idle_ms if min_idle_ms is None else min_idle_ms
        out: list[Delivery] = []
        cursor: Any = "0-0"
        with unavailable_as(self._where, "XAUTOCLAIM"):
            while limit is None or len(out) < limit:
                page = self.count if limit is None else min(self.count, limit - len(out))
                resp = self.client.xautoclaim(self.stream, self.group, self.consumer, idle,
                                              start_id=cursor, count=page)
                cursor, entries = resp[0], resp[1]
                out += [to_delivery(eid, raw, reclaimed=True) for eid, raw in entries]
                if _text(cursor) == "0-0":
                    break
        return out

    def ack(self, entry_id: str) -> int:
        with unavailable_as(self._where, f"XACK {entry_id}"):
            return int(self.client.xack(self.stream, self.group, entry_id))

    def deliveries(self, entry_id: str) -> int:
        """How many times the group has delivered this entry (0 if it is not pending)."""
        with unavailable_as(self._where, f"XPENDING {entry_id}"):
            rows = self.client.xpending_range(self.stream, self.group, min=entry_id,
                                              max=entry_id, count=1)
        return int(rows[0]["times_delivered"]) if rows else 0

    def bury(self, delivery: Delivery, reason: str, attempts: int = 0) -> None:
        """Move an entry to the dead stream and ack it, atomically."""
        fields: dict[str, Any] = dict(delivery.fields)
        if delivery.command is not None:
            from schemas.codec import encode

            fields["cmd"] = encode(delivery.command)
        fields.update({"entry_id": delivery.entry_id, "reason": reason[:1024],
                       "consumer": self.consumer, "deliveries": str(attempts)})
        with unavailable_as(self._where, f"bury {delivery.entry_id}"):
            pipe = self.client.pipeline(transaction=True)
            pipe.xadd(self.dead_stream, fields, maxlen=10_000, approximate=True)
            pipe.xack(self.stream, self.group, delivery.entry_id)
            pipe.execute()

    def pending_count(self) -> int:
        with unavailable_as(self._where, "XPENDING"):
            summary = self.client.xpending(self.stream, self.group)
        return int(summary["pending"]) if summary else 0

    def peek(self, limit: int = 1000) -> list[Delivery]:
        """What the group would process next, without claiming anything (for --dry-run)."""
        with unavailable_as(self._where, "peek"):
            last = "-"
            pending_ids: Sequence[Any] = []
            try:
                groups = self.client.xinfo_groups(self.stream)
            except redis.ResponseError:  # no such stream yet
                return []
            for g in groups:
                if _text(g["name"]) == self.group:
                    last = "(" + _text(g["last-delivered-id"])
                    pending_ids = [r["message_id"] for r in self.client.xpending_range(
                        self.stream, self.group, min="-", max="+", count=limit)]
            out = []
            for pid in pending_ids:
                rows = self.client.xrange(self.stream, min=pid, max=pid, count=1)
                out.append(to_delivery(pid, rows[0][1] if rows else None))
            if last == "(0-0":
                last = "-"
            out += [to_delivery(eid, raw) for eid, raw in
                    self.client.xrange(self.stream, min=last, max="+", count=limit)]
            return out

    def follow(self, after: str, block_ms: int) -> list[Delivery]:
        """Entries after ``after`` (XREAD, no group), for a dry-run that keeps watching."""
        kw: dict[str, Any] = {"count": self.count}
        if block_ms > 0:
            kw["block"] = block_ms
        with unavailable_as(self._where, "XREAD"):
            resp = self.client.xread({self.stream: after}, **kw)
        return [to_delivery(eid, raw) for _s, entries in resp or [] for eid, raw in entries]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
