"""The telemetry metric catalogue: every metric's name, device kind, unit and direction.

Aegis §5.1 uses 20+ metrics of two kinds: abnormal-operation metrics that are 0 when
healthy (retransmits, ECN marks, CNPs) and performance metrics (FLOPS, utilisation,
temperature, PCIe, bandwidth). ``direction`` says which way is bad for the Z-score rule
(λ+2δ for high-bad, λ−2δ for low-bad, both for both).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Direction(StrEnum):
    HIGH_BAD = "high_bad"
    LOW_BAD = "low_bad"
    BOTH = "both"
    NONE = "none"  # recorded, never scored (inventory-like values)


DEVICE_KINDS = ("gpu", "nic", "host")


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    kind: str  # gpu | nic | host
    unit: str
    direction: Direction
    abnormal: bool = False  # Aegis §5.1 abnormal-operation metric: ~0 when healthy
    counter: bool = False  # a rate or count: negative values are invalid
    floor: float = 0.0  # absolute floor below which an abnormal metric never flags
    description: str = ""


_H, _L, _B, _N = Direction.HIGH_BAD, Direction.LOW_BAD, Direction.BOTH, Direction.NONE

CATALOGUE: tuple[Metric, ...] = (
    # GPU (NVML)
    Metric("gpu_util_pct", "gpu", "%", _L, description="GPU utilisation"),
    Metric("gpu_sm_clock_mhz", "gpu", "MHz", _L, description="SM clock"),
    Metric("gpu_power_w", "gpu", "W", _B, description="board power draw"),
    Metric("gpu_temp_c", "gpu", "°C", _H, description="GPU core temperature"),
    Metric("gpu_tensor_tflops", "gpu", "TFLOP/s", _L, description="tensor throughput estimate"),
    Metric("gpu_mem_used_gib", "gpu", "GiB", _N, description="HBM used"),
    Metric("gpu_pcie_rx_bps", "gpu", "B/s", _L, counter=True, description="PCIe receive throughput"),
    Metric("gpu_pcie_tx_bps", "gpu", "B/s", _L, counter=True, description="PCIe transmit throughput"),
    Metric("gpu_pcie_replay_per_s", "gpu", "1/s", _H, abnormal=True, counter=True, floor=1.0,
           description="PCIe replay counter rate"),
    Metric("gpu_nvlink_rx_bps", "gpu", "B/s", _L, counter=True, description="NVLink receive throughput"),
    Metric("gpu_nvlink_tx_bps", "gpu", "B/s", _L, counter=True, description="NVLink transmit throughput"),
    Metric("gpu_nvlink_err_per_s", "gpu", "1/s", _H, abnormal=True, counter=True, floor=1.0,
           description="NVLink CRC/replay/recovery error rate"),
    Metric("gpu_ecc_sbe_per_s", "gpu", "1/s", _H, abnormal=True, counter=True, floor=10.0,
           description="single-bit (correctable) ECC error rate, volatile"),
    Metric("gpu_ecc_dbe_total", "gpu", "count", _H, abnormal=True, counter=True, floor=0.5,
           description="double-bit (uncorrectable) ECC errors, volatile total"),
    Metric("gpu_retired_rows", "gpu", "count", _H, abnormal=True, counter=True, floor=0.5,
           description="retired pages plus remapped rows"),
    Metric("gpu_throttle_mask", "gpu", "bitmask", _N, counter=True,
           description="NVML clocks-event (throttle) reasons bitmask"),
    Metric("gpu_ecc_sbe_aggregate_total", "gpu", "count", _N, counter=True,
           description="single-bit ECC errors over the GPU's life (aggregate)"),
    Metric("gpu_ecc_dbe_aggregate_total", "gpu", "count", _N, counter=True,
           description="double-bit ECC errors over the GPU's life (aggregate)"),
    Metric("gpu_remap_pending", "gpu", "bool", _H, abnormal=True, floor=0.5,
           description="1 when a row remap is pending (needs a GPU reset)"),
    Metric("gpu_remap_failure", "gpu", "bool", _H, abnormal=True, floor=0.5,
           description="1 when a row remap failed"),
    # NIC (sysfs RDMA counters)
    Metric("nic_tx_bps", "nic", "B/s", _L, counter=True, description="port transmit bytes/s"),
    Metric("nic_rx_bps", "nic", "B/s", _L, counter=True, description="port receive bytes/s"),
    Metric("nic_retrans_per_s", "nic", "1/s", _H, abnormal=True, counter=True, floor=50.0,
           description="retransmits (local_ack_timeout_err + packet_seq_err) per second"),
    Metric("nic_ecn_per_s", "nic", "1/s", _H, abnormal=True, counter=True, floor=500.0,
           description="ECN-marked RoCE packets per second"),
    Metric("nic_cnp_sent_per_s", "nic", "1/s", _H, abnormal=True, counter=True, floor=500.0,
           description="CNPs sent per second (notification point)"),
    Metric("nic_cnp_handled_per_s", "nic", "1/s", _H, abnormal=True, counter=True, floor=500.0,
           description="CNPs handled per second (reaction point)"),
    Metric("nic_out_of_seq_per_s", "nic", "1/s", _H, abnormal=True, counter=True, floor=50.0,
           description="out-of-sequence packets per second"),
    Metric("nic_link_up", "nic", "bool", _L, description="1 when the port is ACTIVE, else 0"),
    Metric("nic_port_err_per_s", "nic", "1/s", _H, abnormal=True, counter=True, floor=1.0,
           description="port error counters per second (symbol, rcv, link recovery: optics)"),
    Metric("nic_link_downed_total", "nic", "count", _N, counter=True,
           description="times the link went down (link_downed counter)"),
    # host
    Metric("host_cpu_util_pct", "host", "%", _B, description="CPU utilisation, all cores"),
    Metric("host_mem_used_pct", "host", "%", _H, description="host memory used"),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in CATALOGUE}


def metrics_for(kind: str) -> tuple[Metric, ...]:
    """The catalogue's metrics for one device kind, in catalogue order."""
    return tuple(m for m in CATALOGUE if m.kind == kind)
