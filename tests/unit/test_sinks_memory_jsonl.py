"""In-memory and JSONL sinks: same contract, ids delivered once, JSONL round-trips."""

from __future__ import annotations

import io
from pathlib import Path

import orjson
import pytest

from schemas.errors import DecodeError
from schemas.records import Culprits, DeadLetter, Diagnosis, IsolationCommand
from sinks.base import GuardRefusal, Sink
from sinks.guard import Guard
from sinks.jsonl import JsonlSink, from_line, read_jsonl, to_line
from sinks.memory import MemorySink

D = Diagnosis(id="d1", job="j1", kind="critical_error", culprits=Culprits(("h1",)),
              evidence={"rule": "xid79", "actions": [["isolate_host", "h1"], ["restart_job", "j1"]]},
              confidence=0.95, event_ts=10.0, detected_ts=12.5, detector="logs", summary="Xid 79")
DL = DeadLetter(topic="aegis.logs", partition=1, offset=7, raw=b"\x00\x01", error="bad")
R = GuardRefusal("d1", "isolate_host", "h2", "blast_radius", "j1", "cap 2", 12.5)


def items() -> list:
    return [D, *Guard().decide(D).commands, R, DL]


@pytest.mark.parametrize("make", [MemorySink, lambda: JsonlSink(io.BytesIO())])
def test_sinks_follow_the_protocol(make) -> None:
    assert isinstance(make(), Sink)


def test_memory_sink_delivers_on_flush_and_dedupes_ids() -> None:
    s = MemorySink()
    s.setup()
    for it in items() + items():
        s.add(it)
    assert s.commands == [] and len(s.pending) == 10
    s.flush()
    assert s.diagnoses == [D] and [c.action for c in s.commands] == ["isolate_host", "restart_job"]
    assert s.refusals == [R, R] and s.dead_letters == [DL, DL] and s.duplicates == 2
    with pytest.raises(TypeError):
        s.add("nope")  # type: ignore[arg-type]


@pytest.mark.parametrize("item", items())
def test_jsonl_line_round_trips(item) -> None:
    line = to_line(item)
    assert line.endswith(b"\n") and b"\n" not in line[:-1]
    assert from_line(line) == item
    assert orjson.loads(line)["type"] in ("diagnosis", "command", "refusal", "dead_letter")


def test_jsonl_sink_writes_each_id_once(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with JsonlSink(out) as s:
        for it in items() + items():
            s.add(it)
        s.flush()
    got = list(read_jsonl(out))
    assert got == [*items(), R, DL]


def test_jsonl_sink_can_leave_out_refusals() -> None:
    buf = io.BytesIO()
    s = JsonlSink(buf, include_refusals=False, include_dead_letters=False)
    for it in items():
        s.add(it)
    s.flush()
    assert [orjson.loads(x)["type"] for x in buf.getvalue().splitlines()] == [
        "diagnosis", "command", "command"]


@pytest.mark.parametrize("bad", [b"{", b"[]", b'{"type": "nope"}', b'{"id": 1}'])
def test_jsonl_bad_lines_raise_decode_error(bad: bytes) -> None:
    with pytest.raises(DecodeError):
        from_line(bad)


def test_command_ids_are_stable() -> None:
    (iso, restart) = Guard().decide(D).commands
    assert iso == IsolationCommand(id="d1:isolate_host:h1", job="j1", action="isolate_host",
                                   target="h1", reason="critical_error by logs (xid79): Xid 79",
                                   diagnosis_id="d1", issued_at=12.5)
    assert restart.id == "d1:restart_job:j1"
