"""A bounded, crash-safe, append-only FIFO of Kafka records on local disk.

Every record the agent publishes is appended here first and deleted once Kafka has
acknowledged it, so one ordered queue carries both the live path and the backlog of an
outage: the backlog drains in order before anything newer.

Layout: ``<dir>/<first seq, 20 digits>.seg`` segment files of records framed as
``[u32 length][u32 crc32][msgpack [topic, key, value]]``, plus ``cursor`` (the first seq not
yet acknowledged, rewritten atomically). On open, a torn or corrupt tail is cut off at the
last good record and fully acknowledged segments are deleted.

Bounds and drops: the segments together stay under ``max_bytes``. When full, policy
``oldest`` (default) deletes the oldest segment, counting its unacknowledged records as
dropped (the newest data matter most to live diagnosis); ``newest`` refuses the incoming
record and counts it. Nothing is dropped without being counted.

fsync: records are written with one ``write`` each (safe against an agent crash, since the
page cache survives it). A segment is fsynced only while it holds records that have waited
unacknowledged for ``fsync_after_s`` (an outage), at most once per that period, and on
roll and close; in normal operation records are acknowledged within milliseconds and never
fsynced. The cursor is rewritten (rename, no fsync) on every ``tick``, about once a second.
A host crash can lose up to ``fsync_after_s`` of records; records delivered after the last
cursor write are sent again after a crash or kill -9 (at-least-once, about a second's worth).
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgpack

HEADER = struct.Struct("<II")
MAX_RECORD = 16 << 20
POLICIES = ("oldest", "newest")


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int
    topic: str
    key: bytes | None
    value: bytes


@dataclass(slots=True)
class Segment:
    base: int
    path: Path
    count: int = 0
    size: int = 0

    @property
    def end(self) -> int:
        return self.base + self.count


def frame(topic: str, key: bytes | None, value: bytes) -> bytes:
    payload = msgpack.packb([topic, key, value], use_bin_type=True)
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def scan(data: bytes) -> tuple[list[tuple[int, int]], int]:
    """(offset, length) of each good record in ``data``, and where the good part ends."""
    out: list[tuple[int, int]] = []
    pos = 0
    while pos + HEADER.size <= len(data):
        length, crc = HEADER.unpack_from(data, pos)
        start = pos + HEADER.size
        if length > MAX_RECORD or start + length > len(data):
            break
        if zlib.crc32(data[start:start + length]) != crc:
            break
        out.append((start, length))
        pos = start + length
    return out, pos


def unpack(seq: int, payload: bytes) -> Entry:
    topic, key, value = msgpack.unpackb(payload, raw=False)
    return Entry(seq, topic, key, value)


class Spool:
    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = 256 << 20,
                 segment_bytes: int | None = None, policy: str = "oldest",
                 fsync_after_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        if policy not in POLICIES:
            raise ValueError(f"spool policy {policy!r} not one of {POLICIES}")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max(4096, int(max_bytes))
        self.segment_bytes = segment_bytes or max(4096, min(16 << 20, self.max_bytes // 16))
        self.policy = policy
        self.fsync_after_s = fsync_after_s
        self.clock = clock
        self.dropped = 0
        self.corrupt_bytes = 0
        self.segments: list[Segment] = []
        self._append_fd = -1
        self._dirty_since: float | None = None
        self._cursor_written = -1
        self._reader: tuple[int, int, int] | None = None  # (segment base, offset, seq)
        self._open()

    # -- open / recover -------------------------------------------------------------------
    def _open(self) -> None:
        for path in sorted(self.dir.glob("*.seg")):
            try:
                base = int(path.stem)
            except ValueError:
                continue
            data = path.read_bytes()
            records, good = scan(data)
            if good < len(data):  # torn write or corruption: keep the good prefix
                self.corrupt_bytes += len(data) - good
                with open(path, "r+b") as fh:
                    fh.truncate(good)
            self.segments.append(Segment(base, path, len(records), good))
        end = self.segments[-1].end if self.segments else 0
        cursor = self._read_cursor()
        first = self.segments[0].base if self.segments else 0
        self.next_seq = max(end, cursor or 0)
        self.acked = min(max(cursor if cursor is not None else first, first), self.next_seq)
        self.read_seq = self.acked
        self._trim_acked()

    def _read_cursor(self) -> int | None:
        try:
            return int((self.dir / "cursor").read_text().strip())
        except (OSError, ValueError):
            return None

    def _write_cursor(self) -> None:
        if self.acked == self._cursor_written:
            return
        tmp = self.dir / "cursor.tmp"
        tmp.write_text(str(self.acked))
        os.replace(tmp, self.dir / "cursor")
        self._cursor_written = self.acked

    # -- append ---------------------------------------------------------------------------
    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def pending(self) -> int:
        return self.next_seq - self.acked

    def append(self, topic: str, key: bytes | None, value: bytes) -> int | None:
        """Append one record; its seq, or None when policy ``newest`` refused it."""
        rec = frame(topic, key, value)
        if len(rec) > self.max_bytes // 2:
            self.dropped += 1
            return None
        while self.total_bytes + len(rec) > self.max_bytes:
            if self.policy == "newest":
                self.dropped += 1
                return None
            self._drop_oldest()
        seg = self._active(len(rec))
        os.write(self._append_fd, rec)
        seg.count += 1
        seg.size += len(rec)
        seq = self.next_seq
        self.next_seq += 1
        if self._dirty_since is None:
            self._dirty_since = self.clock()
        return seq

    def _active(self, need: int) -> Segment:
        seg = self.segments[-1] if self.segments else None
        if seg is None or self._append_fd < 0 or seg.size + need > self.segment_bytes:
            if seg is not None and self._append_fd >= 0:
                self._sync_active()
                os.close(self._append_fd)
                self._append_fd = -1
            if seg is None or seg.count > 0 or seg.end != self.next_seq:
                seg = Segment(self.next_seq, self.dir / f"{self.next_seq:020d}.seg")
                self.segments.append(seg)
            self._append_fd = os.open(seg.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return seg

    def _drop_oldest(self) -> None:
        seg = self.segments[0]
        if len(self.segments) == 1 and self._append_fd >= 0:
            os.close(self._append_fd)  # the only segment is the active one: start a new one
            self._append_fd = -1
        self.dropped += max(0, seg.end - max(self.acked, seg.base))
        self.acked = max(self.acked, seg.end)
        self.read_seq = max(self.read_seq, self.acked)
        self._delete(seg)

    def _delete(self, seg: Segment) -> None:
        self.segments.remove(seg)
        if self._reader is not None and self._reader[0] == seg.base:
            self._reader = None
        with contextlib.suppress(FileNotFoundError):
            seg.path.unlink()

    # -- read / acknowledge ---------------------------------------------------------------
    def read(self, max_n: int = 1000) -> list[Entry]:
        """Up to ``max_n`` records from the read position on, in order; advances it."""
        out: list[Entry] = []
        while len(out) < max_n and self.read_seq < self.next_seq:
            seg = next((s for s in self.segments if s.base <= self.read_seq < s.end), None)
            if seg is None:  # gap (dropped): jump to the next segment
                later = [s.base for s in self.segments if s.base > self.read_seq]
                if not later:
                    self.read_seq = self.next_seq
                    break
                self.read_seq = later[0]
                continue
            offset = self._seek(seg)
            with open(seg.path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(min(seg.size - offset, 4 << 20))
            records, _ = scan(data)
            for start, length in records[: max_n - len(out)]:
                out.append(unpack(self.read_seq, data[start:start + length]))
                self.read_seq += 1
                offset += HEADER.size + length
            self._reader = (seg.base, offset, self.read_seq)
            if not records:
                break
        return out

    def _seek(self, seg: Segment) -> int:
        if self._reader is not None and self._reader[0] == seg.base and self._reader[2] == self.read_seq:
            return self._reader[1]
        with open(seg.path, "rb") as fh:
            records, _ = scan(fh.read())
        skip = self.read_seq - seg.base
        return records[skip][0] - HEADER.size if skip < len(records) else seg.size

    def rewind(self, seq: int) -> None:
        """Read again from ``seq`` (a delivery failed); never before the acknowledged floor."""
        self.read_seq = max(self.acked, min(seq, self.read_seq))

    def ack_until(self, seq: int) -> None:
        """Every record below ``seq`` is delivered."""
        if seq <= self.acked:
            return
        self.acked = min(seq, self.next_seq)
        self.read_seq = max(self.read_seq, self.acked)
        if self.acked >= self.next_seq:
            self._dirty_since = None
        self._trim_acked()

    def _trim_acked(self) -> None:
        trimmed = False
        while self.segments and self.segments[0].end <= self.acked and (
                len(self.segments) > 1 or self._append_fd < 0):
            self._delete(self.segments[0])
            trimmed = True
        if trimmed:
            self._write_cursor()

    # -- durability -----------------------------------------------------------------------
    def _sync_active(self) -> None:
        if self._append_fd >= 0 and self._dirty_since is not None and self.pending():
            os.fsync(self._append_fd)
            self._dirty_since = None

    def tick(self) -> bool:
        """Call about once a second: saves the cursor if it moved (no fsync), and fsyncs
        when unacknowledged records have waited ``fsync_after_s``. True if it fsynced."""
        self._write_cursor()
        if self._dirty_since is None or not self.pending():
            return False
        if self.clock() - self._dirty_since < self.fsync_after_s:
            return False
        self._sync_active()
        return True

    def close(self) -> None:
        self._sync_active()
        if self._append_fd >= 0:
            os.close(self._append_fd)
            self._append_fd = -1
        self._trim_acked()
        self._write_cursor()

    def status(self) -> dict[str, int]:
        return {"pending": self.pending(), "bytes": self.total_bytes, "segments": len(self.segments),
                "dropped": self.dropped, "corrupt_bytes": self.corrupt_bytes}
