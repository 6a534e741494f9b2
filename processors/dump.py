"""``aegis dump``: save one job's input topics over an event-time range to a recording file.

    aegis dump --job job-007 --from 2026-01-01T00:00:00Z --to 1767229200 -o job-007.aegis

For each partition of the telemetry, log and CCL topics the start and end offsets are found
with ``offsets_for_times`` (Kafka message timestamps are event time in ms, as our producers
set them), so only ``[T1, T2)`` is read. A message is the job's when its key is the job and
its record's ``job`` field (read without full validation) is the job or empty; its record
``ts`` must lie in ``[T1, T2)``. Bytes that do not decode are kept (key == job): the live
worker dead-letters them, and so does a replay.

Order of the file (docs/replay.md): each topic's records keep their own partition order
(offset order), and the three topics are merged by event time, ties broken by topic name,
i.e. ``(ts, topic, offset)`` whenever each topic's timestamps are non-decreasing. If a topic's
event times go backwards, its offset order wins (a stable k-way merge), because the
detectors keep per-topic watermarks and the live worker saw that order.

Exit codes: 0 done; 1 nothing could be written; 2 usage error; 3 Kafka unreachable.
"""

from __future__ import annotations

import argparse
import heapq
import math
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgpack

from processors.progress import Progress
from schemas.errors import AegisError, ConfigError, ServiceUnavailable
from schemas.recording import RecordingEntry, RecordingWriter, read_recording
from schemas.topics import CCL, LOGS, TELEMETRY

INPUT_TOPICS = (CCL.name, LOGS.name, TELEMETRY.name)  # merge tie-break order: by name


def parse_time(text: str) -> float:
    """Epoch seconds (``1767225600``, ``1767225600.5``) or ISO-8601, UTC unless it says
    otherwise (``2026-01-01T00:00:00Z``, ``2026-01-01 00:00:00+00:00``)."""
    s = str(text).strip()
    try:
        t = float(s)
    except ValueError:
        pass
    else:
        if not math.isfinite(t):
            raise ConfigError(f"time {text!r} is not a finite number of epoch seconds")
        return t
    try:
        dt = datetime.fromisoformat(s.replace("z", "Z"))
    except ValueError:
        raise ConfigError(f"time {text!r} is neither epoch seconds nor ISO-8601 "
                          f"(e.g. 2026-01-01T00:00:00Z)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


@dataclass(frozen=True, slots=True)
class PartitionRange:
    """Offsets ``[start, end)`` of one partition that hold messages timestamped in range."""

    topic: str  # the topic name on the broker (with any prefix)
    canonical: str  # the catalogue name written to the recording (``aegis.ccl``)
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


@dataclass
class DumpStats:
    """What a dump read and kept."""

    read: int = 0  # messages consumed (every job's)
    expected: int = 0  # messages in the offset ranges
    kept: int = 0
    by_topic: dict[str, int] = field(default_factory=dict)
    other_job: int = 0  # key matched but the record names another job
    out_of_range: int = 0  # record ts outside [T1, T2)
    undecodable: int = 0  # kept raw: the replay dead-letters them like the worker
    ranges: list[PartitionRange] = field(default_factory=list)


def consumer_config(brokers: str) -> dict[str, Any]:
    """A read-only consumer: own throw-away group, never commits."""
    return {"bootstrap.servers": brokers, "group.id": f"aegis-dump-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest", "enable.partition.eof": True,
            "queued.max.messages.kbytes": 65536, "socket.timeout.ms": 30000}


def plan_ranges(consumer: Any, topics: dict[str, str], t_from: float, t_to: float,
                timeout: float = 30.0) -> list[PartitionRange]:
    """Offset ranges of every partition of ``topics`` (broker name -> catalogue name) whose
    message timestamps lie in ``[t_from, t_to)``. Missing topics give no ranges."""
    from confluent_kafka import TopicPartition

    try:
        md = consumer.list_topics(timeout=timeout)
    except Exception as e:
        raise ServiceUnavailable(f"Kafka did not answer within {timeout:.0f}s: {e}") from e
    out: list[PartitionRange] = []
    for name, canonical in sorted(topics.items(), key=lambda kv: kv[1]):
        meta = md.topics.get(name)
        if meta is None or meta.error is not None:
            print(f"aegis dump: topic {name} does not exist; nothing read from it", file=sys.stderr)
            continue
        parts = sorted(meta.partitions)
        t1, t2 = int(round(t_from * 1000)), int(round(t_to * 1000))
        try:
            starts = consumer.offsets_for_times([TopicPartition(name, p, t1) for p in parts], timeout)
            ends = consumer.offsets_for_times([TopicPartition(name, p, t2) for p in parts], timeout)
            highs = [consumer.get_watermark_offsets(TopicPartition(name, p), timeout=timeout)[1]
                     for p in parts]
        except Exception as e:  # KafkaException: timeouts, unknown partitions
            raise ServiceUnavailable(f"Kafka: cannot look up offsets of {name} by time: {e}") from e
        for p, first, after, high in zip(parts, starts, ends, highs, strict=True):
            start = high if first.offset < 0 else first.offset
            end = high if after.offset < 0 else after.offset
            if end > start:
                out.append(PartitionRange(name, canonical, p, start, end))
    return out


def _record_fields(value: bytes) -> tuple[Any, Any] | None:
    """``(job, ts)`` of an encoded input record without full validation; None if undecodable."""
    try:
        obj = msgpack.unpackb(value, raw=False, strict_map_key=False)
    except Exception:  # any malformed payload: the replay dead-letters it
        return None
    if not isinstance(obj, dict):
        return None
    return obj.get("job"), obj.get("ts")


def read_partition(consumer: Any, rng: PartitionRange, job: str, t_from: float, t_to: float,
                   emit: Callable[[RecordingEntry], None], stats: DumpStats,
                   tick: Callable[[], None], idle_timeout: float = 30.0) -> None:
    """Consume ``rng`` in offset order and ``emit`` the job's records."""
    from confluent_kafka import KafkaError, TopicPartition

    consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
    key = job.encode()
    pos, last_msg = rng.start, time.monotonic()
    try:
        while pos < rng.end:
            msgs = consumer.consume(num_messages=2000, timeout=0.5)
            if not msgs:
                if time.monotonic() - last_msg > idle_timeout:
                    raise ServiceUnavailable(
                        f"Kafka returned nothing for {idle_timeout:.0f}s at {rng.topic}"
                        f"[{rng.partition}]@{pos} (expected up to offset {rng.end})")
                continue
            last_msg = time.monotonic()
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pos = rng.end
                        break
                    raise ServiceUnavailable(f"Kafka error reading {rng.topic}[{rng.partition}]: {err}")
                off = m.offset()
                if off >= rng.end:
                    pos = rng.end
                    break
                pos = off + 1
                stats.read += 1
                tick()
                if m.key() != key:
                    continue
                value = m.value() or b""
                ts_ms = m.timestamp()[1]
                fields = _record_fields(value)
                if fields is None:
                    stats.undecodable += 1
                    ts = ts_ms / 1000.0
                else:
                    rec_job, rec_ts = fields
                    if rec_job not in (None, "", job):
                        stats.other_job += 1
                        continue
                    ok = isinstance(rec_ts, int | float) and not isinstance(rec_ts, bool)
                    ts = float(rec_ts) if ok else ts_ms / 1000.0
                if not t_from <= ts < t_to:
                    stats.out_of_range += 1
                    continue
                stats.kept += 1
                stats.by_topic[rng.canonical] = stats.by_topic.get(rng.canonical, 0) + 1
                emit(RecordingEntry(rng.canonical, job, ts, bytes(value)))
    finally:
        consumer.unassign()


def merge_streams(streams: list[Iterator[RecordingEntry]]) -> Iterator[RecordingEntry]:
    """Stable k-way merge by ``(ts, topic)``: each stream keeps its own order; with streams
    given in (topic, partition) order, equal keys come out topic by topic, offset by offset."""
    return heapq.merge(*streams, key=lambda e: (e.ts, e.topic))


def dump_job(brokers: str, job: str, t_from: float, t_to: float, out_path: str, *,
             topic_prefix: str = "", meta: dict[str, Any] | None = None,
             progress: Progress | None = None, slack_s: float = 0.0,
             timeout: float = 30.0) -> DumpStats:
    """Read the job's records in ``[t_from, t_to)`` from the broker and write a recording.

    Records are spooled per partition to a temporary directory (bounded memory), then
    merged (see :func:`merge_streams`) into ``out_path``. ``slack_s`` reads that much past
    ``t_to`` to catch records produced late (they are still filtered by their ts).
    """
    from confluent_kafka import Consumer

    if not t_from < t_to:
        raise ConfigError(f"--from ({t_from}) must be before --to ({t_to})")
    topics = {topic_prefix + name: name for name in INPUT_TOPICS}
    consumer = Consumer(consumer_config(brokers))
    stats = DumpStats()
    try:
        stats.ranges = plan_ranges(consumer, topics, t_from, t_to + max(0.0, slack_s), timeout)
        stats.expected = sum(r.size for r in stats.ranges)
        if progress is not None:
            progress.total = stats.expected
        with tempfile.TemporaryDirectory(prefix="aegis-dump-") as tmp:
            spools: list[str] = []
            for i, rng in enumerate(stats.ranges):
                path = os.path.join(tmp, f"{i:04d}.spool")
                before = stats.kept
                with RecordingWriter(path, background=False) as w:
                    def emit(e: RecordingEntry, w: RecordingWriter = w) -> None:
                        w.emit_encoded(e.topic, e.key, e.ts, e.value)

                    def tick() -> None:
                        if progress is not None and stats.read % 1000 == 0:
                            progress.update(stats.read)

                    read_partition(consumer, rng, job, t_from, t_to, emit, stats, tick, timeout)
                if stats.kept > before:
                    spools.append(path)
            header = {"job": job, "from": t_from, "to": t_to, "brokers": brokers,
                      "topic_prefix": topic_prefix, "topics": sorted(topics),
                      "records": stats.kept, "by_topic": dict(sorted(stats.by_topic.items())),
                      "order": "per-topic offset order, merged across topics by (ts, topic)",
                      "offsets": [[r.topic, r.partition, r.start, r.end] for r in stats.ranges],
                      "generator": "aegis dump", **(meta or {})}
            with RecordingWriter(out_path, meta=header) as writer:
                for e in merge_streams([read_recording(p)[1] for p in spools]):
                    writer.emit_encoded(e.topic, e.key, e.ts, e.value)
    finally:
        consumer.close()
    if progress is not None:
        progress.update(stats.read)
    return stats


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aegis dump", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", required=True, help="job id (the topics' message key)")
    p.add_argument("--from", dest="t_from", required=True, help="start, epoch s or ISO-8601 UTC")
    p.add_argument("--to", dest="t_to", required=True, help="end (exclusive), same formats")
    p.add_argument("-o", "--out", required=True, help="recording file to write")
    p.add_argument("--brokers", default=os.environ.get("AEGIS_KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
                   help="Kafka bootstrap servers (env AEGIS_KAFKA_BOOTSTRAP)")
    p.add_argument("--topic-prefix", default="", help="prefix of every topic name")
    p.add_argument("--inventory", help="inventory JSON to store in the header (replay uses it)")
    p.add_argument("--slack", type=float, default=0.0,
                   help="seconds to read past --to for late-produced records (default 0)")
    p.add_argument("--timeout", type=float, default=30.0, help="Kafka timeout in seconds")
    p.add_argument("--progress", action="store_true", help="progress bar even when not a TTY")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        t_from, t_to = parse_time(a.t_from), parse_time(a.t_to)
        if t_to <= t_from:
            raise ConfigError(f"--to {a.t_to} is not after --from {a.t_from}: the range is empty")
        meta: dict[str, Any] = {}
        if a.inventory:
            from schemas.inventory import Inventory

            meta["inventory"] = Inventory.load(a.inventory).to_wire()
    except (ConfigError, OSError, AegisError) as e:
        print(f"aegis dump: {e}", file=sys.stderr)
        return 2
    progress = Progress("dump", enabled=True if a.progress else None)
    try:
        s = dump_job(a.brokers, a.job, t_from, t_to, a.out, topic_prefix=a.topic_prefix,
                     meta=meta, progress=progress, slack_s=a.slack, timeout=a.timeout)
    except ConfigError as e:
        print(f"aegis dump: {e}", file=sys.stderr)
        return 2
    except ServiceUnavailable as e:
        print(f"aegis dump: {e}", file=sys.stderr)
        return 3
    except (AegisError, OSError) as e:
        print(f"aegis dump: {e}", file=sys.stderr)
        return 1
    progress.done()
    print(f"aegis dump: {s.kept} records of job {a.job} ({', '.join(f'{k}={v}' for k, v in sorted(s.by_topic.items())) or 'none'}) "
          f"from {s.read} read of {s.expected} in range -> {a.out}; skipped: other job "
          f"{s.other_job}, out of range {s.out_of_range}; undecodable kept {s.undecodable}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
