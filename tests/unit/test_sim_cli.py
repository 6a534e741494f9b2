"""``aegis simulate`` body: listing, usage errors, a small run with its side files, Kafka."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import orjson
import pytest

from producers.sim import cli
from schemas.recording import read_recording


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) >= 12
    names = [ln.split("\t")[0] for ln in lines]
    assert "healthy" in names and "xid79" in names and "mixed" in names
    assert all("\t" in ln and ln.split("\t")[1] for ln in lines)


def test_unknown_scenario_lists_valid_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--scenario", "bogus", "--out", "x"]) == 2
    err = capsys.readouterr().err
    assert "bogus" in err and "xid79" in err and "healthy" in err


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--scenario", "xid79"]) == 2  # no --out
    assert cli.main(["--hosts", "2", "--scenario", "slow_link", "--out", "x"]) == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["--hosts", "many"])
    assert e.value.code == 2


def test_run_writes_recording_truth_and_inventory(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.aegis"
    rc = cli.main(["--hosts", "8", "--hosts-per-job", "4", "--scenario", "xid79", "--seed", "1",
                   "--duration", "60", "--fault-at", "30", "--out", str(out)])
    assert rc == 0
    assert "sim s" in capsys.readouterr().err  # the progress bar
    header, entries = read_recording(str(out))
    assert header["meta"]["scenario"] == "xid79" and header["meta"]["inventory"]["hosts"]
    assert sum(1 for _ in entries) > 1000
    truth = orjson.loads((tmp_path / "run.aegis.truth.json").read_bytes())
    assert truth["format"] == "aegis-truth" and truth["faults"][0]["scenario"] == "xid79"
    inv = orjson.loads((tmp_path / "run.aegis.inventory.json").read_bytes())
    assert len(inv["hosts"]) == 8


def test_kafka_out_uses_the_lead_sink(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, Any] = {"records": 0}

    class Sink:
        def emit(self, topic: str, key: str, ts: float, record: Any) -> None:
            seen["records"] += 1

        def close(self) -> None:
            seen["closed"] = True

    def make_kafka_sink(bootstrap: str) -> Sink:
        seen["bootstrap"] = bootstrap
        return Sink()

    mod = types.ModuleType("producers.sim.kafka_out")
    mod.make_kafka_sink = make_kafka_sink  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "producers.sim.kafka_out", mod)
    truth = tmp_path / "t.json"
    rc = cli.main(["--hosts", "2", "--duration", "10", "--out", "kafka", "--bootstrap",
                   "broker:9092", "--truth", str(truth), "--quiet"])
    assert rc == 0 and seen["bootstrap"] == "broker:9092" and seen["closed"]
    assert seen["records"] > 20 and truth.exists()


def test_mixed_and_naming_options(tmp_path: Path) -> None:
    out = tmp_path / "mix.aegis"
    rc = cli.main(["--hosts", "12", "--hosts-per-job", "4", "--scenario", "mixed", "--duration",
                   "60", "--fault-at", "20", "--mixed-spacing", "3", "--mixed-faults", "3",
                   "--mixed-scenarios", "xid79, slow_link,nic_ecn", "--mixed-cover-all",
                   "--name-prefix", "r1-", "--heartbeat", "0", "--quiet", "--out", str(out)])
    assert rc == 0
    truth = orjson.loads((tmp_path / "mix.aegis.truth.json").read_bytes())
    assert sorted(f["scenario"] for f in truth["faults"]) == ["nic_ecn", "slow_link", "xid79"]
    assert [f["start_ts"] - truth["start_ts"] for f in truth["faults"]] == [20, 23, 26]
    assert all(f["job"].startswith("r1-job-") for f in truth["faults"])
    header, entries = read_recording(str(out))
    assert header["meta"]["config"]["name_prefix"] == "r1-"
    assert not any(b"aegis-agent heartbeat" in e[3] for e in entries)
    bad = ["--hosts", "4", "--scenario", "mixed", "--mixed-scenarios", "nope", "--out", "x"]
    assert cli.main(bad) == 2
