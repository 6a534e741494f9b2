"""Host faults: a host (or a rack of hosts) loses power. Everything it sent stops at once, its
agent included: no telemetry, no log line, no heartbeat, no CCL record. Its peers are what
is left to tell: their CCL counters wait on it, their IB connections to it fail, their
watchdogs fire (Aegis §3: RootDiag names the host the failed connections centre on; §4.2:
the ranks that stopped reporting). Not drawn by mixed mode (its host share stays with the
scenarios that show host symptoms while the host still reports)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from processors.core.base import gpu_id
from producers.sim.fault_base import Fault, _next_op, hang_then_kill
from producers.sim.state import TickArrays
from producers.sim.topology import GPUS_PER_HOST


class HostDown(Fault):
    """One host powers off (a PSU, a kernel panic with no console): it goes dark mid-step."""

    scenario, category = "host_down", "host"
    summary = "a host loses power: its telemetry, logs and CCL records stop; peers' IB errors name it"
    kinds = ("hang_compute", "dist_error")
    in_mixed = False
    size: ClassVar[int] = 1  # hosts that go dark together

    def setup(self) -> None:
        job = self.ctx.topo.jobs[self.job].hosts
        if len(job) < 3:
            raise ValueError(f"{self.scenario}: needs a job of at least 3 hosts (has {len(job)})")
        n = max(1, min(self.size, (len(job) - 1) // 2))  # fewer than half of the job goes dark
        i = min(job.index(self.host), len(job) - n)  # a rack: hosts in a row
        self.down = [int(h) for h in job[i:i + n]]
        self.host = self.down[0]
        self.dead_ts = self.start_ts + self.ctx.watchdog_s + 3.0
        self.end_ts = min(self.dead_ts, self.ctx.end_ts)
        for h in self.down:
            self.ctx.logs.go_dark(h, self.start_ts)
            for rail in range(GPUS_PER_HOST):
                self.schedule_ib_errors(self.start_ts + self.ctx.ib_timeout_s, h, rail)
        self._comms = sorted({e.comm for h in self.down for e in self.ctx.topo.host_entries[h]})

    def before(self, t: float) -> None:
        hang_then_kill(self, t)

    def after(self, a: TickArrays) -> None:
        if a.t < self.start_ts:
            return
        a.dark.update(self.down)
        a.ccl_hosts[self.down] = False
        if not self.hung(a):  # its watchdog lines: the dark hosts write none
            return
        for c in self._comms:  # the live ranks launched the next op and wait in it
            hosts, ents = self.ctx.slots(c)
            live = ~np.isin(hosts, self.down)
            if live.any():
                k = _next_op(self.ctx.work, self.job, int(hosts[0]), int(ents[0]))
                a.cl[hosts[live], ents[live], k] += 1

    def culprit(self) -> dict[str, list[str]]:
        names = [self.ctx.topo.hosts[h].name for h in self.down]
        return {"hosts": names, "gpus": [gpu_id(n, g) for n in names for g in range(GPUS_PER_HOST)],
                "nics": [], "links": []}

    def actions(self) -> list[list[str]]:
        return [*(["isolate_host", self.ctx.topo.hosts[h].name] for h in self.down),
                ["restart_job", self.job_name]]


class RackPowerLoss(HostDown):
    """A rack's PDU trips: four hosts in a row go dark together (fewer in a job of under 9
    hosts: less than half of it)."""

    scenario = "rack_power_loss"
    summary = "a rack loses power: 4 hosts in a row go dark at once; peers' IB errors name them"
    size = 4
