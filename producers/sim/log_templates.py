"""Log line templates, in the formats real hosts print. Each cites a public example.

Only the format is taken from the cited source (field order, punctuation, wording); the values
are filled in by the simulator. Kernel lines carry no ``[ 123.456]`` dmesg prefix (the agent
reads /dev/kmsg, whose record text starts at the subsystem). Process lines carry their own
prefixes (NCCL ``host:pid:tid [dev]``, PyTorch ``[rankN]:[E.. ..]``).
"""

from __future__ import annotations

import time

# --- helpers ------------------------------------------------------------------------------


def pid_of(host_index: int, gpu: int) -> int:
    """A stable training-process pid for (host, local GPU)."""
    return 41000 + (host_index * 37) % 9000 + gpu


def xid_pci(bus_id: str) -> str:
    """``0000:3b:00.0`` → ``0000:3b:00`` as NVRM prints it in Xid lines."""
    return bus_id.rsplit(".", 1)[0]


def _torch_stamp(ts: float, level: str = "E") -> str:
    """glog-style ``E0321 02:07:08.408271257`` from an event time (UTC)."""
    t = time.gmtime(ts)
    nanos = int(round((ts - int(ts)) * 1e9)) % 1_000_000_000
    return f"{level}{t.tm_mon:02d}{t.tm_mday:02d} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{nanos:09d}"


def nccl_prefix(host: str, host_index: int, gpu: int, thread: int = 0) -> str:
    pid = pid_of(host_index, gpu)
    return f"{host}:{pid}:{pid + thread} [{gpu}]"


# --- kernel: NVIDIA driver Xid -------------------------------------------------------------

# Format: NVIDIA/gpu-operator#1146 (real Xid 48/64 lines, pid='<unknown>', name=<unknown>)
#   https://github.com/NVIDIA/gpu-operator/issues/1146
def xid(bus_id: str, code: int, text: str, pid: int | None = None, name: str = "python3") -> str:
    who = f"pid={pid}, name={name}" if pid is not None else "pid='<unknown>', name=<unknown>"
    return f"NVRM: Xid (PCI:{xid_pci(bus_id)}): {code}, {who}, {text}"


# Xid 79 text: NVIDIA/NVSentinel#155 ("NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus")
#   https://github.com/NVIDIA/NVSentinel/issues/155
XID79_TEXT = "GPU has fallen off the bus."
# Follow-up driver line: Bumblebee-Project/Bumblebee#554 ("NVRM: GPU at 0000:01:00.0 has fallen off the bus.")
#   https://github.com/Bumblebee-Project/Bumblebee/issues/554


def gpu_off_bus(bus_id: str) -> str:
    return f"NVRM: GPU at {bus_id} has fallen off the bus."


# Xid 48 text: NVIDIA/gpu-operator#1146
#   https://github.com/NVIDIA/gpu-operator/issues/1146
def xid48_text(addr: int, partition: int, sub: int) -> str:
    return (f"An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
            f"at physAddr 0x{addr:x} partition {partition}, subpartition {sub}.")


# Xid 63 text: stas00/ml-engineering compute/accelerator/nvidia/debug.md
#   https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/nvidia/debug.md
XID63_TEXT = "Row Remapper: New row marked for remapping, reset gpu to activate."
# Xid 92 text: NVIDIA's Xid catalogue description as quoted in many monitors' tables, e.g.
#   https://github.com/leptonai/gpud/pull/100 (catalogue https://docs.nvidia.com/deploy/xid-errors/)
XID92_TEXT = "High single-bit ECC error rate"
# Xid 94 text: leptonai/gpud#1160 kmsg example ("... 94, pid=1234, name=python3, Contained ECC error")
#   https://github.com/leptonai/gpud/pull/1160
XID94_TEXT = "Contained ECC error."


# Xid 74 text: NVIDIA/NVSentinel#516 design doc message format
#   ("NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error
#    detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)")
#   https://github.com/NVIDIA/NVSentinel/pull/516
def xid74_text(link: int, reg2: int = 0x10000) -> str:
    return f"NVLink: fatal error detected on link {link}(0x0, 0x0, 0x{reg2:x}, 0x0, 0x0, 0x0, 0x0)"


# --- kernel: PCIe AER and link downgrade ---------------------------------------------------

# AER format: GSConnect/gnome-shell-extension-gsconnect#1052 and pop-os/pop#751
#   https://github.com/GSConnect/gnome-shell-extension-gsconnect/issues/1052
#   https://github.com/pop-os/pop/issues/751
def aer_lines(port: str, device: str, vendor_dev: str = "10de:2330") -> list[str]:
    return [
        f"pcieport {port}: AER: Corrected error received: {device}",
        f"nvidia {device}: AER: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
        f"nvidia {device}: AER:   device [{vendor_dev}] error status/mask=00000001/0000e000",
        f"nvidia {device}: AER:    [ 0] RxErr                  (First)",
    ]


# Bandwidth line: stas00/ml-engineering debug.md ("pci 0000:04:00.0: 252.048 Gb/s available PCIe
# bandwidth, limited by 16.0 GT/s PCIe x16 link at 0000:01:00.0 (capable of ...)")
#   https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/nvidia/debug.md
def pcie_limited(device: str, port: str, gts: float, width: int) -> str:
    gbps = {2.5: 2.0, 5.0: 4.0, 8.0: 7.877, 16.0: 15.754, 32.0: 31.508}[gts] * width
    return (f"pci {device}: {gbps:.3f} Gb/s available PCIe bandwidth, limited by {gts:.1f} GT/s "
            f"PCIe x{width} link at {port} (capable of 504.112 Gb/s with 32.0 GT/s PCIe x16 link)")


# --- kernel: mlx5 link state ---------------------------------------------------------------

# netdev line and IB port line: leptonai/gpud#1209 journal ("mlx5_core 0000:ab:00.0 mlx5_5: Port: 1
# Link ACTIVE") and the kernel IB/cache patch quoted in the same kind of logs ("Port: 1 Link DOWN");
# netdev "Link down"/"Link up" as mlx5e prints them next to it.
#   https://github.com/leptonai/gpud/pull/1209
def mlx5_netdev_link(nic_bus: str, netdev: str, up: bool) -> str:
    return f"mlx5_core {nic_bus} {netdev}: Link {'up' if up else 'down'}"


def mlx5_port_state(nic_bus: str, ibdev: str, up: bool) -> str:
    return f"mlx5_core {nic_bus} {ibdev}: Port: 1 Link {'ACTIVE' if up else 'DOWN'}"


# Harmless probe line: geerlingguy/arm-nas#16 ("mlx5_core 0004:01:00.0: mlx5_pcie_event:294:(pid 542):
# PCIe slot advertised sufficient power (75W).")
#   https://github.com/geerlingguy/arm-nas/issues/16
def mlx5_slot_power(nic_bus: str, pid: int) -> str:
    return f"mlx5_core {nic_bus}: mlx5_pcie_event:299:(pid {pid}): PCIe slot advertised sufficient power (75W)."


# --- NCCL ----------------------------------------------------------------------------------

# INFO startup lines: NVIDIA/nccl-tests#185 and NVIDIA/nccl#1814
#   https://github.com/NVIDIA/nccl-tests/issues/185   (Bootstrap, NET/IB : Using [0]mlx5_10:1/RoCE ...)
#   https://github.com/NVIDIA/nccl/issues/1814       (comm 0x... rank 36 nranks 64 ... - Init COMPLETE)
NCCL_VERSION = "2.21.5+cuda12.4"


def nccl_bootstrap(prefix: str, iface: str, ip: str) -> str:
    return f"{prefix} NCCL INFO Bootstrap : Using {iface}:{ip}<0>"


def nccl_net_ib(prefix: str, nics: list[str], iface: str, ip: str) -> str:
    devs = " ".join(f"[{i}]{n}:1/RoCE" for i, n in enumerate(nics))
    return f"{prefix} NCCL INFO NET/IB : Using {devs} [RO]; OOB {iface}:{ip}<0>"


def nccl_init_complete(prefix: str, comm_ptr: int, rank: int, nranks: int, gpu: int,
                       bus: str, comm_id: str) -> str:
    busid = f"{int(bus.split(':')[1], 16):x}000"
    return (f"{prefix} NCCL INFO comm 0x{comm_ptr:x} rank {rank} nranks {nranks} cudaDev {gpu} "
            f"nvmlDev {gpu} busId {busid} commId 0x{comm_id} - Init COMPLETE")


# IB completion error: NVIDIA/nccl#1814 (title) and NVIDIA/nccl#1405
#   https://github.com/NVIDIA/nccl/issues/1814
#   https://github.com/NVIDIA/nccl/issues/1405
def nccl_ib_completion_error(prefix: str, peer_ip: str, port: int, local_ip: str,
                             recv: bool = True) -> str:
    return (f"{prefix} transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer "
            f"{peer_ip}<{port}> with status=12 opcode={0 if recv else 1} len=0 vendor err 129 "
            f"({'Recv' if recv else 'Send'}) localGid ::ffff:{local_ip} remoteGids::ffff:{peer_ip}")


# Socket reset: NVIDIA/nccl#1920 ("misc/socket.cc:46 NCCL WARN socketProgressOpt: Call to send to
# 10.44.137.149<52905> failed : Connection reset by peer")
#   https://github.com/NVIDIA/nccl/issues/1920
def nccl_conn_reset(prefix: str, peer_ip: str, port: int, op: str = "recv from") -> str:
    return (f"{prefix} misc/socket.cc:46 NCCL WARN socketProgressOpt: Call to {op} "
            f"{peer_ip}<{port}> failed : Connection reset by peer")


# Config error, same on every host: NCCL_SOCKET_IFNAME naming a missing interface.
# pytorch/pytorch#29482 ("bootstrap.cc:37 NCCL WARN Bootstrap : no socket interface found") and
# NVIDIA/nccl#1837 ("NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth2")
#   https://github.com/pytorch/pytorch/issues/29482
#   https://github.com/NVIDIA/nccl/issues/1837
def nccl_ifname_set(prefix: str, value: str) -> str:
    return f"{prefix} NCCL INFO NCCL_SOCKET_IFNAME set by environment to {value}"


def nccl_no_socket_interface(prefix: str) -> str:
    return f"{prefix} bootstrap.cc:37 NCCL WARN Bootstrap : no socket interface found"


# PyTorch surfacing it: codefuse-ai/MFTCoder#31 (DistBackendError ... internal error ... Last error:
# Bootstrap : no socket interface found)
#   https://github.com/codefuse-ai/MFTCoder/issues/31
def torch_nccl_init_error(rank: int, last_error: str) -> list[str]:
    return [
        f"[rank{rank}]: torch.distributed.DistBackendError: NCCL error in: "
        f"../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2588, internal error - please "
        f"report this issue to the NCCL developers, NCCL version {NCCL_VERSION.split('+')[0]}",
        f"[rank{rank}]: ncclInternalError: Internal check failed.",
        f"[rank{rank}]: Last error:",
        f"[rank{rank}]: {last_error}",
    ]


# --- PyTorch ProcessGroupNCCL watchdog -----------------------------------------------------

# Timeout: hiyouga/LlamaFactory#7396 ("[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607]
# [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE,
# NumelIn=..., NumelOut=..., Timeout(ms)=600000) ran for 600060 milliseconds before timing out.")
#   https://github.com/hiyouga/LlamaFactory/issues/7396
def torch_watchdog_timeout(ts: float, rank: int, seq: int, op: str, numel: int,
                           timeout_ms: int, ran_ms: int) -> list[str]:
    stamp = _torch_stamp(ts)
    return [
        f"[rank{rank}]:[{stamp} ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog caught "
        f"collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, "
        f"NumelOut={numel}, Timeout(ms)={timeout_ms}) ran for {ran_ms} milliseconds before timing out.",
        f"[rank{rank}]:[{stamp} ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank {rank}] "
        f"Exception (either an error or timeout) detected by watchdog at work: {seq}, last "
        f"enqueued NCCL work: {seq + 1}, last completed NCCL work: {seq - 1}.",
    ]


# Watchdog terminated by a CUDA error on the failing rank: NVIDIA-NeMo/Megatron-Bridge#836
# ("[rank29]:[E1002 12:20:55.123831168 ProcessGroupNCCL.cpp:1923] [PG ID 5 PG GUID 83(...) Rank 1]
# Process group watchdog thread terminated with exception: CUDA error: unspecified launch failure")
#   https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/836
# ECC variant text: kohya-ss/sd-scripts#1434 ("CUDA error: uncorrectable ECC error encountered");
# NVLink variant text: NVIDIA/srt-slurm#307 ("CUDA error: uncorrectable NVLink error detected
# during the execution").
#   https://github.com/kohya-ss/sd-scripts/issues/1434
#   https://github.com/NVIDIA/srt-slurm/pull/307
CUDA_LAUNCH_FAILURE = "unspecified launch failure"
CUDA_ECC = "uncorrectable ECC error encountered"
CUDA_NVLINK = "uncorrectable NVLink error detected during the execution"


def torch_watchdog_cuda_error(ts: float, rank: int, cuda_error: str) -> str:
    return (f"[rank{rank}]:[{_torch_stamp(ts)} ProcessGroupNCCL.cpp:1923] [PG ID 0 PG GUID 0"
            f"(default_pg) Rank {rank}] Process group watchdog thread terminated with exception: "
            f"CUDA error: {cuda_error}")


# --- training progress (harmless noise) ----------------------------------------------------

# Megatron-LM iteration line: epfLLM/Megatron-LLM#11 and NVIDIA-NeMo/Megatron-Bridge#836
#   https://github.com/epfLLM/Megatron-LLM/issues/11
def megatron_iteration(it: int, total: int, gbs: int, ms: float, lr: float, loss: float,
                       grad_norm: float) -> str:
    return (f" iteration {it:8d}/{total:8d} | consumed samples: {it * gbs:12d} | elapsed time "
            f"per iteration (ms): {ms:.1f} | learning rate: {lr:.3E} | global batch size: "
            f"{gbs:5d} | lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {grad_norm:.3f} | "
            f"number of skipped iterations:   0 | number of nan iterations:   0 |")
