"""A simulated GPU collector behind the same interface as the NVML one (``--sim-gpus N``):
NVML-like gauges and cumulative counters for N busy H100-class GPUs, through the same
rate and tensor-estimate code. For the overhead bench and for trying the agent on a machine
without GPUs. Deterministic for a given seed.
"""

from __future__ import annotations

import random
from typing import Any

from producers.agent.collector import Partial
from producers.agent.gpu_metrics import put_gpu
from producers.agent.rates import RateTracker

MAX_SM_MHZ = 1980.0
PEAK = 989.0


class SimulatedGpuCollector:
    name = "simgpu"

    def __init__(self, host: str, n: int = 8, seed: int = 0) -> None:
        self.host = host
        self.n = n
        self.rng = random.Random(seed)
        self.rates = RateTracker()
        self.counters = [{"pcie_replay": 0, "nvlink_tx_kib": 0, "nvlink_rx_kib": 0,
                          "nvlink_errors": 0, "ecc_sbe_volatile": 0} for _ in range(n)]
        self.last: float | None = None

    def _gauges(self, i: int) -> dict[str, float]:
        r = self.rng
        return {
            "gpu_util_pct": min(100.0, 95.0 + r.gauss(0, 2)),
            "gpu_sm_clock_mhz": 1980.0 - abs(r.gauss(0, 15)),
            "gpu_power_w": 640.0 + r.gauss(0, 20),
            "gpu_temp_c": 62.0 + r.gauss(0, 1.5),
            "gpu_mem_used_gib": 71.3 + 0.01 * i,
            "gpu_pcie_rx_bps": 12e9 + r.gauss(0, 3e8),
            "gpu_pcie_tx_bps": 11e9 + r.gauss(0, 3e8),
            "gpu_throttle_mask": 0.0,
            "gpu_ecc_dbe_total": 0.0,
            "gpu_retired_rows": 0.0,
        }

    def collect(self, now: float) -> Partial:
        out = Partial()
        dt = 1.0 if self.last is None else max(0.0, now - self.last)
        self.last = now
        for i in range(self.n):
            c = self.counters[i]
            c["nvlink_tx_kib"] += int(dt * 300e6)  # ~300 GB/s of NVLink traffic, in KiB
            c["nvlink_rx_kib"] += int(dt * 300e6)
            if self.rng.random() < 0.01:
                c["ecc_sbe_volatile"] += 1
            put_gpu(out, self.rates, f"{self.host}/gpu{i}", now, self._gauges(i), dict(c),
                    MAX_SM_MHZ, PEAK)
        return out

    def inventory(self) -> list[dict[str, Any]]:
        return [{"id": f"{self.host}/gpu{i}", "bus": f"0000:{0x18 + 0x10 * i:02x}:00.0",
                 "model": "simulated H100", "peak_tflops": PEAK} for i in range(self.n)]

    def close(self) -> None:
        pass
