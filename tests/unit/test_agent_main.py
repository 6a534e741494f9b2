"""The agent loop body with a fake clock, the record building, and ``--once`` end to end."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from producers.agent.agent import Agent, build_groups
from producers.agent.collector import LogLine, Notices, Partial
from producers.agent.host import HostCollector, parse_cpu_line, parse_mem_used_pct
from producers.agent.jobs import FixedJob
from producers.agent.publisher import SpoolingPublisher
from producers.agent.simgpu import SimulatedGpuCollector
from producers.agent.spool import Spool
from schemas import topics
from schemas.codec import decode_or_raise
from schemas.records import LogRecord, TelemetryBatch

ROOT = Path(__file__).resolve().parents[2]


class Fixed:
    name = "fixed"

    def __init__(self, devices: dict[str, dict[str, dict[str, float]]], logs: list[LogLine] | None = None) -> None:
        self.devices, self.logs = devices, logs or []

    def collect(self, now: float) -> Partial:
        return Partial({k: {d: dict(v) for d, v in devs.items()} for k, devs in self.devices.items()},
                       list(self.logs))

    def close(self) -> None:
        pass


class Broken:
    name = "broken"

    def collect(self, now: float) -> Partial:
        raise RuntimeError("boom")

    def close(self) -> None:
        pass


class Capture:
    """A publisher stand-in that decodes what the agent publishes."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | str | None, bytes]] = []
        self.dropped = 0

    def publish(self, topic: str, key: str | bytes | None, value: bytes) -> bool:
        self.sent.append((topic, key, value))
        return True

    def pump(self, timeout: float = 0.0) -> None:
        pass

    def status(self) -> dict[str, object]:
        return {"dropped": self.dropped, "spool_policy": "oldest", "dropped_spool_full": self.dropped,
                "rejected": 0}


def test_groups_fill_missing_values_with_nan_and_drop_unknown_metrics() -> None:
    g = build_groups({"gpu": {"h/gpu10": {"gpu_temp_c": 60.0}, "h/gpu2": {"gpu_temp_c": 61.0,
                                                                          "gpu_power_w": 300.0,
                                                                          "not_a_metric": 1.0}}})
    gpu = g["gpu"]
    assert gpu.ids == ("h/gpu2", "h/gpu10")  # natural order
    assert list(gpu.values) == ["gpu_power_w", "gpu_temp_c"]  # catalogue order, catalogue only
    assert gpu.values["gpu_power_w"][0] == 300.0 and math.isnan(gpu.values["gpu_power_w"][1])


def test_step_publishes_batch_logs_heartbeats_and_notices() -> None:
    cap = Capture()
    fixed = Fixed({"host": {"h1": {"host_cpu_util_pct": 12.0}}},
                  [LogLine(0.5, "kernel", "NVRM: Xid (PCI:0000:18:00): 79, ...")])
    agent = Agent("h1", FixedJob("job9"), [fixed, Broken()], publisher=cap,  # type: ignore[arg-type]
                  notices=Notices(lambda _: None), interval=1.0, heartbeat_s=5.0)
    for t in [100.0 + 0.25 * i for i in range(41)]:  # ten seconds at 4 Hz
        agent.step(t)
    batches = [decode_or_raise(TelemetryBatch, v) for t, _, v in cap.sent if t == topics.TELEMETRY.name]
    logs = [decode_or_raise(LogRecord, v) for t, _, v in cap.sent if t == topics.LOGS.name]
    assert len(batches) == 11 and all(b.job == "job9" and b.host == "h1" for b in batches)
    assert {k for _, k, _ in cap.sent} == {"job9"}  # keyed by job
    beats = [r.line for r in logs if "heartbeat" in r.line]
    assert beats == ["aegis-agent heartbeat seq=1", "aegis-agent heartbeat seq=2",
                     "aegis-agent heartbeat seq=3"]
    notices = [r.line for r in logs if "notice" in r.line]
    assert notices == ["aegis-agent notice: collector broken failed: RuntimeError: boom"]
    assert sum("Xid" in r.line and r.source == "kernel" for r in logs) == 11


def test_records_are_keyed_by_host_without_a_job() -> None:
    cap = Capture()
    agent = Agent("h2", FixedJob(None), [Fixed({"host": {"h2": {"host_mem_used_pct": 5.0}}})],
                  publisher=cap)  # type: ignore[arg-type]
    agent.step(1.0)
    assert {k for _, k, _ in cap.sent} == {"h2"}


def test_spool_drops_are_reported_as_agent_log_records() -> None:
    cap = Capture()
    agent = Agent("h1", FixedJob("j"), [], publisher=cap, notices=Notices(lambda _: None))  # type: ignore[arg-type]
    agent.step(1.0)
    cap.dropped = 42
    agent.step(2.0)
    lines = [decode_or_raise(LogRecord, v).line for t, _, v in cap.sent if t == topics.LOGS.name]
    assert any(ln.startswith("aegis-agent spool dropped 42 records") for ln in lines)
    agent.step(3.0)
    assert sum("spool dropped" in decode_or_raise(LogRecord, v).line
               for t, _, v in cap.sent if t == topics.LOGS.name) == 1


def test_agent_with_real_spool_and_null_sink(tmp_path: Path) -> None:
    from producers.agent.publisher import NullProducer

    prod = NullProducer()
    pub = SpoolingPublisher(prod, Spool(tmp_path))
    agent = Agent("h1", FixedJob("j"), [SimulatedGpuCollector("h1", 8)], publisher=pub)
    for t in range(5):
        agent.step(float(t))
    pub.pump()
    assert prod.produced == agent.counts["telemetry"] + agent.counts["logs"]
    assert pub.spool.pending() == 0
    batch = agent.last_batch
    assert batch is not None and len(batch.devices["gpu"].ids) == 8
    assert "gpu_nvlink_tx_bps" in batch.devices["gpu"].values


def test_host_parsers(tmp_path: Path) -> None:
    assert parse_cpu_line("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n") == (1000, 850)
    assert parse_cpu_line("intr 1 2 3") is None
    assert parse_mem_used_pct("MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 250 kB\n") == 75.0
    assert parse_mem_used_pct("garbage") is None
    (tmp_path / "stat").write_text("cpu  100 0 0 900 0 0 0 0 0 0\n")
    (tmp_path / "meminfo").write_text("MemTotal: 100 kB\nMemAvailable: 40 kB\n")
    c = HostCollector("h", tmp_path)
    assert c.collect(0.0).devices == {"host": {"h": {"host_mem_used_pct": 60.0}}}
    (tmp_path / "stat").write_text("cpu  130 0 0 970 0 0 0 0 0 0\n")
    assert c.collect(1.0).devices["host"]["h"]["host_cpu_util_pct"] == 30.0


def test_host_collector_survives_missing_proc(tmp_path: Path) -> None:
    seen: list[str] = []
    c = HostCollector("h", tmp_path / "nope", Notices(seen.append))
    assert c.collect(0.0).devices == {} and c.collect(1.0).devices == {}
    assert len(seen) == 2  # stat and meminfo, once each


def test_once_without_nvml_prints_json_and_exits_0() -> None:
    r = subprocess.run([sys.executable, "-m", "producers.agent.main", "--once", "--sysfs-root",
                        "tests/data/sysfs", "--interval", "0.3", "--host", "h0017", "--job", "j1",
                        "--no-kernel-log"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "NVML not available" in r.stderr
    out = json.loads(r.stdout)
    batch = TelemetryBatch.from_wire(out["telemetry"])
    assert batch.host == "h0017" and batch.job == "j1"
    nic = batch.devices["nic"]
    assert nic.ids == tuple(f"h0017/nic{i}" for i in range(8))
    assert nic.values["nic_link_up"] == (1.0,) * 8 and nic.values["nic_tx_bps"] == (0.0,) * 8
    assert "host_mem_used_pct" in batch.devices["host"].values
    assert out["inventory"]["nics"]["h0017/nic0"] == "mlx5_0/1"
    assert out["inventory"]["nic_bus_ids"] == [""] * 8  # the fixture has no device links
    assert any(n.startswith("NVML not available") for n in out["notices"])


def test_once_with_simulated_gpus() -> None:
    r = subprocess.run([sys.executable, "-m", "producers.agent.main", "--once", "--sim-gpus", "8",
                        "--sysfs-root", "/nonexistent", "--interval", "0.2", "--no-kernel-log"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "RDMA not available" in r.stderr
    gpu = json.loads(r.stdout)["telemetry"]["devices"]["gpu"]
    assert len(gpu["ids"]) == 8 and "gpu_pcie_replay_per_s" in gpu["values"]


def test_ccl_snapshots_become_records_and_bad_datagrams_a_notice(tmp_path: Path) -> None:
    import socket

    from producers.agent.main import open_ccl

    seen: list[str] = []
    notices = Notices(seen.append)
    cap = Capture()
    job = FixedJob("j5")
    ccl = open_ccl(str(tmp_path / "ccl.sock"), "h1", job, notices)
    assert ccl is not None, seen
    agent = Agent("h1", job, [], ccl=ccl, publisher=cap, notices=notices)  # type: ignore[arg-type]
    vectors = ROOT / "schemas" / "vectors"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto((vectors / "ccl_v1_one_rank.bin").read_bytes(), str(tmp_path / "ccl.sock"))
        s.sendto((vectors / "ccl_v1_bad_magic.bin").read_bytes(), str(tmp_path / "ccl.sock"))
    agent.step(1_000.0)
    from schemas.records import CCLRecord

    recs = [decode_or_raise(CCLRecord, v) for t, _, v in cap.sent if t == topics.CCL.name]
    assert len(recs) == 1 and recs[0].host == "h1" and recs[0].job == "j5" and recs[0].ranks
    assert any("bad snapshot datagram" in m for m in seen)
    agent.close()


def test_missing_ccl_socket_dir_is_a_notice_not_a_crash(tmp_path: Path) -> None:
    from producers.agent.main import open_ccl

    seen: list[str] = []
    assert open_ccl(str(tmp_path / "no" / "such" / "dir" / "ccl.sock"), "h", FixedJob(None),
                    Notices(seen.append)) is None or seen == []


def test_a_clock_stepping_back_does_not_stop_sampling() -> None:
    cap = Capture()
    fixed = Fixed({"host": {"h1": {"host_cpu_util_pct": 12.0}}})
    agent = Agent("h1", FixedJob("j"), [fixed], publisher=cap, notices=Notices(lambda _: None),  # type: ignore[arg-type]
                  interval=1.0, heartbeat_s=5.0)
    for t in (1_000.0, 1_001.0, 1_002.0):
        agent.step(t)
    before = agent.counts["telemetry"]
    for t in (400.0, 401.0, 402.0, 405.0):  # NTP stepped wall time back 600 s
        agent.step(t)
    assert agent.counts["telemetry"] == before + 4  # one batch per interval, no 600 s gap
    assert agent.heartbeat_seq >= 3
