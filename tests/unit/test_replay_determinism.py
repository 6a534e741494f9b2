"""Replay is deterministic: the same records give byte-identical JSONL, run after run, and
the same bytes as ``aegis diagnose --no-finish`` (the same engine)."""

from __future__ import annotations

import pytest

from processors import diagnose, replay
from producers.sim.simulation import SimConfig, Simulation
from schemas.recording import RecordingWriter, read_recording
from schemas.records import Diagnosis
from sinks.jsonl import read_jsonl


@pytest.fixture(scope="module")
def hang_recording(tmp_path_factory: pytest.TempPathFactory) -> str:
    sim = Simulation(SimConfig(hosts=8, hosts_per_job=8, scenario="compute_hang", seed=2,
                               duration_s=240, fault_at_s=60))
    path = str(tmp_path_factory.mktemp("replay") / "hang.aegis")
    with RecordingWriter(path, meta=sim.header_meta()) as w:
        sim.run(w)
    return path


def test_replay_twice_is_byte_identical(hang_recording, tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert replay.main([hang_recording, "-o", str(a)]) == 0
    assert replay.main([hang_recording, "-o", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()
    kinds = {i.kind for i in read_jsonl(a) if isinstance(i, Diagnosis)}
    assert "hang_compute" in kinds


def test_replay_equals_diagnose_without_finish(hang_recording, tmp_path):
    a, b = tmp_path / "replay.jsonl", tmp_path / "diagnose.jsonl"
    assert replay.main([hang_recording, "-o", str(a)]) == 0
    assert diagnose.main([hang_recording, "--no-finish", "-o", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()


def test_job_filter_equals_a_file_of_that_job(hang_recording, tmp_path):
    header, entries = read_recording(hang_recording)
    ents = list(entries)
    job = ents[0].key
    only = tmp_path / "only.aegis"
    with RecordingWriter(str(only), meta=header["meta"]) as w:
        for e in ents:
            if e.key == job:
                w.emit_encoded(*e)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert replay.main([hang_recording, "--job", job, "-o", str(a)]) == 0
    assert replay.main([str(only), "-o", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()


def test_whatif_with_the_same_policy_is_empty(hang_recording, tmp_path, capsys):
    pol = tmp_path / "same.toml"
    pol.write_text("[zscore]\nwindow_s = 600.0\n")
    out, plain = tmp_path / "w.jsonl", tmp_path / "p.jsonl"
    code = replay.main([hang_recording, "--policy", str(pol), "--fail-on-diff", "-o", str(out),
                        "--diff-json", str(tmp_path / "d.json")])
    assert code == 0
    assert "no difference" in capsys.readouterr().out
    assert replay.main([hang_recording, "-o", str(plain)]) == 0
    assert out.read_bytes() == plain.read_bytes()  # two engines in one pass change nothing
