"""The codec's fast decode paths give exactly what the checked ``from_wire`` path gives:
the same record (same field values and types) or the same error, for valid and broken input."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from schemas import codec
from schemas.records import CCLRecord, LogRecord, OpCounters, RankSnapshot, TelemetryBatch

NAN, INF = float("nan"), float("inf")


def ccl_wire() -> dict[str, Any]:
    return {"v": 1, "host": "h0003", "job": "job-1", "ts": 1767225610.5, "ranks": [
        {"comm": "959dc28685f1cdc6", "size": 8, "rank": 3, "gpu": 3,
         "ops": [["AllGather", 10, 40, 38, 9, 379.8, 12.5], ["ReduceScatter", 10, 40, 40, 10,
                                                              471.5, 0.0]],
         "pending": [4, 2], "last": 1767225610.25},
        {"comm": "a0", "size": 1000, "rank": 999, "gpu": 7, "ops": [], "pending": [],
         "last": 0.0}]}


def telemetry_wire() -> dict[str, Any]:
    return {"v": 1, "host": "h0003", "job": "job-1", "ts": 1767225610.0, "devices": {
        "gpu": {"ids": ["0", "1"], "values": {"gpu_util_pct": [89.5, 91.0],
                                              "gpu_temp_c": [36.0, 37.25]}},
        "nic": {"ids": ["mlx5_0"], "values": {"nic_ecn_per_s": [0.0]}},
        "host": {"ids": ["host"], "values": {}}}}


def log_wire() -> dict[str, Any]:
    return {"v": 1, "host": "h0003", "job": None, "ts": 12.5, "source": "kernel",
            "line": "NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus."}


def at(path: tuple[Any, ...], value: Any, drop: bool = False) -> Callable[[Any], None]:
    """A mutation setting (or deleting) the item at ``path``."""
    def mutate(d: Any) -> None:
        for k in path[:-1]:
            d = d[k]
        if drop:
            del d[path[-1]]
        else:
            d[path[-1]] = value
    return mutate


BAD_NUMBERS = [None, True, "1", -1, -0.5, NAN, INF, -INF, 10**30, [1.0]]
BAD_INTS = [None, True, False, 1.0, "3", -1, -(10**30), 10**30]
BAD_TEXT = [None, "", 7, b"h", "x" * 300, ["h"]]
HEAD = ([(("v",), v) for v in (0, 2, 1.0, True, "1", None)]
        + [(("host",), v) for v in BAD_TEXT] + [(("ts",), v) for v in BAD_NUMBERS + [0, 5, -0.0]]
        + [(("job",), v) for v in ("", "x" * 257, 3, b"j", None)])
OP = ("ranks", 0, "ops", 0)
CCL_CASES = HEAD + [
    (("ranks",), None), (("ranks",), {}), (("ranks",), ()), (("ranks", 0), [1]),
    (("ranks", 0), "r"), (("ranks", 0, "comm"), ""), (("ranks", 0, "comm"), "c" * 65),
    (("ranks", 0, "comm"), "c" * 64), (("ranks", 0, "comm"), 5),
    *[(("ranks", 0, "size"), v) for v in BAD_INTS + [0, 3, 4]],
    *[(("ranks", 0, "rank"), v) for v in BAD_INTS + [8, 7, 0]],
    *[(("ranks", 0, "gpu"), v) for v in BAD_INTS + [-2, -1]],
    *[(("ranks", 0, "last"), v) for v in BAD_NUMBERS + [0, 3, -0.0]],
    *[(("ranks", 0, "pending"), v) for v in (None, 4, [8], [-1], [True], [1.0], (1, 2), [])],
    (("ranks", 0, "ops"), None), (("ranks", 0, "ops"), ()), (("ranks", 0, "ops"), [[1]]),
    (OP, ("AllGather", 1, 1, 1, 1, 1.0, 1.0)), (OP, ["AllGather", 1, 1, 1, 1, 1.0]),
    (OP, ["AllGather", 1, 1, 1, 1, 1.0, 1.0, 1]), (OP, {"op": "x"}),
    *[((*OP, 0), v) for v in BAD_TEXT + ["o" * 33, "o" * 32]],
    *[((*OP, i), v) for i in (1, 2, 3, 4) for v in BAD_INTS + [0]],
    *[((*OP, i), v) for i in (5, 6) for v in BAD_NUMBERS + [0, 7, -0.0, 2**64]],
]
TELEMETRY_CASES: list[tuple[tuple[Any, ...], Any]] = HEAD + [
    (("devices",), None), (("devices",), []), (("devices", "disk"), {"ids": [], "values": {}}),
    (("devices", "gpu"), None), (("devices", "gpu", "ids"), None),
    (("devices", "gpu", "ids"), ["0", 1]), (("devices", "gpu", "ids"), ("0", "1")),
    (("devices", "gpu", "values"), None), (("devices", "gpu", "values"), []),
    (("devices", "gpu", "values", "gpu_util_pct"), [1.0]),
    (("devices", "gpu", "values", "gpu_util_pct"), (1.0, 2.0)),
    (("devices", "gpu", "values", "gpu_util_pct"), "12"),
    (("devices", "gpu", "values", "not_a_metric"), [1.0, 2.0]),
    *[(("devices", "gpu", "values", "gpu_util_pct"), [1.0, v])
      for v in (None, True, "1", NAN, INF, -5.0, 3, -3, 2**64)],
    (("devices", "gpu", "values", "gpu_util_pct"), [1, 2]),
]
LOG_CASES = HEAD + [
    (("source",), "syslog"), (("source",), None), (("source",), 3),
    (("line",), ""), (("line",), None), (("line",), "x" * 65537), (("line",), "x" * 65536),
]
DROPS = [("ranks", 0, "pending"), ("ranks", 0, "last"), ("ranks", 0, "gpu"), ("job",), ("v",),
         ("devices", "gpu", "ids"), ("host",), ("ts",)]


def checked(rtype: Any, obj: Any) -> Any:
    """What the checked path gives: the record, or (error class, message)."""
    try:
        return rtype.from_wire(obj)
    except Exception as e:  # the comparison covers whatever it raises
        return type(e).__name__, str(e)


def same(a: Any, b: Any) -> bool:
    """Equal field values of equal types (repr tells 1 from 1.0); NaN equals NaN here."""
    return repr(a) == repr(b) and bool(a == b or "nan" in repr(a))


def cases() -> list[tuple[type, Any]]:
    out: list[tuple[type, Any]] = []
    for rtype, base, table in ((CCLRecord, ccl_wire, CCL_CASES),
                               (TelemetryBatch, telemetry_wire, TELEMETRY_CASES),
                               (LogRecord, log_wire, LOG_CASES)):
        out.append((rtype, base()))
        for path, value in table:
            d = base()
            at(path, value)(d)
            out.append((rtype, d))
        for path in DROPS:
            d = base()
            try:
                at(path, None, drop=True)(d)
            except (KeyError, IndexError):
                continue
            out.append((rtype, d))
    return out


CASES = cases()


@pytest.mark.parametrize(("rtype", "obj"), CASES, ids=[f"{t.__name__}-{i}"
                                                       for i, (t, _) in enumerate(CASES)])
def test_fast_path_matches_the_checked_path(rtype: type, obj: Any) -> None:
    want = checked(rtype, copy.deepcopy(obj))
    got = codec._FAST[rtype](copy.deepcopy(obj))
    if got is not None:  # the fast path may only accept what the checked path accepts
        assert isinstance(want, rtype)
        assert same(got, want)
    try:
        data = msgpack.packb(obj, use_bin_type=True)
    except (OverflowError, TypeError, ValueError):
        return  # not representable on the wire
    decoded = codec.decode(rtype, data)
    over_wire = checked(rtype, msgpack.unpackb(data, raw=False, strict_map_key=True))
    if isinstance(over_wire, rtype):
        assert same(decoded, over_wire)
    else:
        assert isinstance(decoded, Exception)
        assert (type(decoded).__name__, str(decoded)) == over_wire


def test_valid_records_take_the_fast_path() -> None:
    for rtype, base in ((CCLRecord, ccl_wire), (TelemetryBatch, telemetry_wire),
                        (LogRecord, log_wire)):
        got = codec._FAST[rtype](base())
        assert got is not None and same(got, rtype.from_wire(base()))


def test_round_trip_of_encoded_records_is_exact() -> None:
    rec = CCLRecord.from_wire(ccl_wire())
    again = codec.decode_or_raise(CCLRecord, codec.encode(rec))
    assert same(again, rec) and hash(again.ranks[0].ops[0]) == hash(rec.ranks[0].ops[0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        again.ranks[0].ops[0].cl = 3  # type: ignore[misc]


def test_slot_setters_refuse_a_changed_record_shape() -> None:
    with pytest.raises(TypeError):
        codec._slot_setters(OpCounters, ("op", "cl", "wr", "wc", "seq", "td_us"))
    assert len(codec._slot_setters(RankSnapshot, tuple(
        f.name for f in dataclasses.fields(RankSnapshot)))) == 7
