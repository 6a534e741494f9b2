"""GPU-side and host-side faults (Aegis §3 CriticalError, §4.2 compute hang, §5.2 slow compute)."""

from __future__ import annotations

import numpy as np

from producers.sim import log_templates as lt
from producers.sim.fault_base import FatalGpuFault, Fault, hang_then_kill
from producers.sim.state import GI, HUNG, TickArrays, put
from producers.sim.topology import gpu_bus_id, switch_port_id


class Xid79(FatalGpuFault):
    scenario, category = "xid79", "GPU"
    summary = "GPU fell off the bus (Xid 79): its rank dies, peers time out"

    def kernel_lines(self, t: float) -> None:
        self.ctx.log(t, self.host, "kernel", lt.xid(self.bus(), 79, lt.XID79_TEXT, self.pid()))
        self.ctx.log(t + 0.001, self.host, "kernel", lt.gpu_off_bus(self.bus()))

    def gpu_symptoms(self, a: TickArrays) -> None:
        a.gpu[self.host, self.gpu, :] = np.nan  # NVML can no longer read the lost GPU


class Xid48(FatalGpuFault):
    scenario, category = "xid48", "ECC"
    summary = "double-bit ECC error (Xid 48): the application crashes, peers time out"
    cuda_error = lt.CUDA_ECC

    def kernel_lines(self, t: float) -> None:
        addr = int(self.rng.integers(0x100000, 0x7FFFFFFF))
        text = lt.xid48_text(addr, int(self.rng.integers(8)), int(self.rng.integers(2)))
        self.ctx.log(t, self.host, "kernel", lt.xid(self.bus(), 48, text, self.pid()))
        self.ctx.log(t + 0.0004, self.host, "kernel",
                     lt.xid(self.bus(), 63, lt.XID63_TEXT, self.pid()))

    def gpu_symptoms(self, a: TickArrays) -> None:
        g = a.gpu[self.host, self.gpu]
        put(g, GI, "gpu_ecc_dbe_total", 1.0)
        put(g, GI, "gpu_ecc_dbe_aggregate_total", 1.0, add=True)
        put(g, GI, "gpu_retired_rows", 1.0)
        put(g, GI, "gpu_remap_pending", 1.0)


class Xid94(FatalGpuFault):
    """NVIDIA rates Xid 94 RESTART_APP (the error was contained to the process that hit it);
    Aegis' default policy keeps it fatal. Not drawn by mixed mode (xid48 stands for ECC)."""

    scenario, category = "xid94", "ECC"
    summary = "contained uncorrectable ECC error (Xid 94): the process is killed, peers time out"
    cuda_error = lt.CUDA_ECC
    in_mixed = False

    def kernel_lines(self, t: float) -> None:
        self.ctx.log(t, self.host, "kernel", lt.xid(self.bus(), 94, lt.XID94_TEXT, self.pid()))

    def gpu_symptoms(self, a: TickArrays) -> None:
        put(a.gpu[self.host, self.gpu], GI, "gpu_remap_pending", 1.0)


class NVLinkError(FatalGpuFault):
    scenario, category = "nvlink_error", "NVLink"
    summary = "fatal NVLink error (Xid 74) and NVLink error counters: TP comm hangs"
    cuda_error = lt.CUDA_NVLINK

    def kernel_lines(self, t: float) -> None:
        link = int(self.rng.integers(18))
        self.ctx.log(t, self.host, "kernel",
                     lt.xid(self.bus(), 74, lt.xid74_text(link), None))

    def gpu_symptoms(self, a: TickArrays) -> None:
        g = a.gpu[self.host, self.gpu]
        g[GI["gpu_nvlink_err_per_s"]] = float(self.rng.uniform(200, 2000))
        g[GI["gpu_nvlink_rx_bps"]] = g[GI["gpu_nvlink_tx_bps"]] = 0.0


class ComputeHang(Fault):
    """Aegis §4.2: the culprit never reaches the next op, so CL(culprit) < CL(peers)."""

    scenario, category = "compute_hang", "GPU"
    summary = "one GPU stops launching: its CL stops, peers wait in the next op (CL+1, WR==WC)"
    kinds = ("hang_compute",)

    def setup(self) -> None:
        self.dead_ts = self.start_ts + self.ctx.watchdog_s + 3.0
        self.end_ts = min(self.dead_ts, self.ctx.end_ts)

    def before(self, t: float) -> None:
        hang_then_kill(self, t)

    def after(self, a: TickArrays) -> None:
        if not self.hung(a, skip={(self.host, self.gpu)}):
            return
        self.wait_for(a, self.host, self.gpu)
        g = a.gpu[self.host, self.gpu]  # stuck in a compute kernel: busy, drawing power
        g[GI["gpu_power_w"]] = 380 + 10 * float(self.rng.standard_normal())

    def actions(self) -> list[list[str]]:
        return [["isolate_host", self.host_name], ["restart_job", self.job_name]]


class PCIeDegradation(Fault):
    scenario, category = "pcie_degradation", "PCIe"
    summary = "PCIe AER errors, link retrained to 2.5 GT/s x8, PCIe replays, slower iterations"
    kinds = ("critical_error",)

    def setup(self) -> None:
        port, dev = switch_port_id(self.gpu), gpu_bus_id(self.gpu)
        t = self.start_ts
        while t < self.ctx.end_ts:
            for i, line in enumerate(lt.aer_lines(port, dev)):
                self.ctx.log(t + i * 1e-5, self.host, "kernel", line)
            t += float(self.rng.uniform(2, 6) if t < self.start_ts + 60 else self.rng.uniform(20, 60))
        self.ctx.log(self.start_ts + 3.2, self.host, "kernel", lt.pcie_limited(dev, port, 2.5, 8))

    def before(self, t: float) -> None:
        if t >= self.start_ts:
            self.ctx.work.jobs[self.job].slow *= 1.08

    def after(self, a: TickArrays) -> None:
        if a.t < self.start_ts:
            return
        g = a.gpu[self.host, self.gpu]
        g[GI["gpu_pcie_replay_per_s"]] = float(self.rng.uniform(20, 200))
        g[GI["gpu_pcie_rx_bps"]] *= 0.12
        g[GI["gpu_pcie_tx_bps"]] *= 0.12

    def actions(self) -> list[list[str]]:
        return [["isolate_host", self.host_name], ["restart_job", self.job_name]]


class ECCStorm(Fault):
    """Correctable errors only: Aegis §3 says treating them as critical wrecks utilisation."""

    scenario, category = "ecc_storm", "ECC"
    summary = "correctable ECC storm (Xid 92, Xid 63, high SBE rate): must NOT isolate"
    kinds = ("outlier",)
    must_detect = False

    def setup(self) -> None:
        bus, pid = gpu_bus_id(self.gpu), lt.pid_of(self.host, self.gpu)
        self.ctx.log(self.start_ts, self.host, "kernel", lt.xid(bus, 92, lt.XID92_TEXT, pid))
        self.remap_ts = self.start_ts + float(self.rng.uniform(20, 60))
        self.sbe_total = 0.0
        t = self.remap_ts
        while t < self.ctx.end_ts:
            self.ctx.log(t, self.host, "kernel", lt.xid(bus, 63, lt.XID63_TEXT, pid))
            t += float(self.rng.uniform(60, 180))

    def after(self, a: TickArrays) -> None:
        if a.t < self.start_ts:
            return
        g = a.gpu[self.host, self.gpu]
        rate = float(self.rng.uniform(30, 300))
        self.sbe_total += rate
        put(g, GI, "gpu_ecc_sbe_per_s", rate)
        put(g, GI, "gpu_ecc_sbe_aggregate_total", self.sbe_total, add=True)
        if a.t >= self.remap_ts:  # Xid 63: a row marked for remapping, pending a reset
            put(g, GI, "gpu_retired_rows", 1.0)
            put(g, GI, "gpu_remap_pending", 1.0)


class SlowCompute(Fault):
    """Aegis §5.2: an op ends at the same moment on every rank, so the slow rank arrives last
    and waits least: TD(culprit) < α·mean TD with α = 0.8."""

    scenario, category = "slow_gpu", "GPU"
    summary = "one GPU computes slowly: TD on it < 0.8x its comms' mean, iterations longer"
    kinds = ("slow_compute",)
    job_slow, delay, tflops = 1.15, 0.6, 0.75

    def before(self, t: float) -> None:
        if t >= self.start_ts:
            self.ctx.work.jobs[self.job].slow *= self.ramp(t) * (self.job_slow - 1) + 1

    def ramp(self, t: float) -> float:
        return 1.0

    def after(self, a: TickArrays) -> None:
        if a.t < self.start_ts or self.ctx.work.jobs[self.job].status == HUNG:
            return
        r = self.ramp(a.t)
        self.late_arrival(a, self.host, self.gpu, self.delay * r)
        a.gpu[self.host, self.gpu, GI["gpu_tensor_tflops"]] *= 1 - r * (1 - self.tflops)
        self.gpu_symptoms(a, r)

    def gpu_symptoms(self, a: TickArrays, r: float) -> None:
        """Extra telemetry of the culprit; none for an unexplained slow GPU."""

    def actions(self) -> list[list[str]]:
        return [["isolate_gpu", f"{self.host_name}/gpu{self.gpu}"]]


class ThermalThrottle(SlowCompute):
    scenario, category = "thermal_throttle", "GPU"
    summary = "overheating GPU throttles: high temp, low SM clock, short TD on it, long on peers"
    job_slow, delay, tflops = 1.2, 0.6, 0.65

    def ramp(self, t: float) -> float:
        return float(min(1.0, (t - self.start_ts + 1) / 60.0))

    def gpu_symptoms(self, a: TickArrays, r: float) -> None:
        g = a.gpu[self.host, self.gpu]
        z = self.rng.standard_normal(3)
        g[GI["gpu_temp_c"]] = max(g[GI["gpu_temp_c"]], 60 + r * 30 + 0.4 * z[0])
        g[GI["gpu_sm_clock_mhz"]] = 1980 - r * (660 + 15 * z[1])
        g[GI["gpu_power_w"]] = g[GI["gpu_power_w"]] * (1 - 0.3 * r)
        if r > 0.3:
            g[GI["gpu_throttle_mask"]] = 0x20 | 0x40  # SW + HW thermal slowdown
