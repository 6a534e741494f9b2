"""The fault catalogue: every scenario's class, its Aegis component category, and the mixed
mode that samples faults with the component shares of Aegis §2.

Expected outcomes (diagnosis kinds, actions, isolation) live on each class and are written to
the ground truth; the table is in docs/simulator.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from producers.sim.fault_base import Fault
from producers.sim.faults_gpu import (
    ComputeHang,
    ECCStorm,
    NVLinkError,
    PCIeDegradation,
    SlowCompute,
    ThermalThrottle,
    Xid48,
    Xid79,
    Xid94,
)
from producers.sim.faults_host import HostDown, RackPowerLoss
from producers.sim.faults_net import (
    ConfigError,
    ConnReset2Host,
    GpuConnFail,
    LargePacketLoss,
    NetworkHang,
    NicECN,
    OpticsFlap,
    SlowLink,
)
from producers.sim.faults_switch import TorDegraded, TorDown

CATALOGUE: dict[str, type[Fault]] = {c.scenario: c for c in (
    Xid79, Xid48, NVLinkError, PCIeDegradation, ECCStorm, ConnReset2Host, ConfigError,
    ComputeHang, NetworkHang, NicECN, LargePacketLoss, OpticsFlap, ThermalThrottle,
    SlowCompute, SlowLink, GpuConnFail, Xid94, TorDegraded, TorDown, HostDown, RackPowerLoss)}  # new ones last: tests seed by position
# what mixed mode draws from by default (gpu_conn_fail is a RootDiag case for tests only;
# xid94, a what-if case, leaves ECC's share to xid48)
MIXED_DEFAULT: tuple[str, ...] = tuple(s for s, c in CATALOGUE.items() if c.in_mixed)

# Smallest data-parallel ring (hosts per pipeline stage) a scenario needs: a link between
# hosts or a peer host; 4 for the N-ratio faults, because the 2 ranks over a link can only
# stand out above β = 1.5x their ring's mean N when they are at most half of it (§5.2).
MIN_RING: dict[str, int] = {"network_hang": 2, "conn_reset_2host": 2, "gpu_conn_fail": 3,
                            "nic_ecn": 4, "large_packet_loss": 4, "optics_flap": 4,
                            "slow_link": 4, "tor_degraded": 4, "tor_down": 4}

# Aegis §2 failure shares by component (percent). GPU = execution error + GPU memory + CUDA +
# driver; host = CPU + host memory + power/fan + disk. Each maps to the scenarios that show
# such a failure's symptoms.
CATEGORY_SHARES: dict[str, float] = {
    "GPU": 13.1 + 8.6 + 3.3 + 1.2, "ECC": 10.2, "NVLink": 9.2, "PCIe": 10.4, "NIC": 9.1,
    "optics": 6.7, "host": 13.7 + 9.1 + 3.7 + 1.6,
}
CATEGORY_SCENARIOS: dict[str, tuple[str, ...]] = {
    "GPU": ("xid79", "compute_hang", "thermal_throttle", "slow_gpu"),
    "ECC": ("xid48", "ecc_storm"),
    "NVLink": ("nvlink_error",),
    "PCIe": ("pcie_degradation",),
    "NIC": ("nic_ecn", "network_hang", "slow_link"),
    "optics": ("optics_flap", "large_packet_loss"),
    "host": ("compute_hang", "slow_gpu", "conn_reset_2host"),
}


def share_weights(names: Sequence[str]) -> np.ndarray:
    """Sampling weight of each scenario in ``names`` (Aegis §2 component shares): each
    category's share is split evenly among its scenarios present in ``names``; a category
    with none of them drops out (the others are renormalised). Scenarios in no category
    (config_error) weigh 0; uniform weights when nothing in ``names`` has a share."""
    present = set(names)
    w = dict.fromkeys(names, 0.0)
    for cat, share in CATEGORY_SHARES.items():
        options = [s for s in CATEGORY_SCENARIOS[cat] if s in present]
        for s in options:
            w[s] += share / len(options)
    out = np.array([w[s] for s in names])
    if out.sum() <= 0:
        out = np.ones(len(names))
    return out / out.sum()
