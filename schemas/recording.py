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
from collections.abc import Iterator, Mapping
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


class RecordingEntry(NamedTuple):
    topic: str
    key: str
    ts: float
    value: bytes


class RecordingWriter:
    """Append records to a recording file; use as a context manager or call ``close()``."""

    def __init__(self, path: str, meta: Mapping[str, Any] | None = None,
                 buffer_bytes: int = 4 << 20) -> None:
        self.path = path
        self._fh: BinaryIO = open(path, "wb", buffering=buffer_bytes)  # noqa: SIM115
        self._packer = msgpack.Packer(use_bin_type=True)
        self.records = 0
        self.bytes = 0
        self._fh.write(self._packer.pack({"format": FORMAT, "v": VERSION,
                                          "meta": dict(meta or {})}))

    def emit_encoded(self, topic: str, key: str, ts: float, value: bytes) -> None:
        self._fh.write(self._packer.pack([topic, key, float(ts), value]))
        self.records += 1
        self.bytes += len(value)

    def emit(self, topic: str, key: str, ts: float, record: codec.Record) -> None:
        self.emit_encoded(topic, key, ts, codec.encode(record))

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        if not self._fh.closed:
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
        header = next(unpacker)
    except (StopIteration, ValueError, msgpack.UnpackException) as e:
        fh.close()
        raise DecodeError(f"{path}: no recording header ({e or 'empty file'})") from e
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        fh.close()
        raise DecodeError(f"{path}: not an {FORMAT} file (header {str(header)[:80]!r})")
    if header.get("v") != VERSION:
        fh.close()
        raise VersionError("recording", header.get("v"), (VERSION,))
    return header, _entries(path, fh, unpacker)


def _entries(path: str, fh: io.BufferedReader | BinaryIO, unpacker: msgpack.Unpacker
             ) -> Iterator[RecordingEntry]:
    try:
        for i, obj in enumerate(unpacker):
            if (not isinstance(obj, list) or len(obj) != 4 or not isinstance(obj[0], str)
                    or not isinstance(obj[1], str) or isinstance(obj[2], bool)
                    or not isinstance(obj[2], int | float) or not isinstance(obj[3], bytes)):
                raise DecodeError(f"{path}: entry {i} is not [topic, key, ts, bytes]: {str(obj)[:80]}")
            yield RecordingEntry(obj[0], obj[1], float(obj[2]), obj[3])
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
