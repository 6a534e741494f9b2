"""Recording files: header, entries, every way of writing gives the same bytes, errors."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from producers.sim.simulation import SimConfig, Simulation
from schemas import codec
from schemas.errors import DecodeError, VersionError, WireError
from schemas.inventory import Inventory
from schemas.recording import (
    FORMAT,
    RecordingEntry,
    RecordingWriter,
    decode_entry,
    iter_records,
    read_recording,
)
from schemas.records import CCLRecord, LogRecord, TelemetryBatch


@pytest.fixture(scope="module")
def sim() -> Simulation:
    return Simulation(SimConfig(hosts=4, hosts_per_job=4, scenario="xid79", duration_s=40,
                                fault_at_s=20, init_s=3, watchdog_s=10, seed=5))


def write(sim: Simulation, path: Path, how: str, background: bool = True) -> None:
    with RecordingWriter(str(path), meta=sim.header_meta(), background=background) as w:
        if how == "run":
            sim.run(w)
        elif how == "encoded":
            for e in sim.iter_encoded():
                w.emit_encoded(*e)
        else:
            for topic, key, ts, rec in sim.iter_records():
                w.emit(topic, key, ts, rec)


@pytest.mark.parametrize("how,background", [("run", True), ("run", False), ("encoded", True),
                                            ("records", False)])
def test_round_trip_and_identical_bytes(sim: Simulation, tmp_path: Path, how: str,
                                       background: bool) -> None:
    ref = tmp_path / "ref.aegis"
    write(sim, ref, "run")
    path = tmp_path / f"{how}.aegis"
    write(sim, path, how, background)
    assert path.read_bytes() == ref.read_bytes()
    header, entries = read_recording(str(path))
    assert header["format"] == FORMAT and header["v"] == 1
    inv = Inventory.from_wire(header["meta"]["inventory"])
    assert set(inv.hosts) == {"h0000", "h0001", "h0002", "h0003"}
    got = list(entries)
    want = [RecordingEntry(*e) for e in sim.iter_encoded()]
    assert got == want


def test_decode_entries(sim: Simulation, tmp_path: Path) -> None:
    path = tmp_path / "r.aegis"
    write(sim, path, "run")
    kinds = set()
    for entry, rec in iter_records(str(path)):
        assert not isinstance(rec, WireError)
        assert codec.encode(rec) == entry.value and rec.key == entry.key
        kinds.add(type(rec))
    assert kinds == {TelemetryBatch, CCLRecord, LogRecord}
    bad = decode_entry(RecordingEntry("aegis.nope", "k", 1.0, b"\x80"))
    assert isinstance(bad, DecodeError)
    broken = decode_entry(RecordingEntry("aegis.logs", "k", 1.0, b"\xc1"))
    assert isinstance(broken, WireError)


def test_not_a_recording(tmp_path: Path) -> None:
    p = tmp_path / "x"
    p.write_bytes(msgpack.packb({"format": "something-else"}))
    with pytest.raises(DecodeError):
        read_recording(str(p))
    p.write_bytes(b"")
    with pytest.raises(DecodeError):
        read_recording(str(p))
    p.write_bytes(msgpack.packb({"format": FORMAT, "v": 9, "meta": {}}))
    with pytest.raises(VersionError):
        read_recording(str(p))


def test_truncated_and_malformed_entries(sim: Simulation, tmp_path: Path) -> None:
    path = tmp_path / "r.aegis"
    write(sim, path, "run")
    data = path.read_bytes()
    path.write_bytes(data[:-7])
    _, entries = read_recording(str(path))
    n = 0
    with pytest.raises(DecodeError):
        for _ in entries:
            n += 1
    assert n > 100
    path.write_bytes(msgpack.packb({"format": FORMAT, "v": 1, "meta": {}})
                     + msgpack.packb(["aegis.logs", "k", "not a number", b""]))
    with pytest.raises(DecodeError, match="entry 0"):
        list(read_recording(str(path))[1])


def test_writer_error_surfaces(tmp_path: Path) -> None:
    w = RecordingWriter(str(tmp_path / "w.aegis"))
    w._fh.close()  # the file goes away under the writer thread
    w.emit_encoded_batch([("aegis.logs", "k", 1.0, b"x")])
    with pytest.raises(ValueError):
        w.flush()
    with pytest.raises(ValueError):
        w.emit_encoded_batch([("aegis.logs", "k", 2.0, b"y")])
    with pytest.raises(ValueError):
        w.close()
    assert w._thread is not None and not w._thread.is_alive()
