"""The classifier on real lines as they arrive framed (dmesg, syslog, journald, CRI, Docker
json-file, srun, torchrun, ANSI colour, NUL bytes), and the rules audit 6 added, each with
the benign lines of the same sources that must stay ``other`` (.tmp/logaudit6)."""

from __future__ import annotations

import json

import pytest

from processors.core.log_classifier import classify, unframe
from schemas.inventory import HostInventory

TS = "2026-12-03T10:00:00.123456789Z"
XID79 = "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus"
NCCL_RESET = ("A03-R28-I49-3-9000018:46841:46987 [0] include/socket.h:428 NCCL WARN Net : Call to "
              "recv from 11.127.49.2<36048> failed : Connection reset by peer")
AER_DETAIL = "pcieport 0000:00:00.0: [18] MalfTLP (First)"
TCPSTORE_W = ("W0701 13:41:43.421574  4776 TCPStore.cpp:182] [c10d] recvValue failed on "
              "SocketImpl(fd=24, ...): Connection reset by peer")
FIELDS = ("category", "severity", "rule", "xid", "pci_bus_id", "peer", "device")


def _docker(msg: str) -> str:  # Go's encoder writes <, > and & as \u003c, \u003e, \u0026
    s = json.dumps(msg + "\n")[1:-1].replace("<", "\\u003c").replace(">", "\\u003e")
    return '{"log":"' + s + '","stream":"stderr","time":"' + TS + '"}'


def _journal(msg: str) -> str:
    return json.dumps({"__REALTIME_TIMESTAMP": "1764756000123456", "_TRANSPORT": "kernel",
                       "PRIORITY": "3", "_HOSTNAME": "gpu-node-01", "MESSAGE": msg},
                      separators=(",", ":"))


FRAMES = {
    "dmesg": lambda m: f"[12345.678901] {m}",
    "dmesg_T": lambda m: f"[Thu Dec  3 10:00:00 2026] {m}",
    "dmesg_x": lambda m: f"kern  :err   : [12345.678901] {m}",
    "kern_log": lambda m: f"Dec  3 10:00:00 gpu-node-01 kernel: [  123.456789] {m}",
    "rfc5424": lambda m: f"<3>1 2026-12-03T10:00:00.123+00:00 gpu-node-01 kernel - - - {m}",
    "short_precise": lambda m: f"Dec 03 10:00:00.123456 gpu-node-01 kernel: {m}",
    "short_monotonic": lambda m: f"[  123.456789] gpu-node-01 kernel: {m}",
    "journal_json": _journal,
    "cri": lambda m: f"{TS} stderr F {m}",
    "docker_json": _docker,
    "srun_label": lambda m: f"12: {m}",
    "torchrun": lambda m: f"[default0]:{m}",
    "pdsh": lambda m: f"host01: {m}",
    "ansi": lambda m: f"\x1b[31m{m}\x1b[0m",
    "cr_trailing": lambda m: f"{m}  \r",
    "nul": lambda m: "\x00" * 8 + m.replace(" ", "\x00", 1),
}


@pytest.mark.parametrize("frame", sorted(FRAMES))
@pytest.mark.parametrize("msg", [XID79, NCCL_RESET, AER_DETAIL, TCPSTORE_W])
def test_a_framed_line_classifies_as_the_bare_one(msg: str, frame: str) -> None:
    bare, got = classify(msg).to_dict(), classify(FRAMES[frame](msg)).to_dict()
    assert bare["category"] != "other"
    assert {k: got[k] for k in FIELDS} == {k: bare[k] for k in FIELDS}


def test_unframe_keeps_ordinary_lines_and_other_json() -> None:
    for line in ("step 10 loss 2.3", '{"level":"info","msg":"checking nvidia fabric manager"}',
                 '{"log": broken', "{}"):
        assert unframe(line) == line
    assert unframe('{"MESSAGE":[78,86,82,77,58,32,88,105,100,255]}') == "NVRM: Xid\ufffd"


@pytest.mark.parametrize("line,rule,sev", [
    # UCX / libmlx5: a work request failed on the wire (https://github.com/openucx/ucx/issues/857,
    # /9515, /2888, https://github.com/OpenRLHF/OpenRLHF/issues/621)
    ("[1467152031.902965] [softiron-2:2132 :0] rc_verbs_iface.c:47   UCX  ERROR Send completion "
     "with error: local QP operation error", "ib_completion_error", "fatal"),
    ("[r1071:27563:0:27563] rc_verbs_iface.c:63   FATAL: send completion with error: local "
     "protection error", "ib_completion_error", "fatal"),
    ("[a670n1:162239:0:162239] ib_mlx5_log.c:177  Local protection on mlx5_0:1/IB (synd 0x4 vend "
     "0x51 hw_synd 0/2)", "ib_completion_error", "fatal"),
    ("mlx5: softiron-2: got completion with error:", "ib_completion_error", "fatal"),
    # gloo could not build its mesh (https://github.com/sgl-project/sglang/issues/3226)
    ("RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/"
     "pair.cc:144] no error", "dist_connect_failed", "fatal"),
])
def test_audit6_faults(line: str, rule: str, sev: str) -> None:
    e = classify(line)
    assert (e.category, e.severity, e.rule) == ("distributed_symptom", sev, rule), e


@pytest.mark.parametrize("line", [
    # the same sources' benign lines
    "[1701292112.829711] [a670n1:162239:0]      ucp_worker.c:1855 UCX  INFO    0x100b240 "
    "inter-node cfg#3 tag(rc_mlx5/mlx5_0:1 rc_mlx5/mlx5_0:1)",
    "[a670n1:162239:0:162239] ib_mlx5_log.c:177  RC QP 0x169 wqe[3]: SEND s-- [inl len 10] "
    "[va 0x7f1c3c800000 len 1 lkey 0xb5d2] [rqpn 0x169 dlid=12 sl=0 port=1 src_path_bits=0]",
    "[2025-01-30 18:11:27 TP1] Init torch distributed begin.",
    # C++ stack lines under a watchdog timeout name checkTimeout
    # (https://github.com/deepspeedai/DeepSpeed/issues/7533)
    "Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/"
    "ProcessGroupNCCL.cpp:635 (most recent call first):",
    "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration"
    "<long, std::ratio<1l, 1000l> > >) + 0x23d (0x7fbd47dcba6d in /usr/local/lib/python3.11/"
    "dist-packages/torch/lib/libtorch_cuda.so)",
    "[rank0]: frame #5: c10d::ProcessGroupNCCL::watchdogHandler() + 0x1b0 (0x7f in libtorch_cuda.so)",
    # a glog warning behind a prefix is still a warning, not the error
])
def test_audit6_benign_lines_stay_other(line: str) -> None:
    assert classify(line).category == "other", classify(line)


def test_a_framed_glog_warning_stays_degraded_and_an_error_stays_fatal() -> None:
    e_line = TCPSTORE_W.replace("W0701", "E0701", 1)
    for frame in ("cri", "srun_label", "pdsh", "docker_json"):
        assert classify(FRAMES[frame](TCPSTORE_W)).severity == "degraded"
        assert classify(FRAMES[frame](e_line)).severity == "fatal"


def test_traceback_lines_carry_their_own_fault() -> None:
    # https://github.com/NVIDIA/nccl/issues/1410: only the lines naming the fault count
    tb = ["[rank7]: Traceback (most recent call last):",
          '[rank7]:   File "/workspace/train.py", line 10, in <module>',
          "[rank7]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/"
          "c10d/NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO for details), "
          "NCCL version 2.20.5",
          "[rank7]: ncclUnhandledCudaError: Call to CUDA function failed.",
          "[rank7]: Last error:",
          "[rank7]: Cuda failure 1 'invalid argument'"]
    got = [(e.category, e.rank) for e in map(classify, tb)]
    assert got == [("other", None), ("other", None), ("cuda_app_error", 7), ("cuda_app_error", 7),
                   ("other", None), ("cuda_app_error", 7)]


# audit 7 (whole healthy logs): a SoC PCIe controller's link state at boot is not a NIC's
@pytest.mark.parametrize("line", [
    "[    5.629281] brcm-pcie fd500000.pcie: link down",  # EvanKrall/pipad#29: empty/untrained slot
    "[    1.047135] brcm-pcie fd500000.pcie: link up, 5.0 GT/s PCIe x1 (SSC)",  # raspberry-pi-pcie-devices#48
])
def test_audit7_pcie_controller_link_is_not_a_nic(line: str) -> None:
    ev = classify(line)
    assert (ev.category, ev.severity, ev.rule) == ("pcie", "info", "pcie_controller_link")


@pytest.mark.parametrize("line,rule,sev", [  # NIC link state still counts
    ("[39210.778735] igc 0000:05:00.0 eth5: NIC Link is Down", "nic_link_down", "degraded"),
    ("mlx5_core 0000:0c:00.0 ens1np0: Link down", "nic_link_down", "degraded"),
])
def test_audit7_nic_link_down_unchanged(line: str, rule: str, sev: str) -> None:
    ev = classify(line)
    assert (ev.category, ev.rule, ev.severity) == ("nic_or_link", rule, sev)


@pytest.mark.parametrize(("line", "sev", "rule"), [
    ("[Feb 27 2025 15:10:02] [ERROR] [tid 12727] detected NVSwitch non-fatal error 12028 on fid 0 "
     "on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 61", "degraded", "sxid_12028"),
    ("[Feb 27 2025 15:10:02] [ERROR] [tid 12727] detected NVSwitch fatal error 20034 on fid 0 "
     "on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 61", "fatal", "sxid_20034"),
])
def test_the_fabric_managers_own_sxid_report(line: str, sev: str, rule: str) -> None:
    """nv-fabricmanager's log says what the kernel's SXid line says (audit 7)."""
    e = classify(line)
    assert (e.category, e.severity, e.rule) == ("nvlink", sev, rule)
    assert classify("[INFO] [tid 1] Successfully configured all the available NVSwitches").category == "other"


def test_the_agents_gpu_lost_notice_names_its_gpu() -> None:
    inv = HostInventory("h1", gpu_bus_ids=("0000:18:00.0", "0000:3b:00.0"))
    e = classify("aegis-agent notice: NVML: GPU 1 (PCI 0000:3b:00.0): GPU is lost; its metrics "
                 "are left out, asked again every 30 s", "agent", inv)
    assert (e.rule, e.gpu, e.action) == ("gpu_lost", 1, "isolate_host")
