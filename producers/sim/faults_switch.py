"""Switch faults: a rail ToR that degrades or dies takes every link it serves with it (Aegis
§2: rail-optimised wiring sends NIC i of every host of a pod to the ToR of rail i). The
culprit is the switch, one NetDiag on it; no host is isolated."""

from __future__ import annotations

import numpy as np

from processors.core.base import link_id, nic_id
from producers.sim import log_templates as lt
from producers.sim.fault_base import LinkFault, _next_op, hang_then_kill, slow_job
from producers.sim.state import HUNG, NI, TickArrays
from producers.sim.topology import netdev_name, nic_bus_id


class SwitchFault(LinkFault):
    """The ToR of the culprit's rail (``gpu``) and pod, and the job's hosts behind it."""

    in_mixed = False  # roll-up cases for tests; mixed keeps its Aegis §2 draws

    def behind(self) -> None:
        topo = self.ctx.topo
        self.tor = topo.hosts[self.host].tors[self.gpu]
        self.under = [h for h in topo.jobs[self.job].hosts if topo.hosts[h].tors[self.gpu] == self.tor]
        ring = len(self.link_ranks()[1])
        if 4 * len(self.under) > ring:  # more: the whole ring is slow, nobody stands out
            raise ValueError(f"{self.scenario}: the ToR serves {len(self.under)} of the job's "
                             f"{ring} hosts; it needs at most a quarter (fewer hosts per pod: "
                             "--hosts-per-pod)")

    def ranks_over(self) -> list[tuple[int, int, int]]:
        """(my rank, ring predecessor, ring successor) on the rail ring per host behind it."""
        topo = self.ctx.topo
        dp = topo.comm_of(self.host, "dp", self.gpu)
        out = []
        for h in self.under:
            me = topo.rank_in(dp, h, self.gpu)
            prev, nxt = topo.comms[dp].ring_neighbours(me)
            out.append((me, prev, nxt))
        return out

    def culprit(self) -> dict[str, list[str]]:
        topo = self.ctx.topo
        nics = [nic_id(topo.hosts[h].name, self.gpu) for h in self.under]
        return {"hosts": [], "gpus": [], "nics": nics,
                "links": [link_id(n, self.tor) for n in nics]}

    def actions(self) -> list[list[str]]:
        return [["run_netdiag", self.tor]]


class TorDegraded(SwitchFault):
    """A failing line card or buffer: every link of the ToR marks ECN and retransmits, and N
    is slow on the ranks whose work requests cross it (Aegis §5.2 N > β·mean)."""

    scenario, category = "tor_degraded", "NIC"
    summary = "a rail ToR switch degrades: ECN, retransmits and slow N on every link it serves"
    kinds = ("slow_network",)
    job_slow, n_factor = 1.3, 2.5

    def setup(self) -> None:
        self.behind()

    def before(self, t: float) -> None:
        slow_job(self, t)

    def after(self, a: TickArrays) -> None:
        if a.t < self.start_ts or self.ctx.work.jobs[self.job].status == HUNG:
            return
        _, hosts, ents, _, _, _ = self.link_ranks()
        slow: set[int] = set()
        for h, (me, prev, _) in zip(self.under, self.ranks_over(), strict=True):
            slow.update((me, prev))
            ecn = float(self.rng.uniform(5_000, 20_000))
            nic = a.nic[h, self.gpu]
            nic[NI["nic_ecn_per_s"]] = ecn
            nic[NI["nic_cnp_sent_per_s"]] = ecn * float(self.rng.uniform(0.8, 0.95))
            nic[NI["nic_retrans_per_s"]] = float(self.rng.uniform(80, 400))
        for r in sorted(slow):
            a.n[hosts[r], ents[r]] *= self.n_factor * np.exp(0.05 * self.rng.standard_normal(2))


class TorDown(SwitchFault):
    """The ToR dies: every NIC behind it logs its link down, the rail ring hangs with WR > WC
    on the ranks sending over its links (Aegis §4.2), their ring peers' IB completion errors
    name the dead addresses, and the watchdog kills the job."""

    scenario, category = "tor_down", "NIC"
    summary = "a rail ToR switch dies: every link it serves goes down, WR>WC over them, job hangs"
    kinds = ("hang_network",)

    def setup(self) -> None:
        self.behind()
        self.dead_ts = self.start_ts + self.ctx.watchdog_s + 3.0
        self.end_ts = min(self.dead_ts, self.ctx.end_ts)
        self.outstanding = {h: int(self.rng.integers(8, 64)) for h in self.under}
        i = self.gpu
        bus, dev, ib = nic_bus_id(i), netdev_name(i), f"mlx5_{i}"
        for h in self.under:
            t = self.start_ts + float(self.rng.uniform(0.0, 0.3))
            self.ctx.log(t, h, "kernel", lt.mlx5_netdev_link(bus, dev, False))
            self.ctx.log(t + 0.006, h, "kernel", lt.mlx5_port_state(bus, ib, False))
            self.schedule_ib_errors(self.start_ts + self.ctx.ib_timeout_s, h, i)

    def before(self, t: float) -> None:
        hang_then_kill(self, t)

    def after(self, a: TickArrays) -> None:
        for h in self.under:  # the links are down from the start, hung or not
            if a.t >= self.start_ts:
                nic = a.nic[h, self.gpu]
                nic[NI["nic_link_up"]] = 0.0
                nic[NI["nic_tx_bps"]] = nic[NI["nic_rx_bps"]] = 0.0
        if not self.hung(a):
            return
        _, hosts, ents, _, _, _ = self.link_ranks()
        k = _next_op(self.ctx.work, self.job, int(hosts[0]), int(ents[0]))
        posted = self.ctx.work.wr_per_op[hosts, ents, k] // 3  # all inside the op, part posted
        a.cl[hosts, ents, k] += 1
        a.wr[hosts, ents, k] += posted
        a.wc[hosts, ents, k] += posted
        stuck: dict[int, set[int]] = {}
        for h, (me, prev, nxt) in zip(self.under, self.ranks_over(), strict=True):
            stuck.setdefault(me, set()).update((prev, nxt))
            stuck.setdefault(prev, set()).add(me)
            stuck.setdefault(nxt, set()).add(me)
            a.wr[int(hosts[me]), int(ents[me]), k] += self.outstanding[h]
        for r, peers in stuck.items():
            h, e = int(hosts[r]), int(ents[r])
            if a.wr[h, e, k] == a.wc[h, e, k]:
                a.wr[h, e, k] += 8  # a peer of a dead link: its sends into it never complete
            a.pending[(h, e)] = tuple(sorted(peers - {r}))
