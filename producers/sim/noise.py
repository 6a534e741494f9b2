"""Harmless log lines of a normal training run: NCCL INFO at start-up, one mlx5 probe line per
host, and Megatron iteration lines every 10 iterations (elapsed time reflects slowdowns)."""

from __future__ import annotations

import numpy as np

from producers.sim import log_templates as lt
from producers.sim.fault_base import Ctx
from producers.sim.state import RUNNING
from producers.sim.topology import GPUS_PER_HOST, gpu_bus_id, nic_bus_id

LOG_EVERY = 10
TOTAL_ITERS = 500_000
GLOBAL_BATCH = 1024


class NoiseLogs:
    def __init__(self, ctx: Ctx, rng: np.random.Generator) -> None:
        self.ctx, self.rng = ctx, rng

    def startup(self) -> None:
        ctx, topo, rng = self.ctx, self.ctx.topo, self.rng
        init_s = ctx.work.init_s
        for h in topo.hosts:
            ctx.log(ctx.start_ts + float(rng.uniform(0, 0.5)), h.index, "kernel",
                    lt.mlx5_slot_power(nic_bus_id(0), int(rng.integers(300, 900))))
        for j, job in enumerate(topo.jobs):
            if ctx.work.jobs[j].init_fails:
                continue
            comm_id = f"{int(rng.integers(1 << 62)) ^ topo.salt():016x}"
            nranks = len(job.hosts) * GPUS_PER_HOST
            for pos, hi in enumerate(job.hosts):
                h = topo.hosts[hi]
                for g in range(GPUS_PER_HOST):
                    t0 = ctx.start_ts + float(rng.uniform(1.0, max(1.5, init_s * 0.4)))
                    pre = lt.nccl_prefix(h.name, hi, g)
                    ctx.log(t0, hi, "nccl", lt.nccl_bootstrap(pre, "eth0", h.mgmt_ip))
                    pre_t = lt.nccl_prefix(h.name, hi, g, thread=250 + g)
                    ctx.log(t0 + 0.3, hi, "nccl",
                            lt.nccl_net_ib(pre_t, list(h.nics), "eth0", h.mgmt_ip))
                    t1 = ctx.start_ts + init_s - float(rng.uniform(0.1, 1.0))
                    ptr = 0x55D000000000 + int(rng.integers(1 << 32))
                    ctx.log(t1, hi, "nccl", lt.nccl_init_complete(
                        pre_t, ptr, job.global_rank(pos, g), nranks, g, gpu_bus_id(g), comm_id))
            first = topo.hosts[job.hosts[0]]
            ctx.log(ctx.start_ts + 1.0, first.index, "nccl", f"NCCL version {lt.NCCL_VERSION}")

    def iteration_lines(self, t: float) -> None:
        """Megatron prints from the last rank; one line per LOG_EVERY iterations completed."""
        ctx, rng = self.ctx, self.rng
        for j, js in enumerate(ctx.work.jobs):
            if js.status != RUNNING:
                continue
            while js.progress >= js.next_log_iter:
                it = js.next_log_iter
                js.next_log_iter += LOG_EVERY
                ms = js.iter_s * js.slow * 1000 * float(np.exp(0.01 * rng.standard_normal()))
                loss = 2.2 + 8.0 / (1 + it / 300) + 0.02 * float(rng.standard_normal())
                lr = 3e-4 * min(1.0, it / 2000)
                last = ctx.topo.jobs[j].hosts[-1]
                ctx.log(t, last, "training", lt.megatron_iteration(
                    it, TOTAL_ITERS, GLOBAL_BATCH, ms, lr, loss, 0.2 + 0.05 * float(rng.random())))
