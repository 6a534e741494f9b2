"""Recording files: a captured or simulated stream of input records, replayable byte for byte.

Format (msgpack stream, version 1):
- first object, the header: ``{"format": "aegis-recording", "v": 1, "meta": {...}}``; ``meta``
  may hold ``"inventory"`` (``schemas.inventory.Inventory.to_wire()``) and anything else the
  producer wants to record (generator, config, time range);
- then one ``[topic, key, ts, value_bytes]`` array per record, in production order, where
  ``value_bytes`` is exactly the message value on the Kafka topic (``schemas.codec.encode``).

``RecordingWriter`` writes (``emit`` takes a record, ``emit_encoded`` already-encoded bytes);
``read_recording`` returns the header and a lazy iterator of entries; ``decode_entry`` turns
an entry into its record, or a WireError value.
"""

from __future__ import annotations

import io
import os
import queue
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, BinaryIO, NamedTuple

import msgpack

from schemas import codec, topics
from schemas.errors import DecodeError, VersionError, WireError
from schemas.records import (
    CCLRecord,
    DeadLetter,
    Diagnosis,
    IsolationCommand,
    LogRecord,
    TelemetryBatch,
)

FORMAT = "aegis-recording"
VERSION = 1
TOPIC_RECORD: dict[str, type] = {
    topics.TELEMETRY.name: TelemetryBatch, topics.LOGS.name: LogRecord, topics.CCL.name: CCLRecord,
    topics.DIAGNOSES.name: Diagnosis, topics.COMMANDS.name: IsolationCommand,
    topics.DEADLETTER.name: DeadLetter,
}


_F64 = struct.Struct(">Bd")


def _bin_header(n: int) -> bytes:
    if n < 0x100:
        return bytes((0xC4, n))
    if n < 0x10000:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


class RecordingEntry(NamedTuple):
    topic: str
    key: str
    ts: float
    value: bytes


class RecordingWriter:
    """Append records to a recording file; use as a context manager or call ``close()``.

    Entries are encoded on the caller's thread and, with ``background=True`` (the default),
    written by a writer thread, so file I/O (which releases the GIL) overlaps producing the
    next batch. A write error is raised on the next call or on ``close()``.
    """

    def __init__(self, path: str, meta: Mapping[str, Any] | None = None,
                 background: bool = True, chunk_bytes: int = 1 << 20) -> None:
        self.path = path
        self._fh: BinaryIO = open(path, "wb", buffering=chunk_bytes)  # noqa: SIM115
        self._packer = msgpack.Packer(use_bin_type=True)
        self.records = 0
        self.bytes = 0
        self._prefixes: dict[tuple[str, str], bytes] = {}
        self._bin_headers: dict[int, bytes] = {}
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._chunk = chunk_bytes
        self._error: BaseException | None = None
        self._closed = False
        self._fh.write(self._packer.pack({"format": FORMAT, "v": VERSION,
                                          "meta": dict(meta or {})}))
        self._queue: queue.Queue[bytes | None] | None = None
        self._thread: threading.Thread | None = None
        if background:
            self._queue = queue.Queue(maxsize=8)
            self._thread = threading.Thread(target=self._drain, name="recording-writer",
                                            daemon=True)
            self._thread.start()

    def _drain(self) -> None:
        assert self._queue is not None
        while True:
            blob = self._queue.get()
            try:
                if blob is None:
                    return
                if self._error is None:
                    self._fh.write(blob)
            except BaseException as e:  # surfaced on the producer's next call
                self._error = e
            finally:
                self._queue.task_done()

    def _write(self, blob: bytes) -> None:
        if self._error is not None:
            raise self._error
        if self._queue is None:
            self._fh.write(blob)
        else:
            self._queue.put(blob)

    def emit_encoded(self, topic: str, key: str, ts: float, value: bytes) -> None:
        entry = self._packer.pack([topic, key, float(ts), value])
        self._pending.append(entry)
        self._pending_size += len(entry)
        self.records += 1
        self.bytes += len(value)
        if self._pending_size >= self._chunk:
            self._flush_pending()

    def emit_encoded_batch(self, entries: Sequence[tuple[str, str, float, bytes]]) -> None:
        """Write many entries at once; same bytes as ``emit_encoded`` one by one."""
        parts: list[bytes] = []
        extend = parts.extend
        prefixes, headers = self._prefixes, self._bin_headers
        last_ts, ts_b = None, b""
        size = 0
        for topic, key, ts, value in entries:
            pre = prefixes.get((topic, key))
            if pre is None:
                pre = prefixes[(topic, key)] = b"\x94" + msgpack.packb(topic) + msgpack.packb(key)
            if ts != last_ts:
                last_ts, ts_b = ts, _F64.pack(0xCB, ts)
            ln = len(value)
            hdr = headers.get(ln)
            if hdr is None:
                hdr = headers[ln] = _bin_header(ln)
            extend((pre, ts_b, hdr, value))
            size += ln
        self._flush_pending()
        self._write(b"".join(parts))
        self.records += len(entries)
        self.bytes += size

    def emit(self, topic: str, key: str, ts: float, record: codec.Record) -> None:
        self.emit_encoded(topic, key, ts, codec.encode(record))

    def _flush_pending(self) -> None:
        if self._pending:
            blob = b"".join(self._pending)
            self._pending, self._pending_size = [], 0
            self._write(blob)

    def flush(self) -> None:
        """Everything emitted so far is handed to the OS when this returns."""
        self._flush_pending()
        if self._queue is not None:
            self._queue.join()
        if self._error is not None:
            raise self._error
        self._fh.flush()

    def close(self) -> None:
        """Write what is left, stop the writer thread, close the file; raises a write error."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush()
        finally:
            if self._queue is not None and self._thread is not None:
                self._queue.put(None)
                self._thread.join()
            self._fh.close()

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def read_recording(path: str) -> tuple[dict[str, Any], Iterator[RecordingEntry]]:
    """The header and a lazy iterator over the entries (the file closes when it is exhausted).

    Raises DecodeError / VersionError when the file is not a version-1 recording; an entry
    that is not a 4-item ``[str, str, number, bytes]`` raises DecodeError naming its index.
    """
    fh = open(path, "rb")  # noqa: SIM115 - closed by the iterator
    unpacker = msgpack.Unpacker(fh, raw=False, strict_map_key=False, max_buffer_size=1 << 30)
    try:
        header = _header(path, unpacker)
    except BaseException:
        fh.close()
        raise
    return header, _entries(path, fh, unpacker)


def entry_size(topic: str, key: str, value: bytes) -> int:
    """About the bytes one entry takes in the file (progress estimates from the file size)."""
    return len(value) + len(topic) + len(key) + 16


def read_header(path: str) -> dict[str, Any]:
    """Only the header of a recording, checked as :func:`read_recording` checks it."""
    with open(path, "rb") as fh:
        return _header(path, msgpack.Unpacker(fh, raw=False, strict_map_key=False,
                                              max_buffer_size=1 << 30))


def _header(path: str, unpacker: msgpack.Unpacker) -> dict[str, Any]:
    try:
        header = next(unpacker)
    except (StopIteration, ValueError, msgpack.UnpackException) as e:
        raise DecodeError(f"{path}: no recording header ({e or 'empty file'})") from e
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise DecodeError(f"{path}: not an {FORMAT} file (header {str(header)[:80]!r})")
    if type(header.get("v")) is not int or header.get("v") != VERSION:
        raise VersionError("recording", header.get("v"), (VERSION,))
    return header


def _entries(path: str, fh: io.BufferedReader | BinaryIO, unpacker: msgpack.Unpacker
             ) -> Iterator[RecordingEntry]:
    try:
        for i, obj in enumerate(unpacker):
            if (not isinstance(obj, list) or len(obj) != 4 or not isinstance(obj[0], str)
                    or not isinstance(obj[1], str) or isinstance(obj[2], bool)
                    or not isinstance(obj[2], int | float) or not isinstance(obj[3], bytes)):
                raise DecodeError(f"{path}: entry {i} is not [topic, key, ts, bytes]: {str(obj)[:80]}")
            yield RecordingEntry(obj[0], obj[1], float(obj[2]), obj[3])
        size = os.fstat(fh.fileno()).st_size
        if unpacker.tell() != size:
            raise DecodeError(f"{path}: truncated: {size - unpacker.tell()} trailing bytes "
                              f"after the last complete entry")
    except (ValueError, msgpack.UnpackException) as e:
        raise DecodeError(f"{path}: truncated or corrupt after the last good entry: {e}") from e
    finally:
        fh.close()


def decode_entry(entry: RecordingEntry) -> Any:
    """The entry's record, or a WireError value (unknown topic, bad bytes)."""
    rtype = TOPIC_RECORD.get(entry.topic)
    if rtype is None:
        return DecodeError(f"recording entry on unknown topic {entry.topic!r}")
    return codec.decode(rtype, entry.value)


def iter_records(path: str) -> Iterator[tuple[RecordingEntry, Any]]:
    """Each entry with its decoded record (or WireError), header skipped."""
    _, entries = read_recording(path)
    for e in entries:
        yield e, decode_entry(e)


__all__ = ["FORMAT", "VERSION", "RecordingEntry", "RecordingWriter", "TOPIC_RECORD",
           "WireError", "decode_entry", "iter_records", "read_recording"]
