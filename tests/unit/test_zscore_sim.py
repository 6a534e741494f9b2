"""A small synthetic synchronous job for the Z-score tests, plus tests of the generator.

Every host has 8 GPUs ("0".."7"), 8 NICs ("mlx5_0".."mlx5_7") and a host group, with
realistic healthy noise; a fault is a function that rewrites one device's metric values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from processors.core.base import Outputs
from processors.core.zscore import ZScoreDetector
from schemas.records import DeviceGroup, TelemetryBatch

T0 = 1_700_000_000.0
# metric: (mean, noise sd, clip at 0)
GPU = {"gpu_util_pct": (95.0, 1.5), "gpu_sm_clock_mhz": (1980.0, 8.0), "gpu_power_w": (650.0, 15.0),
       "gpu_temp_c": (66.0, 1.5), "gpu_tensor_tflops": (300.0, 6.0), "gpu_mem_used_gib": (70.0, 0.0),
       "gpu_pcie_rx_bps": (2e10, 1e9), "gpu_pcie_tx_bps": (2e10, 1e9),
       "gpu_pcie_replay_per_s": (0.0, 0.0), "gpu_nvlink_rx_bps": (1e11, 4e9),
       "gpu_nvlink_tx_bps": (1e11, 4e9), "gpu_nvlink_err_per_s": (0.0, 0.0),
       "gpu_ecc_sbe_per_s": (0.0, 0.0), "gpu_ecc_dbe_total": (0.0, 0.0),
       "gpu_retired_rows": (0.0, 0.0), "gpu_throttle_mask": (0.0, 0.0)}
NIC = {"nic_tx_bps": (2.2e10, 8e8), "nic_rx_bps": (2.2e10, 8e8), "nic_retrans_per_s": (0.0, 0.6),
       "nic_ecn_per_s": (5.0, 8.0), "nic_cnp_sent_per_s": (3.0, 5.0),
       "nic_cnp_handled_per_s": (3.0, 5.0), "nic_out_of_seq_per_s": (0.0, 0.3),
       "nic_link_up": (1.0, 0.0)}
HOST = {"host_cpu_util_pct": (35.0, 3.0), "host_mem_used_pct": (40.0, 1.0)}
KINDS = {"gpu": (GPU, tuple(str(i) for i in range(8))),
         "nic": (NIC, tuple(f"mlx5_{i}" for i in range(8))),
         "host": (HOST, ("host",))}

# fault(host, ts, kind, values): rewrites rows of ``values`` (metric -> array over devices)
Fault = Callable[[str, float, str, dict[str, np.ndarray]], None]
_TABLES = {kind: (list(metrics), np.array([mu for mu, _ in metrics.values()])[:, None],
                  np.array([sd for _, sd in metrics.values()])[:, None], ids)
           for kind, (metrics, ids) in KINDS.items()}


def host_name(i: int) -> str:
    return f"h{i:04d}"


@dataclass
class Cluster:
    hosts: int = 16
    interval: float = 5.0
    seed: int = 1
    job: str = "j1"
    faults: list[Fault] = field(default_factory=list)
    absent: Callable[[str, float], bool] = lambda host, ts: False

    def batches(self, start: float, end: float) -> Iterator[TelemetryBatch]:
        """Batches for event times in [start, end), host by host at each tick."""
        rng = np.random.default_rng(self.seed + int(start))
        ticks = np.arange(start, end, self.interval)
        for ts in ticks:
            for i in range(self.hosts):
                host = host_name(i)
                if self.absent(host, float(ts)):
                    continue
                groups = {}
                for kind, (names, mu, sd, ids) in _TABLES.items():
                    mat = np.maximum(mu + sd * rng.standard_normal((len(names), len(ids))), 0.0)
                    values = dict(zip(names, mat, strict=True))
                    for fault in self.faults:
                        fault(host, float(ts), kind, values)
                    groups[kind] = DeviceGroup(ids, {m: tuple(v.tolist()) for m, v in values.items()})
                yield TelemetryBatch(host=host, ts=float(ts), devices=groups, job=self.job)


def step_fault(host: str, kind: str, index: int, metric: str, start: float, end: float,
               value: Callable[[np.random.Generator], float] | float) -> Fault:
    """From ``start`` to ``end`` the device ``index`` of ``host`` reports ``value``."""
    rng = np.random.default_rng(7)

    def fault(h: str, ts: float, k: str, values: dict[str, np.ndarray]) -> None:
        if h == host and k == kind and start <= ts < end and metric in values:
            values[metric][index] = value(rng) if callable(value) else value
    return fault


def run(det: ZScoreDetector, batches: Iterator[TelemetryBatch] | list[TelemetryBatch],
        until: float | None = None) -> Outputs:
    out = Outputs()
    for b in batches:
        out.extend(det.observe(b))
    if until is not None:
        out.extend(det.advance(until))
    return out


def test_generator_is_deterministic() -> None:
    a = list(Cluster(hosts=2).batches(T0, T0 + 10))
    b = list(Cluster(hosts=2).batches(T0, T0 + 10))
    assert a == b and len(a) == 4


def test_step_fault_rewrites_one_device() -> None:
    c = Cluster(hosts=2, faults=[step_fault("h0001", "nic", 3, "nic_ecn_per_s", T0, T0 + 4, 2e4)])
    batches = list(c.batches(T0, T0 + 6))
    hit = [b.devices["nic"].values["nic_ecn_per_s"][3] for b in batches if b.host == "h0001"]
    assert hit[0] == 2e4 and hit[1] < 1e3
