"""``aegis cbd`` on the local host (no namespaces needed): output, exit codes, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from processors.cbd_cli import main


def test_local_host_json_report(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    base = tmp_path / "baseline.json"
    rc = main(["--hosts", "h0=local", "--profile", "light", "--json", "--quiet",
               "--batch", "b1", "--save-baseline", str(base),
               "--only", "nccl_env,nvml_health,probe_mesh"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["verdict"] == "deliver" and doc["deliver"] == ["h0"]
    statuses = {r["check"]: r["status"] for r in doc["hosts"]["h0"]["results"]}
    assert statuses["nccl_env"] == "pass"
    assert statuses["probe_mesh"] == "not_applicable"  # one host: nothing to probe
    assert json.loads(base.read_text()) == {}


def test_required_env_missing_holds_and_exits_1(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    cfg = tmp_path / "cbd.toml"
    cfg.write_text('required_env = ["NCCL_CBD_UNIT_TEST_REQUIRED"]\n')
    rc = main(["--hosts", "h0=local", "--config", str(cfg), "--only", "nccl_env", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 1 and "HOLD" in out and "NCCL_CBD_UNIT_TEST_REQUIRED is not set" in out


@pytest.mark.parametrize("args, err", [
    (["--only", "no_such_check"], "unknown check"),
    (["--mass-share", "1.5"], "mass_share"),
    (["--config", "/nonexistent.toml"], "cannot read"),
    (["--mode", "agents"], "needs --kafka"),
])
def test_usage_errors_exit_2(args: list[str], err: str, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AEGIS_KAFKA_BOOTSTRAP", raising=False)
    rc = main(["--hosts", "h0=local addr=127.0.0.1", "--quiet", "--kafka", "", *args])
    assert rc == 2 and err in capsys.readouterr().err
