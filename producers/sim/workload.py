"""Healthy behaviour of a synchronous training cluster, one tick at a time, vectorised over hosts.

- Telemetry (Aegis §5.1): performance metrics move together across a job's hosts (utilisation
  and bandwidth follow the iteration phase, temperature drifts slowly with thermal inertia,
  white noise on top); abnormal-operation metrics sit at 0 with rare blips below the
  catalogue floors.
- CCL counters (Aegis §4.2, §5.2): cumulative CL/WR/WC per collective kind, WR == WC at op
  boundaries with a small in-flight difference inside an op; TD with the arrival spread of
  a synchronous op (the last rank to arrive waits least); N = mean WR latency of the last 5.
  The counters are functions of the job's (monotone) progress, so they never decrease: a
  rank is inside op d+1 when its op position lies in the last ``INOP_W`` of op d's span; a
  hung job freezes at the comm-wide boundary ``hung_ops`` (any op in flight completes).
"""

from __future__ import annotations

import numpy as np

from producers.sim.state import (
    DEAD,
    GI,
    HI,
    HOST_METRICS,
    HUNG,
    INIT,
    NI,
    RUNNING,
    JobState,
    TickArrays,
)
from producers.sim.topology import GPUS_PER_HOST, Topology
from schemas.metrics import metrics_for

K = 2  # collective kinds per communicator (topology.OPS_BY_KIND)
_IDLE, _INIT, _RUN, _HUNG, _DEAD = 0, 1, 2, 3, 4
_CODE = {INIT: _INIT, RUNNING: _RUN, HUNG: _HUNG, DEAD: _DEAD}
# Per comm kind: launches per iteration and base op duration (µs) for each of the K op kinds.
_LAUNCHES = {"tp": (96, 96), "dp": (24, 8), "pp": (16, 16)}
_TD_US = {"tp": (350.0, 420.0), "dp": (8000.0, 4000.0), "pp": (900.0, 900.0)}
_N_US = {"tp": 0.0, "dp": 9.0, "pp": 7.0}
CHANNELS = 4
BLIP_P = 0.002
INOP_W = 0.015  # share of (rank, op) snapshots taken inside an op
# Metrics the model computes; every other catalogue metric takes its static baseline
# (0 for abnormal-operation metrics and unknown ones, a small lifetime count for totals).
_MODELLED = {"gpu_util_pct", "gpu_sm_clock_mhz", "gpu_power_w", "gpu_temp_c",
             "gpu_tensor_tflops", "gpu_mem_used_gib", "gpu_pcie_rx_bps", "gpu_pcie_tx_bps",
             "gpu_nvlink_rx_bps", "gpu_nvlink_tx_bps", "nic_tx_bps", "nic_rx_bps", "nic_link_up",
             "host_cpu_util_pct", "host_mem_used_pct"}


def _blip_metrics(kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Abnormal-operation rates (``*_per_s``) blip; totals and flags never do."""
    names = [m for m in metrics_for(kind) if m.abnormal and m.name.endswith("_per_s")]
    index = {m.name: i for i, m in enumerate(metrics_for(kind))}
    return (np.array([index[m.name] for m in names], dtype=np.int64),
            np.array([m.floor for m in names]))


def _static_baseline(kind: str, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Per-device constants for metrics the model does not drive: lifetime totals that are
    not abnormal-operation metrics (aggregate ECC counts, link-down count) start small."""
    ms = metrics_for(kind)
    out = np.zeros(shape + (len(ms),))
    for i, m in enumerate(ms):
        if m.name not in _MODELLED and m.counter and not m.abnormal and m.name.endswith("_total"):
            out[..., i] = rng.poisson(1.5, size=shape)
    return out


class Workload:
    """Generates one tick of healthy arrays; faults then edit them (see faults.py)."""

    def __init__(self, topo: Topology, rng: np.random.Generator, start_ts: float,
                 init_s: float) -> None:
        self.topo, self.rng, self.start_ts, self.init_s = topo, rng, start_ts, init_s
        H = len(topo.hosts)
        self.H = H
        self.jobs = [JobState(iter_s=float(rng.uniform(1.1, 1.6)), start_ts=start_ts)
                     for _ in topo.jobs]
        self.host_job = np.array(topo.host_job, dtype=np.int64)
        self.job_size = np.array([len(topo.jobs[j].hosts) if j >= 0 else 0
                                  for j in topo.host_job], dtype=np.int64)
        pod_phase = rng.uniform(0, 2 * np.pi, size=max(h.pod for h in topo.hosts) + 1)
        self.host_phase = pod_phase[[h.pod for h in topo.hosts]]
        self.gpu_offset = rng.normal(0, 0.4, size=(H, GPUS_PER_HOST))
        self.mem_offset = rng.normal(0, 0.3, size=(H, GPUS_PER_HOST))
        self.host_mem_offset = rng.normal(0, 1.5, size=H)
        self.temp = np.full((H, GPUS_PER_HOST), 35.0) + self.gpu_offset
        self._build_ccl_static()
        self.gpu_blip, self.nic_blip = _blip_metrics("gpu"), _blip_metrics("nic")
        self.gpu_base = _static_baseline("gpu", (H, GPUS_PER_HOST), rng)
        self.nic_base = _static_baseline("nic", (H, GPUS_PER_HOST), rng)

    # --- jobs -----------------------------------------------------------------------------

    def reset_job_modifiers(self) -> None:
        for js in self.jobs:
            js.slow, js.paused = 1.0, False

    def advance_jobs(self, t: float, dt: float) -> None:
        for js in self.jobs:
            if js.status == INIT and t >= js.start_ts + self.init_s:
                if js.init_fails:
                    js.kill(t)
                else:
                    js.status = RUNNING
            elif js.status == RUNNING and not js.paused:
                js.progress += dt / (js.iter_s * js.slow)

    def host_codes(self) -> np.ndarray:
        codes = np.array([_CODE[js.status] for js in self.jobs] + [_IDLE], dtype=np.int64)
        return codes[self.host_job]  # host_job == -1 picks the trailing idle code

    # --- telemetry ------------------------------------------------------------------------

    def _telemetry(self, t: float, code: np.ndarray, P: np.ndarray, slow: np.ndarray,
                   a: TickArrays) -> None:
        """Running values for every host, then the other states patched row by row."""
        rng, H, G = self.rng, self.H, GPUS_PER_HOST
        phi = (2 * np.pi * P)[:, None]
        sin_phi = np.sin(phi)
        inv_slow = (1.0 / slow)[:, None]
        z = rng.standard_normal((8, H, G), dtype=np.float32)
        g, n = a.gpu, a.nic
        g[..., GI["gpu_util_pct"]] = np.minimum(100.0, 90 + 5 * sin_phi + 1.5 * z[0])
        g[..., GI["gpu_sm_clock_mhz"]] = 1980 - np.abs(8 * z[1])
        g[..., GI["gpu_power_w"]] = 620 + 40 * sin_phi * inv_slow + 10 * z[2]
        g[..., GI["gpu_tensor_tflops"]] = np.maximum(
            0, 420 * (0.95 + 0.05 * sin_phi) * inv_slow + 8 * z[4])
        g[..., GI["gpu_mem_used_gib"]] = 71.5 + self.mem_offset + 0.05 * z[5]
        pcie = 12e9 * (1 + 0.2 * np.sin(phi + 1)) * inv_slow * np.exp(0.05 * z[6])
        g[..., GI["gpu_pcie_rx_bps"]] = pcie
        g[..., GI["gpu_pcie_tx_bps"]] = pcie * 0.93
        nvl = 150e9 * (1 + 0.1 * sin_phi) * inv_slow * np.exp(0.03 * z[7])
        g[..., GI["gpu_nvlink_rx_bps"]] = nvl
        g[..., GI["gpu_nvlink_tx_bps"]] = nvl * 0.99
        zn = rng.standard_normal((2, H, G), dtype=np.float32)
        tx = 22e9 * (1 + 0.15 * np.sin(phi + 2)) * inv_slow * np.exp(0.04 * zn[0])
        n[..., NI["nic_tx_bps"]] = tx
        n[..., NI["nic_rx_bps"]] = tx * np.exp(0.02 * zn[1])
        n[..., NI["nic_link_up"]] = 1.0
        zh = rng.standard_normal((2, H), dtype=np.float32)
        a.host[:, HI["host_cpu_util_pct"]] = 28 + 2 * zh[0]
        a.host[:, HI["host_mem_used_pct"]] = 38 + self.host_mem_offset + 0.2 * zh[1]
        others = np.flatnonzero(code != _RUN)
        if len(others):
            self._not_running(code[others], others, z[:, others], zh[:, others], a)
        no_net = np.flatnonzero((self.job_size <= 1) & (code == _RUN))
        if len(no_net):  # a one-host job has no inter-host traffic
            n[no_net, :, NI["nic_tx_bps"]] *= 5e-5
            n[no_net, :, NI["nic_rx_bps"]] *= 5e-5
        ambient = 27 + 2 * np.sin(2 * np.pi * (t - self.start_ts) / 1800 + self.host_phase)
        target = ambient[:, None] + 0.055 * g[..., GI["gpu_power_w"]] + self.gpu_offset
        self.temp += 0.08 * (target - self.temp)
        g[..., GI["gpu_temp_c"]] = self.temp + 0.3 * z[3]
        self._blips(g, *self.gpu_blip)
        self._blips(n, *self.nic_blip)

    def _not_running(self, code: np.ndarray, rows: np.ndarray, z: np.ndarray, zh: np.ndarray,
                     a: TickArrays) -> None:
        """Hung (NCCL kernels spin: util 100, no work), initialising, dead or idle hosts."""
        g, n, host = a.gpu, a.nic, a.host
        hung = (code == _HUNG)[:, None]
        init = (code == _INIT)[:, None]
        busy = hung | init
        util = np.where(hung, 100 - np.abs(0.3 * z[0]),
                        np.where(init, 12 + 3 * z[0], np.abs(0.3 * z[0])))
        g[rows, :, GI["gpu_util_pct"]] = util
        g[rows, :, GI["gpu_sm_clock_mhz"]] = np.where(busy, 1980 - np.abs(8 * z[1]),
                                                      345 + np.abs(z[1]))
        g[rows, :, GI["gpu_power_w"]] = np.where(hung, 185 + 5 * z[2],
                                                 np.where(init, 150 + 5 * z[2], 70 + 2 * z[2]))
        g[rows, :, GI["gpu_tensor_tflops"]] = np.where(hung, 0.5, 0.0)
        g[rows, :, GI["gpu_mem_used_gib"]] = np.where(
            hung, 71.5 + self.mem_offset[rows], np.where(init, 30 + self.mem_offset[rows], 0.5))
        scale = np.where(hung, 1e-4, 0.0)
        for m in ("gpu_pcie_rx_bps", "gpu_pcie_tx_bps", "gpu_nvlink_rx_bps", "gpu_nvlink_tx_bps"):
            g[rows, :, GI[m]] *= scale
        g[rows, :, GI["gpu_throttle_mask"]] = np.where(busy, 0.0, 1.0)  # 0x1 = GPU idle
        for m in ("nic_tx_bps", "nic_rx_bps"):
            n[rows, :, NI[m]] *= np.where(hung, 5e-5, 1e-6)
        c = code
        host[rows, HI["host_cpu_util_pct"]] = np.where(
            c == _HUNG, 12 + zh[0], np.where(c == _INIT, 40 + 3 * zh[0], 3 + np.abs(0.5 * zh[0])))
        host[rows, HI["host_mem_used_pct"]] = np.where(
            c == _HUNG, host[rows, HI["host_mem_used_pct"]], 8 + 0.1 * np.abs(zh[1]))

    def _blips(self, arr: np.ndarray, idx: np.ndarray, floors: np.ndarray) -> None:
        """Rare small nonzero readings of abnormal metrics, always below the floor."""
        u = self.rng.random(arr.shape[:2] + (len(idx),), dtype=np.float32)
        hh, dd, mm = np.nonzero(u < BLIP_P)
        if len(hh):  # uniform in [0.1, 0.6)·floor, reusing u
            arr[hh, dd, idx[mm]] = floors[mm] * (0.1 + 0.5 * u[hh, dd, mm] / BLIP_P)

    # --- CCL ------------------------------------------------------------------------------

    def _build_ccl_static(self) -> None:
        topo, H = self.topo, self.H
        E = max((len(es) for es in topo.host_entries), default=0)
        self.E = E
        self.n_entries = np.array([len(es) for es in topo.host_entries], dtype=np.int64)
        self.launches = np.zeros((H, E, K))
        self.wr_per_op = np.zeros((H, E, K), dtype=np.int64)
        self.td_base = np.zeros((H, E, K))
        self.n_base = np.zeros((H, E, K))
        for h, ents in enumerate(topo.host_entries):
            for e, ent in enumerate(ents):
                c = topo.comms[ent.comm]
                self.launches[h, e] = _LAUNCHES[c.kind]
                scale = 1.0 + (0.0003 * c.size if c.kind == "dp" else 0.0)
                self.td_base[h, e] = np.array(_TD_US[c.kind]) * scale
                if c.uses_network:
                    steps = (2 * (c.size - 1), c.size - 1) if c.kind == "dp" else (1, 1)
                    self.wr_per_op[h, e] = np.array(steps) * CHANNELS
                    self.n_base[h, e] = _N_US[c.kind]
        self.prev_td = self.td_base.copy()
        self.prev_n = self.n_base.copy()
        self.prev_last = np.full((H, E), self.start_ts)
        self.prev_cl, self.prev_wr, self.prev_wc, self.prev_seq = (
            np.zeros((H, E, K), dtype=np.int64) for _ in range(4))
        self.skew = INOP_W * self.rng.random((H, E, K))

    def _ccl(self, t: float, code: np.ndarray, P: np.ndarray, slow: np.ndarray,
             a: TickArrays) -> None:
        """Aegis §4.2 counters from the op position x = progress × launches: CL = ops
        launched, WR/WC = work requests posted/completed (WR == WC between ops)."""
        rng, H, E = self.rng, self.H, self.E
        live = (code == _RUN) | (code == _HUNG)
        a.ccl_hosts = live & (self.n_entries > 0)
        x = P[:, None, None] * self.launches
        y = x + self.skew  # a rank's own snapshot position (fixed skew < INOP_W)
        run3 = (code == _RUN)[:, None, None]
        hung3 = (code == _HUNG)[:, None, None]
        u = rng.random((H, E, K, 3), dtype=np.float32)
        inop = run3 & (y - np.floor(y) >= 1.0 - INOP_W)
        done = np.where(hung3, hung_ops(x), np.floor(y)).astype(np.int64)
        partial = np.where(inop, 1 + (u[..., 1] * np.maximum(self.wr_per_op // 2, 1)), 0)
        partial = np.where(self.wr_per_op > 0, partial, 0).astype(np.int64)
        a.cl[:] = done + inop
        a.wr[:] = done * self.wr_per_op + partial
        a.wc[:] = a.wr - np.minimum(partial, (u[..., 2] * 4).astype(np.int64) + 1) * (partial > 0)
        a.seq[:] = done
        jitter = np.exp(0.03 * rng.standard_normal((H, E, K), dtype=np.float32))
        wait = 0.15 * np.sqrt(u[..., 1])  # arrival spread: the last to arrive waits ~0
        a.td[:] = np.where(run3, self.td_base * (slow[:, None, None] * jitter + wait),
                           self.prev_td)
        n_noise = np.exp(0.05 * rng.standard_normal((H, E, K), dtype=np.float32))
        a.n[:] = np.where(run3, self.n_base * n_noise, self.prev_n)
        a.last[:] = np.where((code == _RUN)[:, None], t - 0.05 * u[..., 0, 2], self.prev_last)

    # --- tick -----------------------------------------------------------------------------

    def generate(self, t: float) -> TickArrays:
        H, E = self.H, self.E
        code = self.host_codes()
        prog = np.array([js.progress for js in self.jobs] + [0.0])[self.host_job]
        slow = np.array([js.slow for js in self.jobs] + [1.0])[self.host_job]
        a = TickArrays(
            t=t, gpu=self.gpu_base.copy(), nic=self.nic_base.copy(),
            host=np.zeros((H, len(HOST_METRICS))), cl=np.empty((H, E, K), np.int64),
            wr=np.empty((H, E, K), np.int64), wc=np.empty((H, E, K), np.int64),
            seq=np.empty((H, E, K), np.int64), td=np.empty((H, E, K)), n=np.empty((H, E, K)),
            last=np.empty((H, E)), ccl_hosts=np.zeros(H, bool))
        self._telemetry(t, code, prog, slow, a)
        self._ccl(t, code, prog, slow, a)
        return a

    def commit(self, a: TickArrays) -> None:
        """Once faults have edited the tick: cumulative counters never go back (Aegis §4.2
        reads CL/WR/WC as cumulative; a drop would read as a counter reset), WC <= WR and
        seq <= CL. Then remember TD/N/last so a hung rank keeps its frozen values."""
        for cur, prev in ((a.cl, self.prev_cl), (a.wr, self.prev_wr), (a.wc, self.prev_wc),
                          (a.seq, self.prev_seq)):
            np.maximum(cur, prev, out=cur)
        np.minimum(a.wc, a.wr, out=a.wc)
        np.minimum(a.seq, a.cl, out=a.seq)
        self.prev_cl, self.prev_wr, self.prev_wc, self.prev_seq = a.cl, a.wr, a.wc, a.seq
        self.prev_td, self.prev_n, self.prev_last = a.td, a.n, a.last

    def job_rows(self, job: int) -> np.ndarray:
        return np.flatnonzero(self.host_job == job)

    def is_dead(self, job: int) -> bool:
        return self.jobs[job].status == DEAD


def hung_ops(x: np.ndarray | float) -> np.ndarray:
    """Ops completed by every rank of a comm frozen at op position ``x``: any op one of its
    ranks had launched (skew + in-op window < 2·INOP_W) completes, so CL never drops."""
    return np.floor(np.asarray(x) + 2 * INOP_W)
