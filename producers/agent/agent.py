"""The agent loop body: sample the collectors, build one TelemetryBatch per host per
interval, stamp log lines, CCL snapshots and heartbeats with host and job, and hand them to
the publisher. Time is passed in (``step(now)``), so tests drive it with a fake clock; when
wall time steps back, whatever was scheduled is due at once (not after the clock catches up).

Heartbeat: every ``heartbeat_s`` an agent LogRecord ``aegis-agent heartbeat seq=<n>`` keeps
the logs topic's event time moving on a quiet job (the decision tree's settle window waits
on event time, Aegis §4.1). Problems the collectors notice, and spool drops, also go out as
agent LogRecords (``aegis-agent notice: ...``), so nothing is lost silently.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Sequence
from typing import Any, Protocol

from producers.agent.collector import Collector, LogLine, Notices, Partial
from producers.agent.jobs import JobSource
from producers.agent.publisher import SpoolingPublisher
from schemas import topics
from schemas.codec import Record, encode
from schemas.metrics import BY_NAME, DEVICE_KINDS
from schemas.records import CCLRecord, DeviceGroup, LogRecord, TelemetryBatch


class CCLSource(Protocol):
    def poll(self) -> Any: ...

    def collect(self, now: float) -> CCLRecord | None: ...


def _natural(name: str) -> tuple[Any, ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name))


def build_groups(devices: dict[str, dict[str, dict[str, float]]]) -> dict[str, DeviceGroup]:
    """Catalogue metrics only, in catalogue order; a device lacking a metric the others have
    gets NaN there (unknown, rejected per value by the detectors)."""
    groups: dict[str, DeviceGroup] = {}
    for kind in DEVICE_KINDS:
        devs = devices.get(kind)
        if not devs:
            continue
        ids = tuple(sorted(devs, key=_natural))
        names = {m for d in devs.values() for m in d if m in BY_NAME and BY_NAME[m].kind == kind}
        ordered = [m for m in BY_NAME if m in names]
        values = {m: tuple(devs[i].get(m, math.nan) for i in ids) for m in ordered}
        groups[kind] = DeviceGroup(ids, values)
    return groups


def extras(devices: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Readings that are not catalogue metrics (kept for --once and the inventory)."""
    out: dict[str, dict[str, float]] = {}
    for devs in devices.values():
        for dev, values in devs.items():
            extra = {m: v for m, v in values.items() if m not in BY_NAME}
            if extra:
                out[dev] = extra
    return out


class Agent:
    def __init__(self, host: str, job: JobSource, collectors: Sequence[Collector],
                 logs: Collector | None = None, ccl: CCLSource | None = None,
                 publisher: SpoolingPublisher | None = None, notices: Notices | None = None,
                 interval: float = 1.0, heartbeat_s: float = 5.0, log_poll_s: float = 0.25) -> None:
        self.host = host
        self.job = job
        self.collectors = list(collectors)
        self.logs = logs
        self.ccl = ccl
        self.publisher = publisher
        self.notices = notices or Notices()
        self.interval = interval
        self.heartbeat_s = heartbeat_s
        self.log_poll_s = log_poll_s
        self.next_sample = 0.0
        self.next_heartbeat = 0.0
        self.next_logs = 0.0
        self.last_now = float("-inf")
        self.heartbeat_seq = 0
        self.reported_drops = 0
        self.counts = {"telemetry": 0, "logs": 0, "ccl": 0}
        self.last_batch: TelemetryBatch | None = None
        self.last_extras: dict[str, dict[str, float]] = {}

    # -- pieces ---------------------------------------------------------------------------
    def _guarded(self, c: Collector, now: float) -> Partial:
        try:
            part = c.collect(now)
            self.notices.clear(f"collector:{c.name}")
            return part
        except Exception as e:  # a collector bug must not stop the others
            self.notices.once(f"collector:{c.name}", f"collector {c.name} failed: {type(e).__name__}: {e}")
            return Partial()

    def sample(self, now: float) -> tuple[TelemetryBatch | None, list[LogLine]]:
        part = Partial()
        for c in self.collectors:
            part.merge(self._guarded(c, now))
        groups = build_groups(part.devices)
        self.last_extras = extras(part.devices)
        batch = TelemetryBatch(self.host, now, groups, self.job.current()) if groups else None
        if batch is not None:
            self.last_batch = batch
        return batch, part.logs

    def _log(self, ts: float, source: str, line: str, job: str | None) -> LogRecord:
        return LogRecord(self.host, ts, source, line, job)

    def _agent_lines(self, now: float, job: str | None) -> list[LogRecord]:
        out = [self._log(now, "agent", f"aegis-agent notice: {m}", job) for m in self.notices.pending()]
        if self.publisher is not None and self.publisher.dropped > self.reported_drops:
            new = self.publisher.dropped - self.reported_drops
            self.reported_drops = self.publisher.dropped
            st = self.publisher.status()
            out.append(self._log(now, "agent", f"aegis-agent spool dropped {new} records "
                                 f"(total {st['dropped']}, policy {st['spool_policy']}, "
                                 f"spool full {st['dropped_spool_full']}, "
                                 f"rejected {st['rejected']})", job))
        return out

    # -- the loop body --------------------------------------------------------------------
    def step(self, now: float) -> list[Record]:
        """Do whatever is due at ``now``; returns the records it published."""
        if now < self.last_now:  # the wall clock stepped back: what was due is due now
            self.next_sample = min(self.next_sample, now)
            self.next_logs = min(self.next_logs, now)
            self.next_heartbeat = min(self.next_heartbeat, now)
        self.last_now = now
        job = self.job.current()
        records: list[Record] = []
        if self.ccl is not None:
            try:
                for bad in self.ccl.poll() or ():
                    why = getattr(bad, "reason", str(bad))
                    key = f"ccl:bad:{type(getattr(bad, 'error', bad)).__name__}"
                    self.notices.once(key, f"CCL receiver: bad snapshot datagram ({why}); "
                                      "counted by the receiver, this kind is said once")
            except Exception as e:
                self.notices.once("ccl:poll", f"CCL receiver failed: {type(e).__name__}: {e}")
        if self.logs is not None and now >= self.next_logs:
            self.next_logs = now + self.log_poll_s
            for ln in self._guarded(self.logs, now).logs:
                records.append(self._log(ln.ts, ln.source, ln.line, job))
        if now >= self.next_sample:
            self.next_sample = max(self.next_sample + self.interval, now + self.interval / 2)
            batch, lines = self.sample(now)
            if batch is not None:
                records.append(batch)
            records += [self._log(ln.ts, ln.source, ln.line, job) for ln in lines]
            if self.ccl is not None:
                try:
                    rec = self.ccl.collect(now)
                    if rec is not None:
                        records.append(rec)
                except Exception as e:
                    self.notices.once("ccl:collect", f"CCL receiver failed: {type(e).__name__}: {e}")
        if now >= self.next_heartbeat:
            self.next_heartbeat = now + self.heartbeat_s
            self.heartbeat_seq += 1
            records.append(self._log(now, "agent", f"aegis-agent heartbeat seq={self.heartbeat_seq}", job))
        records += self._agent_lines(now, job)
        for r in records:
            self.publish(r)
        if self.publisher is not None:
            self.publisher.pump(0.0)
        return records

    def publish(self, record: Record) -> None:
        if isinstance(record, TelemetryBatch):
            topic, kind = topics.TELEMETRY.name, "telemetry"
        elif isinstance(record, LogRecord):
            topic, kind = topics.LOGS.name, "logs"
        else:
            topic, kind = topics.CCL.name, "ccl"
        self.counts[kind] += 1
        if self.publisher is not None:
            self.publisher.publish(topic, record.key, encode(record))  # type: ignore[union-attr]

    def status(self) -> dict[str, Any]:
        st: dict[str, Any] = {"host": self.host, "job": self.job.current(), "sent": dict(self.counts),
                              "heartbeat_seq": self.heartbeat_seq}
        if self.publisher is not None:
            st["publisher"] = self.publisher.status()
        suppressed = getattr(self.logs, "suppressed", 0)
        if suppressed:
            st["log_lines_suppressed"] = suppressed
        return st

    def close(self) -> None:
        for c in [*self.collectors, *([self.logs] if self.logs else [])]:
            with contextlib.suppress(Exception):
                c.close()
        close = getattr(self.ccl, "close", None)
        if callable(close):
            with contextlib.suppress(Exception):
                close()
