"""What a fault is, and the symptom building blocks the catalogue shares.

A fault is scheduled before the run (culprit, start time, all future log lines known), then
each tick it may change its job's loop (``before``: slow down, pause, hang, kill) and edit the
tick's arrays (``after``: telemetry and CCL symptoms on the culprit and its peers). Its
``truth()`` is the label the run writes next to its output (docs/simulator.md).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from processors.core.base import gpu_id, link_id, nic_id
from producers.sim import log_templates as lt
from producers.sim.state import HUNG, LogQueue, TickArrays
from producers.sim.topology import GPUS_PER_HOST, Topology, gpu_bus_id
from producers.sim.workload import Workload, hung_ops


@dataclass(slots=True)
class Ctx:
    """What faults may read and schedule into; one per simulation."""

    topo: Topology
    work: Workload
    logs: LogQueue
    start_ts: float
    end_ts: float
    watchdog_s: float
    ib_timeout_s: float
    now: float = 0.0  # event time of the tick being built

    def log(self, ts: float, host: int, source: str, line: str) -> None:
        """Schedule a line; never before the current tick, so output stays in time order."""
        ts = max(ts, self.now)
        if ts < self.end_ts:
            self.logs.add(ts, host, source, line)

    def slots(self, comm: int) -> tuple[np.ndarray, np.ndarray]:
        """(hosts, entries) of each rank of ``comm``, in rank order."""
        c = self.topo.comms[comm]
        hosts = np.array([h for h, _ in c.members], dtype=np.int64)
        ents = np.array([self.topo.entry_index(h, comm, g) for h, g in c.members], dtype=np.int64)
        return hosts, ents


@dataclass
class Fault:
    """Base: a culprit in one job from ``start_ts``; subclasses add symptoms."""

    scenario: ClassVar[str] = ""
    category: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    kinds: ClassVar[tuple[str, ...]] = ()
    must_detect: ClassVar[bool] = True
    in_mixed: ClassVar[bool] = True  # drawn by mixed mode (with its Aegis §2 share)

    ctx: Ctx
    fault_id: str
    job: int
    start_ts: float
    rng: np.random.Generator
    host: int = -1
    gpu: int = -1
    end_ts: float | None = None
    extra_hosts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        hosts = self.ctx.topo.jobs[self.job].hosts
        if self.host < 0:
            self.host = int(hosts[int(self.rng.integers(len(hosts)))])
        if self.gpu < 0:
            self.gpu = int(self.rng.integers(GPUS_PER_HOST))

    # --- hooks -----------------------------------------------------------------------------

    def setup(self) -> None:
        """Schedule log lines and job-level settings; called once before the first tick."""

    def before(self, t: float) -> None:
        """Change the job's loop for this tick (slow, pause, hang, kill)."""

    def after(self, a: TickArrays) -> None:
        """Edit this tick's arrays once the fault is active."""

    # --- truth -----------------------------------------------------------------------------

    @property
    def host_name(self) -> str:
        return self.ctx.topo.hosts[self.host].name

    @property
    def job_name(self) -> str:
        return self.ctx.topo.jobs[self.job].name

    def culprit(self) -> dict[str, list[str]]:
        return {"hosts": [self.host_name], "gpus": [gpu_id(self.host_name, self.gpu)],
                "nics": [], "links": []}

    def actions(self) -> list[list[str]]:
        return []

    def truth(self) -> dict[str, Any]:
        acts = self.actions()
        return {"fault_id": self.fault_id, "scenario": self.scenario, "category": self.category,
                "job": self.job_name, "culprit": self.culprit(), "start_ts": self.start_ts,
                "end_ts": self.end_ts if self.end_ts is not None else self.ctx.end_ts,
                "expected_kinds": list(self.kinds), "must_detect": self.must_detect,
                "expected_actions": acts,
                "should_isolate": any(a[0] in ("isolate_host", "isolate_gpu") for a in acts),
                "summary": self.summary}

    # --- building blocks ------------------------------------------------------------------

    def comms_of_gpu(self, host: int, gpu: int) -> list[int]:
        topo = self.ctx.topo
        return [e.comm for e in topo.host_entries[host] if e.gpu == gpu]

    def wait_for(self, a: TickArrays, host: int, gpu: int) -> None:
        """Aegis §4.2 computation-side hang: every other rank of the culprit's comms has
        launched the next op (CL = culprit's CL + 1) and waits in it with WR == WC."""
        for c in self.comms_of_gpu(host, gpu):
            hosts, ents = self.ctx.slots(c)
            k = _next_op(self.ctx.work, self.job, int(hosts[0]), int(ents[0]))
            others = np.ones(len(hosts), dtype=bool)
            others[self.ctx.topo.rank_in(c, host, gpu)] = False
            a.cl[hosts[others], ents[others], k] += 1

    def late_arrival(self, a: TickArrays, host: int, gpu: int, delay: float) -> None:
        """Aegis §5.2 compute degradation: the slow rank arrives last, so it waits least (its
        TD ≈ the bare op time) while every peer in its comms waits ``delay``·base longer."""
        w = self.ctx.work
        slow = w.jobs[self.job].slow
        for c in self.comms_of_gpu(host, gpu):
            hosts, ents = self.ctx.slots(c)
            me = self.ctx.topo.rank_in(c, host, gpu)
            base = w.td_base[hosts, ents]  # (size, K)
            a.td[hosts, ents] += delay * base * slow
            jitter = np.exp(0.02 * self.rng.standard_normal(base.shape[1]))
            a.td[hosts[me], ents[me]] = base[me] * slow * jitter

    def schedule_watchdog(self, t: float, skip: Collection[tuple[int, int]] = ()) -> None:
        """PyTorch watchdog timeouts on every rank of the job (minus ``skip``) at ``t``; call
        it once the job is hung, so the work sequence number is the stuck op's."""
        job = self.ctx.topo.jobs[self.job]
        timeout_ms = int(self.ctx.watchdog_s * 1000)
        seq = int(self.ctx.work.jobs[self.job].progress * 24) + 1
        for pos, h in enumerate(job.hosts):
            for g in range(GPUS_PER_HOST):
                if (h, g) in skip:
                    continue
                ts = t + float(self.rng.uniform(0.0, 1.5))
                rank = job.global_rank(pos, g)
                for line in lt.torch_watchdog_timeout(ts, rank, seq, "ALLREDUCE", 466119168,
                                                      timeout_ms, timeout_ms + int(self.rng.integers(5, 120))):
                    self.ctx.log(ts, h, "training", line)

    def stop_reporting(self, a: TickArrays, host: int, gpu: int) -> None:
        """The process on ``gpu`` is gone: its ranks' CCL records stop."""
        a.dropped.setdefault(host, set()).update(
            e for e, ent in enumerate(self.ctx.topo.host_entries[host]) if ent.gpu == gpu)

    def hung(self, a: TickArrays, skip: Collection[tuple[int, int]] = ()) -> bool:
        """True on ticks after the start while the job hangs; the first such tick schedules
        the watchdog timeouts (every rank but ``skip``), for every hang-type fault."""
        if a.t < self.start_ts or self.ctx.work.jobs[self.job].status != HUNG:
            return False
        if not getattr(self, "_watchdog_scheduled", False):
            self._watchdog_scheduled = True
            self.schedule_watchdog(self.start_ts + self.ctx.watchdog_s, skip=skip)
        return True

    def schedule_ib_errors(self, t: float, host: int, rail: int) -> None:
        """NCCL IB completion errors on the ring neighbours of ``host`` on ``rail``, naming it."""
        topo = self.ctx.topo
        dp = topo.comm_of(host, "dp", rail)
        comm = topo.comms[dp]
        me = topo.rank_in(dp, host, rail)
        dead_ip = topo.hosts[host].rail_ips[rail]
        for r in sorted(set(comm.ring_neighbours(me)) - {me}):
            ph = comm.members[r][0]
            ts = t + float(self.rng.uniform(0.0, 2.0))
            pre = lt.nccl_prefix(topo.hosts[ph].name, ph, rail, thread=311)
            line = lt.nccl_ib_completion_error(pre, dead_ip, int(self.rng.integers(32768, 61000)),
                                               topo.hosts[ph].rail_ips[rail])
            self.ctx.log(ts, ph, "nccl", line)


class FatalGpuFault(Fault):
    """A GPU error that kills the culprit's process; the job hangs, then times out (Aegis §3:
    a CCL timeout is the first distributed signal, not the root cause)."""

    kinds = ("critical_error",)
    cuda_error: ClassVar[str] = lt.CUDA_LAUNCH_FAILURE

    def setup(self) -> None:
        self.crash_ts = self.start_ts + float(self.rng.uniform(0.5, 2.5))
        self.dead_ts = self.start_ts + self.ctx.watchdog_s + 3.0
        self.end_ts = min(self.dead_ts, self.ctx.end_ts)
        self.kernel_lines(self.start_ts)
        rank = self.global_rank(self.host, self.gpu)
        self.ctx.log(self.crash_ts, self.host, "training",
                     lt.torch_watchdog_cuda_error(self.crash_ts, rank, self.cuda_error))
        self.schedule_ib_errors(self.start_ts + self.ctx.ib_timeout_s, self.host, self.gpu)
        self._timeouts_scheduled = False

    def kernel_lines(self, t: float) -> None:
        raise NotImplementedError

    def global_rank(self, host: int, gpu: int) -> int:
        job = self.ctx.topo.jobs[self.job]
        return job.global_rank(job.hosts.index(host), gpu)

    def before(self, t: float) -> None:
        hang_then_kill(self, t)

    def after(self, a: TickArrays) -> None:
        if a.t < self.start_ts:
            return
        self.gpu_symptoms(a)
        if not self._timeouts_scheduled:
            self._timeouts_scheduled = True
            self.schedule_watchdog(self.start_ts + self.ctx.watchdog_s, skip={(self.host, self.gpu)})
        if self.ctx.work.jobs[self.job].status == HUNG:
            self.wait_for(a, self.host, self.gpu)
            if a.t >= self.crash_ts:  # the culprit's process is gone: its ranks stop reporting
                self.stop_reporting(a, self.host, self.gpu)

    def gpu_symptoms(self, a: TickArrays) -> None:
        """Telemetry of the failed GPU; subclasses override."""

    def actions(self) -> list[list[str]]:
        return [["isolate_host", self.host_name], ["restart_job", self.job_name]]

    def bus(self) -> str:
        return gpu_bus_id(self.gpu)

    def pid(self) -> int:
        return lt.pid_of(self.host, self.gpu)


class LinkFault(Fault):
    """A fault on the link of NIC ``gpu`` (rail) of the culprit host: host NIC ↔ its ToR."""

    def nic_name(self) -> str:
        return nic_id(self.host_name, self.gpu)

    def link_name(self) -> str:
        return link_id(self.nic_name(), self.ctx.topo.hosts[self.host].tors[self.gpu])

    def culprit(self) -> dict[str, list[str]]:
        return {"hosts": [self.host_name], "gpus": [], "nics": [self.nic_name()],
                "links": [self.link_name()]}

    def actions(self) -> list[list[str]]:
        return [["run_netdiag", self.nic_name()]]

    def link_ranks(self) -> tuple[int, np.ndarray, np.ndarray, int, int, int]:
        """(dp comm, hosts, entries, my rank, prev rank, next rank) of the culprit's rail ring."""
        topo = self.ctx.topo
        dp = topo.comm_of(self.host, "dp", self.gpu)
        hosts, ents = self.ctx.slots(dp)
        me = topo.rank_in(dp, self.host, self.gpu)
        prev, nxt = topo.comms[dp].ring_neighbours(me)
        return dp, hosts, ents, me, prev, nxt

    def slow_ranks(self, a: TickArrays, factor: float) -> None:
        """Aegis §5.2 communication degradation: N of the ranks whose WRs cross the link (the
        culprit sends out through it, its ring predecessor sends in through it)."""
        _, hosts, ents, me, prev, _ = self.link_ranks()
        f = max(factor, _needed_factor(len(hosts)))
        for r in {me, prev}:
            a.n[hosts[r], ents[r]] *= f * np.exp(0.05 * self.rng.standard_normal(2))


def _needed_factor(n: int, target: float = 1.8) -> float:
    """Slowdown of the 2 ranks over a link that puts them at ``target``x their ring's mean N
    (Aegis §5.2 flags > β = 1.5x): f·n / (2f + n − 2) = target. Capped for small rings."""
    if n <= 2 * target:
        return 12.0
    return min(12.0, target * (n - 2) / (n - 2 * target))


def _next_op(work: Workload, job: int, host: int, entry: int) -> int:
    """The op kind a comm launches next, from the job's (frozen) progress."""
    p = work.jobs[job].progress
    launches = work.launches[host, entry]
    nxt = (hung_ops(p * launches) + 1) / launches
    return int(np.argmin(nxt))


def hang_then_kill(fault: Any, t: float) -> None:
    """The job hangs at the fault's start and its processes die at ``dead_ts`` (the
    watchdog or IB timeout), as every hang-type fault does."""
    js = fault.ctx.work.jobs[fault.job]
    if t >= fault.start_ts:
        js.hang(fault.start_ts)
    if t >= fault.dead_ts:
        js.kill(fault.dead_ts)


def slow_job(fault: Any, t: float) -> None:
    """From the fault's start its job's iterations take ``fault.job_slow`` times longer."""
    if t >= fault.start_ts:
        fault.ctx.work.jobs[fault.job].slow *= fault.job_slow
