"""The log classifier on real public log lines (tests/data/log_lines.jsonl, each with its URL),
field extraction, policy overrides and robustness on junk input."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from processors.core.log_classifier import LogEvent, classify
from processors.core.xid_policy import CATEGORIES, SEVERITIES, XidPolicy
from schemas.inventory import HostInventory

DATA = Path(__file__).resolve().parents[1] / "data" / "log_lines.jsonl"
CASES = [json.loads(x) for x in DATA.read_text(encoding="utf-8").splitlines() if x.strip()]


def _id(case: dict) -> str:
    return f"{case['expect']['category']}:{case['line'][:40]}"


def test_dataset_is_real_and_broad() -> None:
    assert len(CASES) >= 60
    per_cat = Counter(c["expect"]["category"] for c in CASES)
    assert set(per_cat) == set(CATEGORIES)
    assert all(n >= 3 for n in per_cat.values()), per_cat
    for c in CASES:
        assert c["source_url"].startswith("https://"), c
        assert c["expect"]["severity"] in SEVERITIES


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_real_line(case: dict) -> None:
    e = classify(case["line"])
    x = case["expect"]
    assert (e.category, e.severity, e.xid) == (x["category"], x["severity"], x["xid"]), e


@pytest.mark.parametrize("line,bus", [
    ("[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.", "0000:02:00.0"),
    ("NVRM: Xid (PCI:0004:01:00): 119, pid=430, name=nv_queue, Timeout waiting for RPC from GSP!",
     "0004:01:00.0"),
    ("NVRM: Xid (PCI:0000:3B:00): 48, An uncorrectable double bit error (DBE) has been detected",
     "0000:3b:00.0"),
])
def test_xid_bus_id_is_normalised(line: str, bus: str) -> None:
    assert classify(line).pci_bus_id == bus


def test_gpu_index_comes_from_the_host_inventory() -> None:
    inv = HostInventory("h1", gpu_bus_ids=("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"))
    line = "[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."
    e = classify(line, "kernel", inv)
    assert (e.gpu, e.action, e.rule) == (1, "isolate_host", "xid_79")
    assert classify(line).gpu is None


@pytest.mark.parametrize("line,peer,rank", [
    ("gpu-server320 [5] misc/socket.cc:46 NCCL WARN socketProgressOpt: Call to send to "
     "10.44.137.149<52905> failed : Connection reset by peer", "10.44.137.149:52905", None),
    ("NCCL WARN socketProgress: Connection closed by remote peer node2<42830>", "node2:42830", None),
    ("NCCL WARN NET/IB : Got completion from peer xxx.xxx.xxx.xxx<55921> with status=12 opcode=1 "
     "len=0 vendor err 129 (Send) localGid ::ffff:29.87.4.221 remoteGids::ffff:29.87.88.182",
     "29.87.88.182", None),
    ("[rank3]:[E1206 18:44:13.275158817 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught "
     "collective operation timeout: WorkNCCL(SeqNum=7753, OpType=_REDUCE_SCATTER_BASE, "
     "NumelIn=544997376, NumelOut=68124672, Timeout(ms)=600000) ran for 600089 milliseconds "
     "before timing out.", None, 3),
])
def test_peer_and_rank(line: str, peer: str | None, rank: int | None) -> None:
    e = classify(line)
    assert e.category == "distributed_symptom"
    assert (e.peer, e.rank) == (peer, rank)


def test_nvlink5_line_says_its_own_severity() -> None:
    fatal = "NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6)"
    nonfatal = "NVRM: Xid (PCI:0000:5f:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 02"
    assert classify(fatal).severity == "fatal"
    assert classify(nonfatal).severity == "degraded"


def test_policy_override_changes_classification(tmp_path) -> None:
    f = tmp_path / "p.toml"
    f.write_text('[xid.94]\nseverity = "degraded"\naction = "restart_job"\n')
    line = "NVRM: Xid (PCI:0000:9b:00): 94, pid=1234, name=python3, Contained ECC error"
    assert classify(line).severity == "fatal"
    e = classify(line, policy=XidPolicy.load(str(f)))
    assert (e.severity, e.action) == ("degraded", "restart_job")


@pytest.mark.parametrize("line", [
    "", " ", "\n", "\x00\x01\x02", "\ufffd" * 1000, "Xid" * 10000, "NVRM: Xid (PCI:",
    "NCCL WARN " + "<" * 5000, "a" * 2_000_000, "NVRM: Xid (PCI:zzzz:zz:zz): 79",
    "[ 0] " * 3000 + "AER", "peer " + "1." * 4000 + "<1>", "CUDA error: \udcff\udcfe",
])
def test_never_raises_on_junk(line: str) -> None:
    e = classify(line)
    assert isinstance(e, LogEvent)
    assert e.category in CATEGORIES and e.severity in SEVERITIES


def test_never_raises_on_random_bytes() -> None:
    rnd = random.Random(7)
    for _ in range(500):
        raw = bytes(rnd.randrange(256) for _ in range(rnd.randrange(300)))
        e = classify(raw.decode("utf-8", "replace"))
        assert e.category in CATEGORIES
        assert classify(raw).category in CATEGORIES  # type: ignore[arg-type]


def test_to_dict_has_the_documented_fields() -> None:
    d = classify("NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.").to_dict()
    for k in ("category", "severity", "xid", "pci_bus_id", "gpu", "peer", "peer_rank", "rule"):
        assert k in d


# ---- the `aegis classify-log` command ----------------------------------------------------
def test_cli_writes_one_object_per_line(tmp_path, capsysbinary) -> None:
    from processors.classify_log import main

    log = tmp_path / "k.log"
    log.write_bytes(b"[155044.078590] NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.\n"
                    b"\xff\xfe junk\n\n iteration 1/ 10 | lm loss: 2.5 |\r\n")
    inv = tmp_path / "inv.json"
    inv.write_text(json.dumps({"hosts": [{"host": "h1", "gpu_bus_ids": ["0000:05:00.0", "0000:06:00.0"]}]}))
    assert main([str(log), "--inventory", str(inv)]) == 0
    rows = [json.loads(x) for x in capsysbinary.readouterr().out.splitlines()]
    assert len(rows) == 4
    assert (rows[0]["category"], rows[0]["xid"], rows[0]["gpu"], rows[0]["pci_bus_id"]) == (
        "critical_gpu", 79, 1, "0000:06:00.0")
    assert all(r["category"] == "other" for r in rows[1:])


def test_cli_exit_codes(tmp_path, capsys) -> None:
    from processors.classify_log import main

    log = tmp_path / "a.log"
    log.write_text("hello\n")
    assert main([str(log), str(tmp_path / "missing.log")]) == 1
    assert "cannot read" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[xid.1]\ncategory = 'nope'\n")
    assert main(["--policy", str(bad), str(log)]) == 2
    assert main(["--no-such-flag"]) == 2
    assert main(["--help"]) == 0
