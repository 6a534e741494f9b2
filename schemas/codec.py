"""Encode and decode wire records. msgpack for the high-volume topics (telemetry, logs,
ccl); JSON (orjson) for diagnoses, commands and dead letters, so ``kcat | jq`` reads them.

Decoding returns the record or a :class:`~schemas.errors.WireError` value (``decode``),
or raises it (``decode_or_raise``); it never raises anything else.

Speed: the three high-volume records first take a fast path (:func:`_fast_ccl`,
:func:`_fast_telemetry`, :func:`_fast_log`) that accepts only exact types that pass every
rule of their ``from_wire``, inline, and builds the same record. Anything it does not accept
goes through ``from_wire``, which accepts or names the problem exactly as before, so results
and error messages do not depend on which path ran.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping
from itertools import chain
from typing import Any, TypeVar

import msgpack
import orjson

from schemas.errors import DecodeError, WireError
from schemas.metrics import DEVICE_KINDS
from schemas.records import (
    LOG_SOURCES,
    SCHEMA_VERSION,
    CCLRecord,
    DeadLetter,
    DeviceGroup,
    Diagnosis,
    IsolationCommand,
    LogRecord,
    OpCounters,
    RankSnapshot,
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
    if type(data) is not bytes and not isinstance(data, bytes | bytearray | memoryview):
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
    if type(obj) is not dict and not isinstance(obj, Mapping):
        raise DecodeError(f"{record_type.__name__}: top level is {type(obj).__name__}, not a map")
    return obj


def decode_or_raise(record_type: type[R], data: bytes) -> R:
    """Decode and validate, raising a WireError on any problem."""
    obj = _load(record_type, data)
    fast = _FAST.get(record_type)
    if fast is not None:
        try:
            rec = fast(obj)
        except OverflowError:  # an int too large for a float: from_wire says what it does
            rec = None
        if rec is not None:
            return rec
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


# ---- fast paths --------------------------------------------------------------------------
# Each returns the record ``from_wire`` would build, or None when any value is not of the
# exact expected type or breaks a rule; the caller then runs ``from_wire``. Comparisons are
# written so that NaN fails them (``0.0 <= x <= _MAX_FLOAT`` is False for NaN and inf).
_MAX_FLOAT = sys.float_info.max
_FLOAT = frozenset((float,))
_NUMBER = frozenset((float, int))
_STR = frozenset((str,))
_new = object.__new__


def _slot_setters(cls: type, names: tuple[str, ...]) -> tuple[Callable[[Any, Any], None], ...]:
    """Setters of a frozen slots dataclass's fields, which must be exactly ``names``.

    ``obj = _new(cls)`` then one setter per field builds the object ``cls(*values)`` would,
    in half the time (no frozen ``object.__setattr__`` by name). Only for values that
    passed every check, and only while the class has no ``__post_init__`` (asserted here).
    """
    have = tuple(f.name for f in dataclasses.fields(cls))
    if have != names or hasattr(cls, "__post_init__") or "__slots__" not in vars(cls):
        raise TypeError(f"codec fast path: {cls.__name__} fields {have} != {names}")
    return tuple(vars(cls)[n].__set__ for n in names)


_OP_SET = _slot_setters(OpCounters, ("op", "cl", "wr", "wc", "seq", "td_us", "n_us"))
_RANK_SET = _slot_setters(RankSnapshot, ("comm", "comm_size", "rank", "gpu", "ops",
                                         "pending_peers", "last_event_ts"))


def _head(d: Any) -> tuple[str, float, str | None] | None:
    """host, ts and job of a v1 record map, checked as ``from_wire`` checks them."""
    if type(d) is not dict or type(v := d.get("v", SCHEMA_VERSION)) is not int \
            or v != SCHEMA_VERSION:
        return None
    host, ts, job = d.get("host"), d.get("ts"), d.get("job")
    if type(host) is not str or not 0 < len(host) <= 256 or (
            job is not None and (type(job) is not str or len(job) > 256)):
        return None
    if type(ts) is not float:
        if type(ts) is not int or ts < 0:
            return None
        ts = float(ts)
    if not 0.0 <= ts <= _MAX_FLOAT:
        return None
    return host, ts, job


def _fast_ccl(d: Any) -> CCLRecord | None:
    """CCLRecord.from_wire (with RankSnapshot and OpCounters) for input that passes."""
    s_op, s_cl, s_wr, s_wc, s_seq, s_td, s_n = _OP_SET
    s_comm, s_size, s_rank, s_gpu, s_ops, s_pending, s_last = _RANK_SET
    head = _head(d)
    ranks = d.get("ranks") if head is not None else None
    if type(ranks) is not list:
        return None
    snaps = []
    for r in ranks:
        if type(r) is not dict:
            return None
        comm, size, rank, gpu = r.get("comm"), r.get("size"), r.get("rank"), r.get("gpu")
        ops, pending, last = r.get("ops"), r.get("pending", ()), r.get("last")
        if type(comm) is not str or not 0 < len(comm) <= 64 or type(size) is not int or \
                type(rank) is not int or not 0 <= rank < size or type(gpu) is not int or \
                gpu < -1 or type(ops) is not list or type(pending) not in (list, tuple):
            return None
        for p in pending:
            if type(p) is not int or not 0 <= p < size:
                return None
        if last is None:
            last = 0.0
        elif type(last) is float:
            if not 0.0 <= last <= _MAX_FLOAT:
                return None
            last = last or 0.0
        elif type(last) is int and last >= 0:
            last = float(last)
        else:
            return None
        counters = []
        for o in ops:
            if type(o) is not list or len(o) != 7:
                return None
            op, cl, wr, wc, seq, td, n = o
            # (a | b | ...) >= 0 holds exactly when every one of the ints is >= 0
            if type(op) is not str or not 0 < len(op) <= 32 or type(cl) is not int or \
                    type(wr) is not int or type(wc) is not int or type(seq) is not int or \
                    (cl | wr | wc | seq) < 0:
                return None
            if type(td) is not float:
                if type(td) is not int or td < 0:
                    return None
                td = float(td)
            if type(n) is not float:
                if type(n) is not int or n < 0:
                    return None
                n = float(n)
            if not (0.0 <= td <= _MAX_FLOAT and 0.0 <= n <= _MAX_FLOAT):
                return None
            c = _new(OpCounters)
            s_op(c, op), s_cl(c, cl), s_wr(c, wr), s_wc(c, wc), s_seq(c, seq), s_td(c, td)
            s_n(c, n)
            counters.append(c)
        x = _new(RankSnapshot)
        s_comm(x, comm), s_size(x, size), s_rank(x, rank), s_gpu(x, gpu)
        s_ops(x, tuple(counters)), s_pending(x, tuple(pending)), s_last(x, last)
        snaps.append(x)
    assert head is not None
    return CCLRecord(head[0], head[1], tuple(snaps), head[2], SCHEMA_VERSION)


def _fast_telemetry(d: Any) -> TelemetryBatch | None:
    """TelemetryBatch.from_wire (with DeviceGroup) for input that passes."""
    head = _head(d)
    devices = d.get("devices") if head is not None else None
    if type(devices) is not dict:
        return None
    groups = {}
    for kind, g in devices.items():
        if kind not in DEVICE_KINDS or type(g) is not dict:
            return None
        ids, values = g.get("ids", ()), g.get("values")
        if type(ids) not in (list, tuple) or type(values) is not dict or (
                ids and not {*map(type, ids)} <= _STR):
            return None
        count = len(ids)
        for metric, vals in values.items():
            if type(metric) is not str or type(vals) is not list or len(vals) != count:
                return None
        types = {*map(type, chain.from_iterable(values.values()))}
        if types <= _FLOAT:
            out = dict(zip(values, map(tuple, values.values()), strict=True))
        elif types <= _NUMBER:
            out = {m: tuple(map(float, vals)) for m, vals in values.items()}
        else:
            return None
        groups[kind] = DeviceGroup(tuple(ids), out)
    assert head is not None
    return TelemetryBatch(head[0], head[1], groups, head[2], SCHEMA_VERSION)


def _fast_log(d: Any) -> LogRecord | None:
    """LogRecord.from_wire for input that passes."""
    head = _head(d)
    if head is None:
        return None
    source, line = d.get("source"), d.get("line")
    if type(source) is not str or source not in LOG_SOURCES or type(line) is not str or \
            not 0 < len(line) <= 65536:
        return None
    return LogRecord(head[0], head[1], source, line, head[2], SCHEMA_VERSION)


_FAST: dict[type, Callable[[Any], Any]] = {
    CCLRecord: _fast_ccl, TelemetryBatch: _fast_telemetry, LogRecord: _fast_log}
