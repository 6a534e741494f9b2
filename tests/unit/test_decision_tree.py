"""Aegis Phase 1 decision tree on LogRecords built from real public log formats
(tests/data/log_lines.jsonl has each format with its source URL)."""

from __future__ import annotations

import orjson
import pytest

from processors.core.decision_tree import DecisionTree, DecisionTreeConfig
from schemas.errors import ConfigError
from schemas.inventory import HostInventory, Inventory
from schemas.records import LogRecord

JOB = "j1"
BUSES = tuple(f"0000:{b:02x}:00.0" for b in (0x06, 0x07, 0x09, 0x0a, 0x3b, 0x5f, 0x9b, 0xcb))


def inventory(n_hosts: int) -> Inventory:
    inv = Inventory()
    for h in range(n_hosts):
        ips = tuple(f"10.0.{h}.{10 + g}" for g in range(8))  # one data-plane IP per NIC/GPU
        inv.add_host(HostInventory(f"h{h:02d}", ips, BUSES, tuple(f"mlx5_{g}" for g in range(8))))
    inv.jobs[JOB] = tuple(f"h{h:02d}" for h in range(n_hosts))
    inv.ranks[JOB] = {h * 8 + g: (f"h{h:02d}", g) for h in range(n_hosts) for g in range(8)}
    return inv


def ip(h: int, g: int = 0) -> str:
    return f"10.0.{h}.{10 + g}"


# Formats from: open-gpu-kernel-modules#461 / NVIDIA forum 49452 (Xid 79), LlamaFactory#7396
# (watchdog), NVIDIA/nccl#1920 (reset), nccl#1612 (closed), nccl-tests#252 (IB completion),
# ml-engineering debug.md (Xid 63), gpu-burn#1 (AER), nccl-tests#185 (ibv_modify_qp),
# nccl#1176 (message truncated), NVSentinel#768 (DCGM).
def xid79(bus: str = "0000:06:00") -> str:
    return f"[155044.078590] NVRM: Xid (PCI:{bus}): 79, GPU has fallen off the bus."


def xid48(bus: str) -> str:
    return (f"NVRM: Xid (PCI:{bus}): 48, pid='<unknown>', name=<unknown>, An uncorrectable double "
            "bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fdf0de80 "
            "partition 5, subpartition 1")


def watchdog(rank: int) -> str:
    return (f"[rank{rank}]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog "
            "caught collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, "
            "NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) ran for 600060 "
            "milliseconds before timing out.")


def reset(peer_ip: str) -> str:
    return (f"gpu-server320 [5] misc/socket.cc:46 NCCL WARN socketProgressOpt: Call to send to "
            f"{peer_ip}<52905> failed : Connection reset by peer")


def closed(peer_ip: str) -> str:
    return f"[0] misc/socket.cc:71 NCCL WARN socketProgress: Connection closed by remote peer {peer_ip}<36138>"


def ib_completion(peer_ip: str) -> str:
    """A link's failure: error 12, retry exceeded (NVIDIA/nccl#1434's form)."""
    return (f"kolyoz2:25146:25854 [0] ib_plugin.c:1105 NCCL WARN NET/IB : Got completion from peer "
            f"{peer_ip}<49189> with error 12, opcode 0, len 0, vendor err 129 (Send)")


def ib_local_protection(peer_ip: str) -> str:
    """Error 4, local protection (nccl-tests#252): ACS or the IOMMU on the reporter."""
    return (f"kolyoz2:25146:25854 [0] ib_plugin.c:1105 NCCL WARN NET/IB : Got completion from peer "
            f"{peer_ip}<49189> with error 4, opcode 5327, len 5327, vendor err 81 (Send)")


XID63 = ("NVRM: Xid (PCI:0000:06:00): 63, pid=1896, Row Remapper: New row marked for remapping, "
         "reset gpu to activate.")
XID92 = "NVRM: Xid (PCI:0000:06:00): 92, pid=1896, High single-bit ECC error rate"
AER_CORRECTED = ("[74785.660380] pcieport 0000:00:02.0: PCIe Bus Error: severity=Corrected, "
                 "type=Data Link Layer, id=0010(Transmitter ID)")
DCGM_POWER = ("GpuPowerWatchIsNotHealthy Message=ErrorCode:DCGM_FR_CLOCK_THROTTLE_POWER GPU:0 "
              "PCI:0000:0f:00.0 Detected clocks event due to power violation in GPU 0. Recommended "
              "Action=NONE;")
QP_FAIL = "misc/ibvwrap.cc:187 NCCL WARN Call to ibv_modify_qp failed with error Network is unreachable"
TRUNCATED = "bootstrap.cc:142 NCCL WARN Message truncated : received 256 bytes instead of 4"
NVML_MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"  # shine-cluster#30
TRAINING = (" iteration      122/  250000 | consumed samples:       124928 | elapsed time per "
            "iteration (ms): 86545.2 | learning rate: 9.150E-06 | lm loss: 2.504220E+00 |")


def rec(ts: float, host: str, line: str, source: str = "training") -> LogRecord:
    return LogRecord(host=host, ts=ts, source=source, line=line, job=JOB)


def run(tree: DecisionTree, records: list[LogRecord], until: float | None = None) -> list:
    out = []
    for r in sorted(records, key=lambda r: r.ts):
        out.extend(tree.observe(r).diagnoses)
    if until is not None:
        out.extend(tree.advance(until).diagnoses)
    return out


def xid79_then_timeouts(n: int = 8) -> list[LogRecord]:
    recs = [rec(99.0 + 0.1 * h, f"h{h:02d}", TRAINING) for h in range(n)]
    recs.append(rec(100.0, "h03", xid79(), "kernel"))
    recs += [rec(100.5 + 0.2 * h, f"h{h:02d}", watchdog(h * 8)) for h in range(n) if h != 3]
    recs += [rec(101.0 + 0.1 * h, f"h{h:02d}", closed(ip(3))) for h in (2, 4)]
    return recs


def test_xid79_isolates_only_that_host_and_restarts() -> None:
    tree = DecisionTree(JOB, inventory=inventory(8))
    diags = run(tree, xid79_then_timeouts(), until=200.0)
    assert len(diags) == 1
    d = diags[0]
    assert d.kind == "critical_error"
    assert d.culprits.hosts == ("h03",)
    assert d.evidence["actions"] == [["isolate_host", "h03"], ["restart_job", JOB]]
    assert d.evidence["path"] == ["CriticalError:hit"]
    assert d.evidence["attributed"] == 9  # 7 watchdog timeouts + 2 connection closures
    assert d.event_ts == 100.0
    assert d.evidence["lines"][0]["host"] == "h03"


def test_double_bit_ecc_isolates_the_gpu() -> None:
    tree = DecisionTree(JOB, inventory=inventory(4))
    recs = [rec(10.0, "h01", xid48("0000:3b:00"), "kernel")]
    recs += [rec(11.0, f"h{h:02d}", watchdog(h * 8)) for h in (0, 2, 3)]
    (d,) = run(tree, recs, until=60.0)
    assert d.kind == "critical_error"
    assert d.culprits.gpus == ("h01/gpu4",) and d.culprits.hosts == ()
    assert ["isolate_gpu", "h01/gpu4"] in d.evidence["actions"]


def test_settle_window_waits_for_the_host_that_crashed_first() -> None:
    tree = DecisionTree(JOB, DecisionTreeConfig(settle_s=5.0), inventory(4))
    early = [rec(100.0, "h00", reset(ip(1))), rec(100.5, "h02", watchdog(16)),
             rec(101.0, "h01", closed(ip(0)))]
    assert run(tree, early) == []
    assert tree.observe(rec(103.0, "h03", xid79(), "kernel")).diagnoses == []
    assert tree.advance(104.9).diagnoses == []
    (d,) = tree.advance(105.0).diagnoses
    assert d.kind == "critical_error" and d.culprits.hosts == ("h03",)
    assert d.detected_ts == 105.0 and d.event_ts == 100.0


def test_two_host_connection_reset_isolates_both() -> None:
    tree = DecisionTree(JOB, inventory=inventory(2))
    recs = [rec(50.0, "h00", reset(ip(1, 2))), rec(50.2, "h01", closed(ip(0, 2)))]
    (d,) = run(tree, recs, until=100.0)
    assert d.kind == "dist_error"
    assert d.culprits.hosts == ("h00", "h01")
    assert d.evidence["path"] == ["CriticalError:miss", "DistError:2hosts"]
    assert d.evidence["actions"] == [["isolate_host", "h00"], ["isolate_host", "h01"],
                                     ["restart_job", JOB]]


def test_sixteen_hosts_root_is_the_gpu_whose_connections_fail_first() -> None:
    tree = DecisionTree(JOB, inventory=inventory(16))
    centre = ip(7, 3)  # h07's NIC/GPU 3
    recs = [rec(200.0 + 0.05 * h, f"h{h:02d}", ib_completion(centre)) for h in range(16) if h != 7]
    recs += [rec(200.9, "h07", ib_completion(ip(h, 3))) for h in (1, 9)]
    recs += [rec(202.0 + 0.1 * h, f"h{h:02d}", watchdog(h * 8 + 3)) for h in range(16)]
    recs += [rec(203.0, "h12", reset(ip(5, 3)))]  # an unrelated later failure
    (d,) = run(tree, recs, until=300.0)
    assert d.kind == "dist_error"
    assert d.culprits.gpus == ("h07/gpu3",)
    assert d.evidence["path"] == ["CriticalError:miss", "DistError:16hosts", "RootDiag:hit"]
    assert d.evidence["actions"][0] == ["isolate_gpu", "h07/gpu3"]


def test_silent_host_is_the_root_when_everyone_else_times_out() -> None:
    tree = DecisionTree(JOB, inventory=inventory(6))
    recs = [rec(10.0 + 0.5 * h, f"h{h:02d}", watchdog(h * 8)) for h in range(6) if h != 4]
    (d,) = run(tree, recs, until=100.0)
    assert d.evidence["path"][-1] == "RootDiag:silent_host"
    assert d.culprits.hosts == ("h04",)


def test_correctable_ecc_storm_never_isolates() -> None:
    tree = DecisionTree(JOB, inventory=inventory(2))
    recs = []
    for i in range(300):
        for line in (XID63, XID92, AER_CORRECTED, DCGM_POWER, TRAINING):
            recs.append(rec(1000.0 + i * 0.5, "h00" if i % 2 else "h01", line, "kernel"))
    assert run(tree, recs, until=5000.0) == []
    assert tree.snapshot()["burst"] == []


def test_same_config_error_everywhere_is_config_without_isolation() -> None:
    tree = DecisionTree(JOB, inventory=inventory(4))
    recs = [rec(5.0 + 0.3 * h, f"h{h:02d}", QP_FAIL) for h in range(4)]
    recs += [rec(6.0 + 0.3 * h, f"h{h:02d}", watchdog(h * 8)) for h in range(4)]
    (d,) = run(tree, recs, until=60.0)
    assert d.kind == "config"
    assert d.culprits.hosts == () and d.culprits.gpus == ()
    assert d.evidence["actions"] == []
    assert d.evidence["path"][-1] == "ConfigCheck:hit" and d.evidence["systemic"] is True


def test_version_mismatch_everywhere_recommends_rollback() -> None:
    tree = DecisionTree(JOB, inventory=inventory(4))
    recs = [rec(5.0 + 0.3 * h, f"h{h:02d}", NVML_MISMATCH) for h in range(4)]
    (d,) = run(tree, recs, until=60.0)
    assert d.kind == "config"
    assert d.evidence["actions"] == [["rollback_update", JOB]]


def test_message_truncated_everywhere_is_config_without_rollback() -> None:
    """Ranks that disagree on a message's size (NVIDIA/nccl#605: invalid usage) are the job's
    calls or settings, not an update to roll back."""
    tree = DecisionTree(JOB, inventory=inventory(4))
    recs = [rec(5.0 + 0.3 * h, f"h{h:02d}", TRUNCATED) for h in range(4)]
    (d,) = run(tree, recs, until=60.0)
    assert d.kind == "config" and d.evidence["config_rule"] == "nccl_message_truncated"
    assert d.evidence["actions"] == []


def test_incident_is_diagnosed_once_until_quiet() -> None:
    cfg = DecisionTreeConfig(settle_s=5.0, quiet_s=60.0)
    tree = DecisionTree(JOB, cfg, inventory(8))
    diags = run(tree, xid79_then_timeouts())
    diags += run(tree, [rec(110.0 + 5 * i, "h05", watchdog(40)) for i in range(10)])
    assert len(diags) == 1
    later = run(tree, [rec(400.0, "h01", reset(ip(2))), rec(400.5, "h02", closed(ip(1)))], 500.0)
    assert len(later) == 1 and later[0].kind == "dist_error"
    assert later[0].id != diags[0].id


def test_no_pattern_goes_offline() -> None:
    tree = DecisionTree(JOB, inventory=inventory(6))
    recs = [rec(10.0 + 0.5 * h, f"h{h:02d}", watchdog(h * 8)) for h in range(6)]
    assert run(tree, recs, until=134.9) == []  # OfflineDiag waits offline_wait_s for Phase 2
    (d,) = tree.advance(135.0).diagnoses
    # the evidence began when the timed-out collective did: "ran for 600060 milliseconds"
    assert d.kind == "offline_needed" and d.detected_ts == 135.0
    assert d.event_ts == pytest.approx(10.0 - 600.06)
    assert d.evidence["path"][-1] == "OfflineDiag"
    assert d.evidence["actions"] == [["run_offline_diag", JOB]]


def test_cuda_oom_is_the_applications_fault() -> None:
    tree = DecisionTree(JOB, inventory=inventory(4))
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 has a "
           "total capacity of 31.47 GiB of which 12.73 GiB is free.")
    recs = [rec(10.0, "h02", oom)] + [rec(11.0, f"h{h:02d}", closed(ip(2))) for h in (0, 1, 3)]
    (d,) = run(tree, recs, until=100.0)
    assert d.kind == "config" and d.evidence["path"][-1] == "AppError:hit"
    assert not any(a[0].startswith("isolate") for a in d.evidence["actions"])


@pytest.mark.parametrize("cut", [3, 9, 14])
def test_snapshot_restore_mid_burst_gives_identical_outputs(cut: int) -> None:
    inv = inventory(8)
    recs = sorted(xid79_then_timeouts(), key=lambda r: r.ts)
    whole = run(DecisionTree(JOB, inventory=inv), recs, until=300.0)
    first = DecisionTree(JOB, inventory=inv)
    part = run(first, recs[:cut])
    state = orjson.loads(orjson.dumps(first.snapshot()))
    second = DecisionTree.restore(state, JOB, DecisionTreeConfig(), inv)
    part += run(second, recs[cut:], until=300.0)
    assert [d.to_wire() for d in part] == [d.to_wire() for d in whole]


def test_rejections() -> None:
    tree = DecisionTree(JOB)
    assert tree.observe(LogRecord("h1", 5.0, "training", "x", job="other")).rejections[0].reason == "wrong_job"
    tree.advance(10_000.0)
    assert tree.observe(rec(1.0, "h1", watchdog(0))).rejections[0].reason == "late"
    assert tree.observe(rec(float("nan"), "h1", "x")).rejections[0].reason == "not_finite"


def test_bad_config_and_state() -> None:
    with pytest.raises(ConfigError):
        DecisionTreeConfig(settle_s=-1)
    with pytest.raises(ConfigError):
        DecisionTree.restore({"v": 99}, JOB)


def test_late_watchdog_timeouts_fold_into_the_found_fault() -> None:
    """Aegis §3: a CCL timeout is the first signal, not the root cause. Watchdogs firing
    minutes after a diagnosed Xid 79 are its consequences, not a new incident."""
    tree = DecisionTree(JOB, DecisionTreeConfig(settle_s=5.0, quiet_s=60.0), inventory(8))
    diags = run(tree, xid79_then_timeouts())
    late = [rec(300.0 + i, f"h{i:02d}", watchdog(8 * i)) for i in range(8)]
    diags += run(tree, late, 400.0)
    assert len(diags) == 1 and diags[0].kind == "critical_error"


def test_host_memory_uncorrectable_isolates_the_host() -> None:
    """Aegis: host memory and CPU are 23 % of failures; an uncorrectable DIMM error takes the host."""
    tree = DecisionTree(JOB, inventory=inventory(4))
    edac = ("[11189.970968] EDAC MC3: 1 UE memory read error on CPU_SrcID#1_MC#1_Chan#2_DIMM#0 "
            "(channel:2 slot:0 page:0xb757589 offset:0x140 grain:32)")
    recs = [rec(10.0, "h02", edac, "kernel")]
    recs += [rec(11.0, f"h{h:02d}", watchdog(h * 8)) for h in (0, 1, 3)]
    (d,) = run(tree, recs, until=100.0)
    assert d.kind == "critical_error" and d.culprits.hosts == ("h02",)
    assert d.evidence["actions"] == [["isolate_host", "h02"], ["restart_job", JOB]]


def test_driver_library_mismatch_everywhere_recommends_rollback() -> None:
    tree = DecisionTree(JOB, inventory=inventory(4))
    nvml = "Failed to initialize NVML: Driver/library version mismatch"
    (d,) = run(tree, [rec(5.0 + 0.3 * h, f"h{h:02d}", nvml) for h in range(4)], until=60.0)
    assert d.kind == "config" and d.evidence["config_rule"] == "nvml_driver_mismatch"
    assert d.evidence["actions"] == [["rollback_update", JOB]]


def test_host_oom_kill_is_the_applications_fault() -> None:
    tree = DecisionTree(JOB, inventory=inventory(4))
    oom = "[3017506.733819] Out of memory: Kill process 25635 (python) score 974 or sacrifice child"
    recs = [rec(10.0, "h01", oom, "kernel")] + [rec(11.0, f"h{h:02d}", closed(ip(1))) for h in (0, 2)]
    (d,) = run(tree, recs, until=100.0)
    assert d.evidence["path"][-1] == "AppError:hit"
    assert not any(a[0].startswith("isolate") for a in d.evidence["actions"])


def test_two_host_job_timeouts_alone_isolate_nobody() -> None:
    """Both hosts of a 2-host job log watchdog timeouts whichever one hung: no line names the
    other end, so this is not "errors between 2 hosts" (Phase 2 localises such hangs)."""
    tree = DecisionTree(JOB, inventory=inventory(2))
    recs = [rec(100.0 + 0.3 * h, f"h{h:02d}", watchdog(h * 8)) for h in range(2)]
    (d,) = run(tree, recs, until=300.0)
    assert d.evidence["path"][:2] == ["CriticalError:miss", "DistError:2hosts"]
    assert d.kind != "dist_error"
    assert not any(a[0].startswith("isolate") for a in d.evidence["actions"])


def test_config_error_in_a_two_host_job_is_config() -> None:
    tree = DecisionTree(JOB, inventory=inventory(2))
    internal = ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
                "internal error - please report this issue to the NCCL developers")
    recs = [rec(5.0 + 0.3 * h, f"h{h:02d}", line) for h in range(2) for line in (TRUNCATED, internal)]
    (d,) = run(tree, recs, until=60.0)
    assert d.kind == "config"
    assert not any(a[0].startswith("isolate") for a in d.evidence["actions"])


def test_flush_judges_a_burst_that_ends_the_input() -> None:
    tree = DecisionTree(JOB, inventory=inventory(4))
    assert run(tree, [rec(295.0, "h01", reset(ip(2))), rec(295.2, "h02", closed(ip(1)))]) == []
    (d,) = tree.flush().diagnoses
    assert d.kind == "dist_error" and d.culprits.hosts == ("h01", "h02")
    assert tree.flush().diagnoses == []


def test_two_host_connection_failure_without_addresses_isolates_both() -> None:
    """A connection's own failure implies the other end even when the line names no address."""
    tree = DecisionTree(JOB, inventory=inventory(2))
    bare = "misc/socket.cc:49 NCCL WARN Net : Connection closed by remote peer"
    recs = [rec(50.0, "h00", bare), rec(50.4, "h01", bare)]
    (d,) = run(tree, recs, until=100.0)
    assert d.kind == "dist_error" and d.culprits.hosts == ("h00", "h01")
