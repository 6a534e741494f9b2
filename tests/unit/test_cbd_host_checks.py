"""CBD single-host checks: health from facts, benchmarks judged against baseline and batch."""

from __future__ import annotations

from typing import Any

import pytest

from producers.cbd.checks_host import (
    CpuCheck,
    GpuBenchCheck,
    MeasureCheck,
    NvmlHealthCheck,
    ReadSpeedCheck,
    RowRemapCheck,
    XidCheck,
)
from producers.cbd.config import CbdConfig
from producers.cbd.model import CheckResult
from producers.cbd.targets import CommandResult, HostSpec, HostTarget
from tests.unit.test_cbd_config_checks import batch, gpu, make_ctx


class FakeTarget(HostTarget):
    """Answers every command with a fixed stdout (no process is started)."""

    def __init__(self, name: str, stdout: str = "{}") -> None:
        super().__init__(HostSpec(name, "local"))
        self.stdout = stdout
        self.argvs: list[list[str]] = []

    def run(self, argv: Any, timeout_s: float) -> CommandResult:
        self.argvs.append(list(argv))
        return CommandResult(0, self.stdout, "", 0.01)


def test_nvml_health_flags_lost_gpu_ecc_and_retirement() -> None:
    facts = batch()
    nv = facts["h2"]["nvml"]
    nv["gpu_lost"] = True
    nv["gpus"][1] = gpu(1, ecc_uncorrected_volatile=2, retired_pending=1, temp_c=95)
    nv["gpus"][2] = gpu(2, temp_c={"error": "nvmlDeviceGetTemperature: GPU is lost"})
    ctx = make_ctx(facts)
    assert NvmlHealthCheck().run(FakeTarget("h1"), ctx).status == "pass"
    r = NvmlHealthCheck().run(FakeTarget("h2"), ctx)
    assert r.status == "fail"
    for part in ("GPU lost", "gpu1: 2 uncorrectable ECC", "page retirement pending",
                 "gpu1: 95 C", "gpu2: temp_c: nvmlDeviceGetTemperature: GPU is lost"):
        assert part in r.reason


def test_nvml_missing_with_gpus_on_pci_fails_without_gpus_is_na() -> None:
    facts = batch()
    facts["h1"]["nvml"] = {"available": False, "reason": "NVML not available: driver gone"}
    r = NvmlHealthCheck().run(FakeTarget("h1"), make_ctx(facts))
    assert r.status == "fail" and "8 NVIDIA GPU(s) on PCI but NVML not available" in r.reason
    bare = batch(gpus=0, nvml=False)
    for check in (NvmlHealthCheck(), RowRemapCheck(), XidCheck(), GpuBenchCheck()):
        res = check.run(FakeTarget("h1"), make_ctx(bare))
        assert res.status == "not_applicable", check.name


@pytest.mark.parametrize("remap, status, text", [
    ({"correctable": 0, "uncorrectable": 1, "pending": True, "failure": False}, "fail",
     "row remap pending"),
    ({"correctable": 0, "uncorrectable": 9, "pending": False, "failure": True}, "fail",
     "row remap failure"),
    ({"correctable": 3, "uncorrectable": 0, "pending": False, "failure": False}, "pass", ""),
])
def test_row_remap(remap: dict[str, Any], status: str, text: str) -> None:
    facts = batch()
    facts["h1"]["nvml"]["gpus"][4] = gpu(4, remap=remap)
    r = RowRemapCheck().run(FakeTarget("h1"), make_ctx(facts))
    assert r.status == status and text in r.reason


def test_row_remap_not_supported_is_na() -> None:
    facts = batch()
    facts["h1"]["nvml"]["gpus"] = [gpu(i, remap=None) for i in range(8)]
    assert RowRemapCheck().run(FakeTarget("h1"), make_ctx(facts)).status == "not_applicable"


def test_xids_fatal_within_window_fail_benign_pass() -> None:
    facts = batch()
    facts["h1"]["xids"] = [{"bus": "0000:18:00", "xid": 63, "age_s": 60.0, "line": "..."}]
    facts["h2"]["xids"] = [{"bus": "0000:18:00", "xid": 79, "age_s": 120.0, "line": "..."}]
    facts["h3"]["xids"] = [{"bus": "0000:18:00", "xid": 48, "age_s": 200000.0, "line": "..."}]
    facts["h4"]["xids"] = None
    facts["h4"]["xids_reason"] = "/dev/kmsg not readable: Permission denied"
    ctx = make_ctx(facts)
    assert XidCheck().run(FakeTarget("h1"), ctx).status == "pass"
    r2 = XidCheck().run(FakeTarget("h2"), ctx)
    assert r2.status == "fail" and "79 on 0000:18:00" in r2.reason
    assert XidCheck().run(FakeTarget("h3"), ctx).status == "pass"  # outside the 1-day window
    assert XidCheck().run(FakeTarget("h4"), ctx).status == "not_applicable"


def test_measure_check_baseline_then_batch_median() -> None:
    facts = batch()
    ctx = make_ctx(facts, CbdConfig(baseline_ratio=0.8, compute_ratio=0.7))
    ctx.baseline = {"cpu_gflops": 100.0}
    low = CpuCheck().run(FakeTarget("h1", '{"gflops": 50.0, "n": 1024}'), ctx)
    assert low.status == "fail" and "below 0.8 x baseline 100" in low.reason
    ok = CpuCheck().run(FakeTarget("h1", '{"gflops": 90.0}'), ctx)
    assert ok.status == "pass"
    results = {h: CheckResult("cpu_matmul", "pass", "", {"gflops": v})
               for h, v in (("h1", 100.0), ("h2", 98.0), ("h3", 102.0), ("h4", 60.0))}
    judged = CpuCheck().compare(results, ctx)
    assert judged["h4"].status == "fail" and "batch median" in judged["h4"].reason
    assert all(judged[h].status == "pass" for h in ("h1", "h2", "h3"))


def test_measure_check_bad_output_is_error_not_pass() -> None:
    r = CpuCheck().run(FakeTarget("h1", "Traceback..."), make_ctx(batch()))
    assert r.status == "error"


def test_read_speed_na_without_paths_and_floor() -> None:
    ctx = make_ctx(batch())
    assert ReadSpeedCheck().run(FakeTarget("h1"), ctx).status == "not_applicable"
    ctx.config = CbdConfig(read_paths=["/data/ckpt"], read_min_mbps=500.0)
    t = FakeTarget("h1", '{"mbps": 120.0, "bytes": 1, "files": 1}')
    r = ReadSpeedCheck().run(t, ctx)
    assert r.status == "fail" and "120.0 MB/s below the required 500" in r.reason
    assert t.argvs[0][-4:] == ["read", "/data/ckpt", "--mb", "256"]


def test_gpu_bench_needs_torch_and_judges_per_gpu() -> None:
    facts = batch()
    ctx = make_ctx(facts)
    r = GpuBenchCheck().run(FakeTarget("h1"), ctx)
    assert r.status == "not_applicable" and "torch" in r.reason
    for f in facts.values():
        f["torch"] = True
    out = '{"available": true, "gpus": [{"index": 0, "tflops": 700.0, "hbm_gbps": 2900.0}]}'
    res = {h: GpuBenchCheck().run(FakeTarget(h, out), ctx) for h in ctx.hosts}
    slow = '{"available": true, "gpus": [{"index": 0, "tflops": 300.0, "hbm_gbps": 2900.0}]}'
    res["h3"] = GpuBenchCheck().run(FakeTarget("h3", slow), ctx)
    judged = GpuBenchCheck().compare(res, ctx)
    assert judged["h3"].status == "fail" and "gpu0 tflops 300" in judged["h3"].reason
    assert judged["h1"].status == "pass"


def test_measure_check_args() -> None:
    assert MeasureCheck(seconds=2.0).timeout_s == 20.0
