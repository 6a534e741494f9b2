"""Parallel replay (one process per policy and detector) gives the serial replay's outputs,
byte for byte: with and without --finish, for a what-if pair of policies, with a job and
time selection, with dead letters, and (by falling back) when a detector crashes; for
``aegis replay`` and ``aegis diagnose`` alike."""

from __future__ import annotations

import dataclasses

import msgpack
import orjson
import pytest

from processors import replay
from processors.core.tdn import TDNDetector
from processors.diagnose import load_inventory
from processors.replay import replay_file
from processors.replay_parallel import Selection, default_workers, replay_parallel, tasks_for
from processors.settings import PipelineConfig
from producers.sim.simulation import SimConfig, Simulation
from schemas.codec import decode, encode
from schemas.recording import RecordingWriter, read_header, read_recording
from schemas.records import CCLRecord, TelemetryBatch
from schemas.topics import CCL, LOGS, TELEMETRY

WHATIF = "[zscore]\nwindow_s = 120.0\n[tdn]\npersist = 3\n"


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Several faults of several kinds on three jobs, plus undecodable messages, one CCL
    record from a host whose clock is a year ahead (the job clock refuses it) and a first
    telemetry record a year ahead (the job clock starts over at the next host's record)."""
    sim = Simulation(SimConfig(hosts=16, hosts_per_job=8, scenario="mixed", seed=11,
                               duration_s=300, fault_at_s=40, mixed_spacing_s=50,
                               mixed_scenarios=("nic_ecn", "slow_gpu", "xid79")))
    path = str(tmp_path_factory.mktemp("par") / "mixed.aegis")
    skewed = first = False
    with RecordingWriter(path, meta=sim.header_meta()) as w:
        for i, (topic, key, ts, value) in enumerate(sim.iter_encoded()):
            if topic == TELEMETRY.name and not first:  # the job's first record, a year ahead
                tel = decode(TelemetryBatch, value)
                w.emit_encoded(topic, key, ts, encode(dataclasses.replace(tel, ts=tel.ts + 3.2e7)))
                first = True
            w.emit_encoded(topic, key, ts, value)
            if i > 5000 and topic == CCL.name and not skewed:  # a host a year ahead
                rec = decode(CCLRecord, value)
                w.emit_encoded(topic, key, ts, encode(dataclasses.replace(rec, ts=rec.ts + 3.2e7)))
                skewed = True
            if i % 4000 == 17:  # garbage on each input topic, and an unrelated topic
                for t in (CCL.name, TELEMETRY.name, LOGS.name):
                    w.emit_encoded(t, key, ts, b"\xc1not msgpack")
                w.emit_encoded("aegis.other", key, ts, msgpack.packb({"x": 1}))
    return path


def _wire(run: replay.ReplayRun, i: int = 0) -> bytes:
    return b"\n".join(orjson.dumps(x.to_wire(), option=orjson.OPT_SORT_KEYS)
                      for x in run.outputs[i])


def _configs(tmp_path, whatif: bool) -> list[PipelineConfig]:
    if not whatif:
        return [PipelineConfig()]
    pol = tmp_path / "whatif.toml"
    pol.write_text(WHATIF)
    return [PipelineConfig(), PipelineConfig.from_toml(str(pol))]


@pytest.mark.parametrize("finish", [False, True])
@pytest.mark.parametrize("whatif", [False, True])
def test_parallel_equals_serial(mixed, tmp_path, finish, whatif):
    inv = load_inventory(None, read_header(mixed))
    configs = _configs(tmp_path, whatif)
    serial = replay_file(mixed, configs, inv, finish=finish, workers=1)
    assert serial.engines[0].stats.dead_letters > 0 and serial.engines[0].stats.ignored > 0
    assert any(x.kind != "healthy" for x in serial.outputs[0] if hasattr(x, "culprits"))
    for workers in ((2, 4) if finish and whatif else (3,)):
        par = replay_file(mixed, configs, inv, finish=finish, workers=workers)
        for i in range(len(configs)):
            assert _wire(par, i) == _wire(serial, i)
            assert par.engines[i].stats == serial.engines[i].stats
        assert (par.records, par.first_ts, par.last_ts, par.jobs) == (
            serial.records, serial.first_ts, serial.last_ts, serial.jobs)
    if whatif:
        assert _wire(serial, 0) != _wire(serial, 1)  # the what-if policy changes something


def test_selection_is_honoured(mixed):
    inv = load_inventory(None, read_header(mixed))
    _h, entries = read_recording(mixed)
    ents = list(entries)
    job, t0 = ents[0].key, ents[0].ts
    kw = {"job": job, "t_from": t0 + 60, "t_to": t0 + 400}
    serial = replay_file(mixed, [PipelineConfig()], inv, workers=1, **kw)
    par = replay_file(mixed, [PipelineConfig()], inv, workers=3, **kw)
    assert par.jobs == {job: serial.records} and 0 < serial.records < len(ents)
    assert _wire(par) == _wire(serial)


def test_a_detector_crash_falls_back_to_serial(mixed, monkeypatch):
    """The serial pipeline turns a crashed record into one dead letter for the whole topic;
    the split replay cannot, so it reports None and replay_file replays serially."""
    inv = load_inventory(None, read_header(mixed))
    original = TDNDetector.observe
    calls = {"n": 0}

    def flaky(self, rec):
        calls["n"] += 1
        if calls["n"] % 997 == 0:
            raise RuntimeError("boom")
        return original(self, rec)

    monkeypatch.setattr(TDNDetector, "observe", flaky)  # the forked workers inherit it
    run = replay.new_run([PipelineConfig()], inv)
    assert replay_parallel(Selection(mixed), [PipelineConfig()], run.engines, inv,
                           workers=2) is None
    assert run.outputs[0] == []  # nothing was routed
    calls["n"] = 0
    serial = replay_file(mixed, [PipelineConfig()], inv, workers=1)
    calls["n"] = 0
    par = replay_file(mixed, [PipelineConfig()], inv, workers=2)
    crashed = [x for x in serial.outputs[0] if getattr(x, "stage", "") == "process"]
    assert crashed and "boom" in crashed[0].error
    assert _wire(par) == _wire(serial)


def test_cli_workers_give_the_same_bytes(mixed, tmp_path):
    a, b = tmp_path / "serial.jsonl", tmp_path / "par.jsonl"
    assert replay.main([mixed, "--workers", "1", "-o", str(a)]) == 0
    assert replay.main([mixed, "--workers", "3", "-o", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes() and a.stat().st_size > 0


def test_diagnose_workers_give_the_same_bytes(mixed, tmp_path):
    from processors import diagnose

    a, b = tmp_path / "serial.jsonl", tmp_path / "par.jsonl"
    assert diagnose.main([mixed, "--workers", "1", "-o", str(a)]) == 0
    assert diagnose.main([mixed, "--workers", "4", "-o", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes() and a.stat().st_size > 0


def test_tasks_and_default_workers():
    names = [(t.kind, t.detectors) for t in tasks_for(1)]
    # telemetry's liveness check rides with the Z-score: only the CCL detectors split
    assert names == [("logs", ("tree",)), ("telemetry", ("zscore", "liveness")),
                     ("ccl", ("alignment",)), ("ccl", ("tdn",))]
    assert [(t.kind, t.detectors, t.order) for t in tasks_for(1, by_detector=False)] == [
        ("logs", ("tree",), 0), ("telemetry", ("zscore", "liveness"), 0),
        ("ccl", ("alignment", "tdn"), 0)]
    assert [t.slot for t in tasks_for(2)] == list(range(8))
    assert 1 <= default_workers(1) <= 4 and default_workers(2) <= 8


@pytest.mark.parametrize("by_detector", [False, True])
def test_both_splits_equal_serial(mixed, by_detector):
    inv = load_inventory(None, read_header(mixed))
    serial = replay_file(mixed, [PipelineConfig()], inv, finish=True, workers=1)
    run = replay.new_run([PipelineConfig()], inv)
    assert replay_parallel(Selection(mixed), [PipelineConfig()], run.engines, inv, finish=True,
                           workers=2, by_detector=by_detector) is not None
    assert _wire(run) == _wire(serial) and run.engines[0].stats == serial.engines[0].stats
    assert serial.engines[0].stats.rejections.get("clock_skew") == 2
