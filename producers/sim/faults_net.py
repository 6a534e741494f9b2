"""Network and distributed faults (Aegis §3 DistError/ConfigCheck, §4.2 WR≠WC, §5.1/§5.2)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from producers.sim import log_templates as lt
from producers.sim.fault_base import Fault, LinkFault, _next_op, hang_then_kill, slow_job
from producers.sim.state import HUNG, NI, TickArrays, put
from producers.sim.topology import GPUS_PER_HOST, netdev_name, nic_bus_id


class NetworkHang(LinkFault):
    """Aegis §4.2: everyone hangs inside Ci; the ranks with posted-but-uncompleted WRs (WR>WC)
    name the peers across the bad link in ``pending_peers``."""

    scenario, category = "network_hang", "NIC"
    summary = "a link silently stops delivering: WR>WC on the ranks using it, job hangs"
    kinds = ("hang_network",)

    def setup(self) -> None:
        self.dead_ts = self.start_ts + self.ctx.watchdog_s + 3.0
        self.end_ts = min(self.dead_ts, self.ctx.end_ts)
        self.outstanding = {r: int(self.rng.integers(8, 64)) for r in range(3)}

    def before(self, t: float) -> None:
        hang_then_kill(self, t)

    def after(self, a: TickArrays) -> None:
        if not self.hung(a):
            return
        _, hosts, ents, me, prev, nxt = self.link_ranks()
        k = _next_op(self.ctx.work, self.job, int(hosts[0]), int(ents[0]))
        wpo = self.ctx.work.wr_per_op[hosts, ents, k]
        posted = wpo // 3  # every rank is inside the op and has posted part of its WRs
        a.cl[hosts, ents, k] += 1
        a.wr[hosts, ents, k] += posted
        a.wc[hosts, ents, k] += posted
        stuck = {me: (prev, nxt), prev: (me,), nxt: (me,)}
        for i, (r, peers) in enumerate(stuck.items()):
            h, e = int(hosts[r]), int(ents[r])
            a.wr[h, e, k] += self.outstanding[i]
            a.pending[(h, e)] = tuple(sorted(set(peers) - {r}))
        a.nic[self.host, self.gpu, NI["nic_retrans_per_s"]] = float(self.rng.uniform(200, 1500))


class SlowLinkBase(LinkFault):
    """Shared shape of the degradation faults on one link."""

    kinds: ClassVar[tuple[str, ...]] = ("slow_network",)
    job_slow, n_factor = 1.12, 2.3

    def before(self, t: float) -> None:
        slow_job(self, t)

    def after(self, a: TickArrays) -> None:
        if a.t < self.start_ts or self.ctx.work.jobs[self.job].status == HUNG:
            return
        self.slow_ranks(a, self.n_factor)
        self.nic_symptoms(a)

    def nic_symptoms(self, a: TickArrays) -> None:
        """Telemetry of the culprit NIC and its peers."""


class SlowLink(SlowLinkBase):
    scenario, category = "slow_link", "NIC"
    summary = "a link trained at half speed: N on the ranks over it > 1.5x mean"

    def nic_symptoms(self, a: TickArrays) -> None:
        a.nic[self.host, self.gpu, NI["nic_tx_bps"]] *= 0.5
        a.nic[self.host, self.gpu, NI["nic_rx_bps"]] *= 0.5


class NicECN(SlowLinkBase):
    """Aegis §5.1 case: one NIC's ECN rate went from 0 to 10–30K/s, iteration time +26%."""

    scenario, category = "nic_ecn", "NIC"
    summary = "one NIC's ECN 0 -> 10-30K/s, retransmits up, iteration time +26%"
    job_slow, n_factor = 1.26, 2.0

    def nic_symptoms(self, a: TickArrays) -> None:
        ecn = float(self.rng.uniform(10_000, 30_000))
        nic = a.nic[self.host, self.gpu]
        nic[NI["nic_ecn_per_s"]] = ecn
        nic[NI["nic_cnp_sent_per_s"]] = ecn * float(self.rng.uniform(0.8, 0.95))
        nic[NI["nic_retrans_per_s"]] = float(self.rng.uniform(80, 400))
        _, hosts, _, _, prev, _ = self.link_ranks()  # the sender into the congested hop
        a.nic[int(hosts[prev]), self.gpu, NI["nic_cnp_handled_per_s"]] = ecn * 0.5


class LargePacketLoss(SlowLinkBase):
    """Aegis §3 OfflineDiag case: a switch silently dropped only packets over 1 KB."""

    scenario, category = "large_packet_loss", "optics"
    summary = "silent loss of packets >1 KB on one link: retransmits, slow collectives over it"
    kinds = ("slow_network", "hang_network")
    job_slow, n_factor = 1.45, 4.0

    def nic_symptoms(self, a: TickArrays) -> None:
        nic = a.nic[self.host, self.gpu]
        nic[NI["nic_retrans_per_s"]] = float(self.rng.uniform(1000, 5000))
        nic[NI["nic_out_of_seq_per_s"]] = float(self.rng.uniform(200, 800))


class OpticsFlap(LinkFault):
    scenario, category = "optics_flap", "optics"
    summary = "marginal optic: link flaps (mlx5 down/up), link_up dips, retransmits, slow N"
    kinds = ("slow_network", "dist_error")

    def setup(self) -> None:
        self.downs: list[tuple[float, float]] = []
        t = self.start_ts
        while t < self.ctx.end_ts:
            up = t + float(self.rng.integers(2, 7))
            self.downs.append((t, up))
            t = up + float(self.rng.integers(20, 46))
        i = self.gpu
        bus, dev, ib = nic_bus_id(i), netdev_name(i), f"mlx5_{i}"
        for down, up in self.downs:
            self.ctx.log(down + 0.05, self.host, "kernel", lt.mlx5_netdev_link(bus, dev, False))
            self.ctx.log(down + 0.056, self.host, "kernel", lt.mlx5_port_state(bus, ib, False))
            self.ctx.log(up + 0.4, self.host, "kernel", lt.mlx5_netdev_link(bus, dev, True))
            self.ctx.log(up + 0.41, self.host, "kernel", lt.mlx5_port_state(bus, ib, True))

    def _state(self, t: float) -> tuple[bool, float]:
        """(link down now, seconds since the last up)."""
        since = float("inf")
        for down, up in self.downs:
            if down <= t < up:
                return True, 0.0
            if t >= up:
                since = t - up
        return False, since

    def before(self, t: float) -> None:
        if t < self.start_ts:
            return
        down, since = self._state(t)
        js = self.ctx.work.jobs[self.job]
        if down:
            js.paused = True  # the rail ring cannot move while one of its links is down
        else:  # a marginal optic: bit errors and retransmissions between flaps too
            js.slow *= 1.3 if since < 5 else 1.1

    def after(self, a: TickArrays) -> None:
        if a.t < self.start_ts or self.ctx.work.jobs[self.job].status == HUNG:
            return
        down, since = self._state(a.t)
        nic = a.nic[self.host, self.gpu]
        put(nic, NI, "nic_link_downed_total", sum(d <= a.t for d, _ in self.downs), add=True)
        if down:
            nic[NI["nic_link_up"]] = 0.0
            nic[NI["nic_tx_bps"]] = nic[NI["nic_rx_bps"]] = 0.0
            return
        decay = float(np.exp(-since / 2.0)) if since < 12 else 0.0
        nic[NI["nic_retrans_per_s"]] = (float(self.rng.uniform(500, 3000)) * decay
                                        + float(self.rng.uniform(80, 300)))
        put(nic, NI, "nic_port_err_per_s",
            float(self.rng.uniform(5, 50)) * decay + float(self.rng.uniform(2, 10)))
        self.slow_ranks(a, 2.0 + 2.0 * decay)


class ConnReset2Host(Fault):
    """Aegis §3 DistError with exactly 2 hosts: isolate both."""

    scenario, category = "conn_reset_2host", "host"
    summary = "two hosts' connection reset by peer, each naming the other's IP"
    kinds = ("dist_error",)

    def setup(self) -> None:
        hosts = self.ctx.topo.jobs[self.job].hosts
        if len(hosts) < 2:
            raise ValueError("conn_reset_2host needs a job of at least 2 hosts")
        pos = hosts.index(self.host)
        self.peer = int(hosts[(pos + 1) % len(hosts)])
        self.extra_hosts = [self.peer]
        self.dead_ts = self.start_ts + self.ctx.watchdog_s + 3.0
        self.end_ts = min(self.dead_ts, self.ctx.end_ts)
        topo = self.ctx.topo
        for a, b in ((self.host, self.peer), (self.peer, self.host)):
            for g in sorted(self.rng.choice(GPUS_PER_HOST, size=3, replace=False).tolist()):
                ts = self.start_ts + float(self.rng.uniform(0.0, 0.8))
                pre = lt.nccl_prefix(topo.hosts[a].name, a, g, thread=57)
                self.ctx.log(ts, a, "nccl", lt.nccl_conn_reset(
                    pre, topo.hosts[b].mgmt_ip, int(self.rng.integers(32768, 61000))))

    def before(self, t: float) -> None:
        hang_then_kill(self, t)

    def after(self, a: TickArrays) -> None:
        if not self.hung(a, skip={(h, g) for h in (self.host, self.peer)
                                   for g in range(GPUS_PER_HOST)}):
            return
        if a.t >= self.start_ts + 2:  # both hosts' processes aborted on the NCCL error
            a.ccl_hosts[[self.host, self.peer]] = False

    def culprit(self) -> dict[str, list[str]]:
        names = [self.ctx.topo.hosts[h].name for h in (self.host, self.peer)]
        return {"hosts": sorted(names), "gpus": [], "nics": [], "links": []}

    def actions(self) -> list[list[str]]:
        hosts = self.culprit()["hosts"]
        return [["isolate_host", h] for h in hosts] + [["restart_job", self.job_name]]


class GpuConnFail(Fault):
    """Aegis §3 DistError over more than 2 hosts, resolved by RootDiag: the connections of
    one GPU (its rail NIC) fail first, so every peer's failed connection points at it."""

    scenario, category = "gpu_conn_fail", "NIC"
    summary = "one GPU's connections fail first: every peer's IB completion error names it"
    kinds = ("dist_error",)
    in_mixed = False  # a RootDiag case for tests; mixed keeps its Aegis §2 draws

    def setup(self) -> None:
        topo, job = self.ctx.topo, self.ctx.topo.jobs[self.job]
        if len(job.hosts) < 3:
            raise ValueError("gpu_conn_fail needs a job of at least 3 hosts")
        rail, me = self.gpu, topo.hosts[self.host]
        self.crash_ts = self.start_ts + 2.5  # the culprit's rank aborts on its failed QPs
        self.dead_ts = self.start_ts + self.ctx.watchdog_s + 3.0
        self.end_ts = min(self.dead_ts, self.ctx.end_ts)
        for h in job.hosts:  # each peer's rank on the rail: its connection to the culprit fails
            if h == self.host:
                continue
            peer = topo.hosts[h]
            ts = self.start_ts + float(self.rng.uniform(0.0, 1.5))
            pre = lt.nccl_prefix(peer.name, h, rail, thread=311)
            self.ctx.log(ts, h, "nccl", lt.nccl_ib_completion_error(
                pre, me.rail_ips[rail], int(self.rng.integers(32768, 61000)), peer.rail_ips[rail]))
        others = [h for h in job.hosts if h != self.host]
        for h in self.rng.choice(others, size=2, replace=False).tolist():  # and it sees a few
            pre = lt.nccl_prefix(me.name, self.host, rail, thread=311)
            self.ctx.log(self.start_ts + float(self.rng.uniform(1.6, 2.0)), self.host, "nccl",
                         lt.nccl_ib_completion_error(pre, topo.hosts[h].rail_ips[rail],
                                                     int(self.rng.integers(32768, 61000)),
                                                     me.rail_ips[rail]))

    def before(self, t: float) -> None:
        hang_then_kill(self, t)

    def after(self, a: TickArrays) -> None:
        if self.hung(a, skip={(self.host, self.gpu)}):
            self.wait_for(a, self.host, self.gpu)  # peers wait in the next op
            if a.t >= self.crash_ts:  # its rank aborted on the failed connections
                self.stop_reporting(a, self.host, self.gpu)

    def actions(self) -> list[list[str]]:
        return [["isolate_gpu", self.culprit()["gpus"][0]], ["restart_job", self.job_name]]


class ConfigError(Fault):
    """Aegis §3 ConfigCheck: the same wrong setting fails every host at start; no isolation."""

    scenario, category = "config_error", "config"
    summary = "NCCL_SOCKET_IFNAME names a missing interface: same init error on every host"
    kinds = ("config",)
    bad_ifname = "eth9"

    def setup(self) -> None:
        js = self.ctx.work.jobs[self.job]
        js.init_fails = True
        self.start_ts = js.start_ts + 2.0
        self.end_ts = js.start_ts + self.ctx.work.init_s
        topo, job = self.ctx.topo, self.ctx.topo.jobs[self.job]
        for pos, h in enumerate(job.hosts):
            name = topo.hosts[h].name
            for g in range(GPUS_PER_HOST):
                ts = self.start_ts + float(self.rng.uniform(0.0, 1.5))
                pre = lt.nccl_prefix(name, h, g)
                self.ctx.log(ts, h, "nccl", lt.nccl_ifname_set(pre, self.bad_ifname))
                self.ctx.log(ts + 0.002, h, "nccl", lt.nccl_no_socket_interface(pre))
                for i, line in enumerate(lt.torch_nccl_init_error(
                        job.global_rank(pos, g), "Bootstrap : no socket interface found")):
                    self.ctx.log(ts + 0.01 + i * 1e-4, h, "training", line)

    def culprit(self) -> dict[str, list[str]]:
        hosts = [self.ctx.topo.hosts[h].name for h in self.ctx.topo.jobs[self.job].hosts]
        return {"hosts": hosts, "gpus": [], "nics": [], "links": []}
