"""Encode and decode wire records. msgpack for the high-volume topics (telemetry, logs,
ccl); JSON (orjson) for diagnoses, commands and dead letters, so ``kcat | jq`` reads them.

Decoding returns the record or a :class:`~schemas.errors.WireError` value (``decode``),
or raises it (``decode_or_raise``); it never raises anything else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import msgpack
import orjson

from schemas.errors import DecodeError, WireError
from schemas.records import (
    CCLRecord,
    DeadLetter,
    Diagnosis,
    IsolationCommand,
    LogRecord,
    TelemetryBatch,
)

Record = TelemetryBatch | LogRecord | CCLRecord | Diagnosis | IsolationCommand | DeadLetter
R = TypeVar("R", TelemetryBatch, LogRecord, CCLRecord, Diagnosis, IsolationCommand, DeadLetter)

MSGPACK_TYPES: tuple[type, ...] = (TelemetryBatch, LogRecord, CCLRecord)
JSON_TYPES: tuple[type, ...] = (Diagnosis, IsolationCommand, DeadLetter)
MAX_MESSAGE_BYTES = 8 << 20


def encode(record: Record) -> bytes:
    """Serialise one record in its topic's format."""
    wire = record.to_wire()
    if isinstance(record, MSGPACK_TYPES):
        return msgpack.packb(wire, use_bin_type=True)
    return orjson.dumps(wire, option=orjson.OPT_SORT_KEYS)


def _load(record_type: type, data: bytes) -> Any:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DecodeError(f"{record_type.__name__}: payload is {type(data).__name__}, not bytes")
    if len(data) > MAX_MESSAGE_BYTES:
        raise DecodeError(f"{record_type.__name__}: payload of {len(data)} bytes over the limit")
    try:
        if record_type in MSGPACK_TYPES:
            obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
        else:
            obj = orjson.loads(data)
    except Exception as e:  # msgpack/orjson raise several unrelated classes
        fmt = "msgpack" if record_type in MSGPACK_TYPES else "JSON"
        raise DecodeError(f"{record_type.__name__}: not valid {fmt}: {e}") from e
    if not isinstance(obj, Mapping):
        raise DecodeError(f"{record_type.__name__}: top level is {type(obj).__name__}, not a map")
    return obj


def decode_or_raise(record_type: type[R], data: bytes) -> R:
    """Decode and validate, raising a WireError on any problem."""
    obj = _load(record_type, data)
    try:
        return record_type.from_wire(obj)
    except WireError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise DecodeError(f"{record_type.__name__}: malformed: {e}") from e


def decode(record_type: type[R], data: bytes) -> R | WireError:
    """Decode and validate; a problem comes back as a WireError value, never raised."""
    try:
        return decode_or_raise(record_type, data)
    except WireError as e:
        return e
