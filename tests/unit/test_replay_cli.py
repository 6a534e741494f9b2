"""aegis replay / aegis dump: time parsing, record selection, merge order, CLI errors."""

from __future__ import annotations

import pytest

from processors import replay
from processors.dump import merge_streams, parse_time
from schemas.errors import ConfigError
from schemas.recording import RecordingEntry, RecordingWriter


@pytest.mark.parametrize("text,expected", [
    ("1767225600", 1767225600.0),
    ("1767225600.25", 1767225600.25),
    ("2026-01-01T00:00:00Z", 1767225600.0),
    ("2026-01-01T00:00:00z", 1767225600.0),
    ("2026-01-01T00:00:00", 1767225600.0),  # naive: UTC
    ("2026-01-01 01:00:00+01:00", 1767225600.0),
    ("2026-01-01T00:00:30.5Z", 1767225630.5),
])
def test_parse_time(text, expected):
    assert parse_time(text) == expected


@pytest.mark.parametrize("bad", ["yesterday", "", "2026-13-01T00:00:00Z"])
def test_parse_time_rejects(bad):
    with pytest.raises(ConfigError, match="ISO-8601"):
        parse_time(bad)


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_parse_time_rejects_what_is_not_a_time(bad):
    with pytest.raises(ConfigError, match="finite"):
        parse_time(bad)


def E(topic: str, ts: float, tag: str = "") -> RecordingEntry:
    return RecordingEntry(topic, "job", ts, tag.encode())


def test_merge_is_event_time_then_topic():
    ccl = [E("aegis.ccl", 1), E("aegis.ccl", 2)]
    logs = [E("aegis.logs", 1), E("aegis.logs", 1.5)]
    tel = [E("aegis.telemetry", 0.5), E("aegis.telemetry", 2)]
    out = list(merge_streams([iter(ccl), iter(logs), iter(tel)]))
    assert [(e.ts, e.topic) for e in out] == [
        (0.5, "aegis.telemetry"), (1, "aegis.ccl"), (1, "aegis.logs"), (1.5, "aegis.logs"),
        (2, "aegis.ccl"), (2, "aegis.telemetry")]


def test_merge_keeps_each_topics_own_order_when_time_goes_back():
    logs = [E("aegis.logs", 5, "a"), E("aegis.logs", 3, "b"), E("aegis.logs", 6, "c")]
    tel = [E("aegis.telemetry", t, str(t)) for t in (1, 4, 7)]
    out = list(merge_streams([iter(logs), iter(tel)]))
    assert [e.value for e in out if e.topic == "aegis.logs"] == [b"a", b"b", b"c"]
    assert [e.value for e in out if e.topic == "aegis.telemetry"] == [b"1", b"4", b"7"]
    assert len(out) == 6


def test_select_entries_by_job_and_half_open_range():
    ents = [RecordingEntry("aegis.logs", k, ts, b"") for k, ts in
            [("a", 1), ("b", 2), ("a", 3), ("a", 4)]]
    got = list(replay.select_entries(ents, "a", 1, 4))
    assert [(e.key, e.ts) for e in got] == [("a", 1), ("a", 3)]
    assert list(replay.select_entries(ents)) == ents


def test_expected_records_from_header(tmp_path):
    p = tmp_path / "x.aegis"
    with RecordingWriter(str(p), meta={"records": 7}):
        pass
    assert replay.expected_records(str(p), {"meta": {"records": 7}}) == 7
    assert replay.expected_records(str(p), {"meta": {}}) is None


@pytest.mark.parametrize("argv,code,needle", [
    ([], 2, "give a recording FILE"),
    (["--job", "j", "--from", "0"], 2, "give a recording FILE"),
    (["x.aegis", "--diff-json", "d.json"], 2, "need --policy"),
    (["/nonexistent/file.aegis"], 1, "no such file"),
    (["x.aegis", "--from", "never"], 2, "ISO-8601"),
    (["x.aegis", "--from", "20", "--to", "10"], 2, "range is empty"),
    (["x.aegis", "--from", "nan"], 2, "finite"),
])
def test_cli_errors(argv, code, needle, capsys):
    assert replay.main(argv) == code
    assert needle in capsys.readouterr().err


def test_bad_policy_is_a_usage_error(tmp_path, capsys):
    pol = tmp_path / "p.toml"
    pol.write_text("[zscore]\nwindow_z = 3\n")
    rec = tmp_path / "r.aegis"
    with RecordingWriter(str(rec)):
        pass
    assert replay.main([str(rec), "--policy", str(pol)]) == 2
    assert "unknown keys" in capsys.readouterr().err


def test_not_a_recording_is_bad_input(tmp_path, capsys):
    p = tmp_path / "junk.aegis"
    p.write_bytes(b"not msgpack at all")
    assert replay.main([str(p)]) == 1
    assert "recording" in capsys.readouterr().err


@pytest.mark.parametrize("text,needle", [
    ('{"hosts": 5}', "malformed"), ("not json", "not JSON"), ("[1, 2]", "not a JSON object"),
    ('{"hosts": [{"host": "h1", "gpu_nics": [3]}]}', "gpu_nics"),
])
def test_a_bad_inventory_file_is_a_usage_error(tmp_path, capsys, text, needle):
    """It gave a TypeError or JSONDecodeError traceback and exit 1 (wire audit)."""
    from processors import diagnose

    inv = tmp_path / "inv.json"
    inv.write_text(text)
    rec = tmp_path / "r.aegis"
    with RecordingWriter(str(rec)):
        pass
    assert replay.main([str(rec), "--inventory", str(inv)]) == 2
    assert needle in capsys.readouterr().err
    assert diagnose.main([str(rec), "--inventory", str(inv), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_a_bad_inventory_in_the_header_is_a_bad_recording(tmp_path, capsys):
    from processors import diagnose

    rec = tmp_path / "r.aegis"
    with RecordingWriter(str(rec), meta={"inventory": {"hosts": 5}}):
        pass
    assert diagnose.main([str(rec), "-o", str(tmp_path / "o")]) == 1
    assert "header inventory" in capsys.readouterr().err


def test_simulate_into_a_missing_folder_says_so(tmp_path, capsys):
    from producers.sim.cli import main as simulate

    assert simulate(["--out", str(tmp_path / "no" / "s.aegis"), "--duration", "2", "--quiet"]) == 1
    assert "cannot write" in capsys.readouterr().err


def test_entries_of_topics_that_are_no_input_are_counted_not_silent(tmp_path, capsys):
    """A recording holding a diagnoses topic or a stray topic: the summary says how many
    entries were ignored (they were skipped without a word; wire audit)."""
    from processors import diagnose

    rec = tmp_path / "r.aegis"
    with RecordingWriter(str(rec)) as w:
        w.emit_encoded("aegis.diagnoses", "j1", 1.0, b"{}")
        w.emit_encoded("someone.elses.topic", "j1", 2.0, b"\x00")
    for workers in (["--workers", "1"], ["--workers", "2"]):
        assert replay.main([str(rec), "-o", str(tmp_path / "o.jsonl"), *workers]) == 0
        assert "2 of topics that are no input (ignored)" in capsys.readouterr().err
    assert diagnose.main([str(rec), "-o", str(tmp_path / "d.jsonl")]) == 0
    assert "2 of topics that are no input (ignored)" in capsys.readouterr().err


def test_a_directory_is_no_recording(tmp_path, capsys):
    from processors import diagnose

    assert replay.main([str(tmp_path)]) == 1
    assert "is a directory" in capsys.readouterr().err
    assert diagnose.main([str(tmp_path), "-o", str(tmp_path / "o.jsonl")]) == 1
    assert "is a directory" in capsys.readouterr().err
