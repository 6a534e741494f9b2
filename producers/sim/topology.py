"""Simulated cluster: hosts, rail-optimised fabric, jobs and their communicators.

Aegis §2 (the setting): a host has 8 GPUs and 8 NICs; GPU i and NIC i share a PCIe switch;
NVLink joins the GPUs; rail-optimised wiring sends NIC i of every host to the ToR of rail i.
Addresses are data strings only (10.x); nothing is ever sent anywhere.

Communicators per job (Megatron-style 3D layout, TP inside a host):
- ``tp``: the 8 GPUs of one host over NVLink (no network work requests);
- ``dp``: GPU i of every host of one pipeline stage, over rail i (a ring in rank order);
- ``pp``: GPU i of the hosts at the same position in each stage (only when pp > 1).
Every host of a job lists the same entries in the same order (tp 0..7, dp 0..7, pp 0..7).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from schemas.inventory import HostInventory, Inventory

GPUS_PER_HOST = 8
# PCI bus numbers of the 8 GPUs (an HGX H100-like layout); NIC i sits on the next bus.
GPU_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
NIC_BUSES = tuple(b + 1 for b in GPU_BUSES)
SWITCH_BUSES = tuple(b - 2 for b in GPU_BUSES)  # upstream PCIe switch port of pair i
OPS_BY_KIND = {"tp": ("AllGather", "ReduceScatter"), "dp": ("AllReduce", "AllGather"),
               "pp": ("Send", "Recv")}


IP_SITES = 2048  # address sites: 8 second-octet families x 256 third-octet blocks


def host_name(i: int, prefix: str = "") -> str:
    return f"{prefix}h{i:04d}"


def job_name(j: int, prefix: str = "") -> str:
    return f"{prefix}job-{j:03d}"


def ip_site_for(prefix: str) -> int:
    """Default address site of a name prefix: 0 for none (the documented plan), else derived
    from the prefix, so simulations sharing a worker's inventory get distinct addresses."""
    if not prefix:
        return 0
    return 1 + int.from_bytes(hashlib.sha256(prefix.encode()).digest()[:8], "big") % (IP_SITES - 1)


def gpu_bus_id(gpu: int) -> str:
    """Normalised PCI bus id of GPU ``gpu`` (same on every host, as on identical servers)."""
    return f"0000:{GPU_BUSES[gpu]:02x}:00.0"


def nic_bus_id(nic: int) -> str:
    return f"0000:{NIC_BUSES[nic]:02x}:00.0"


def switch_port_id(pair: int) -> str:
    return f"0000:{SWITCH_BUSES[pair]:02x}:01.0"


def netdev_name(nic: int) -> str:
    """RoCE netdev of NIC i, named from its PCI bus the way udev does (``enp26s0np0``)."""
    return f"enp{NIC_BUSES[nic]}s0np0"


@dataclass(frozen=True, slots=True)
class Host:
    index: int
    name: str
    pod: int
    mgmt_ip: str  # bootstrap / socket interface (eth0)
    rail_ips: tuple[str, ...]  # RoCE address of NIC i
    tors: tuple[str, ...]  # ToR of NIC i

    @property
    def nics(self) -> tuple[str, ...]:
        return tuple(f"mlx5_{i}" for i in range(GPUS_PER_HOST))


@dataclass(frozen=True, slots=True)
class Comm:
    """One communicator: ``members[r]`` = (host index, local GPU) of comm rank r."""

    id: str  # 16 hex digits
    job: int
    kind: str  # tp | dp | pp
    rail: int  # GPU/NIC index for dp/pp; -1 for tp
    members: tuple[tuple[int, int], ...]
    ops: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def uses_network(self) -> bool:
        return self.kind != "tp" and self.size > 1

    def ring_neighbours(self, rank: int) -> tuple[int, int]:
        """(previous, next) rank in the ring; both ``rank`` itself when the comm has 1 rank."""
        n = self.size
        return (rank - 1) % n, (rank + 1) % n


@dataclass(frozen=True, slots=True)
class Entry:
    """One (comm, rank) that lives on a host; ``gpu`` is the local GPU index."""

    comm: int
    rank: int
    gpu: int


@dataclass(slots=True)
class Job:
    index: int
    name: str
    hosts: tuple[int, ...]
    pp: int
    comms: list[int] = field(default_factory=list)

    def global_rank(self, host_pos: int, gpu: int) -> int:
        return host_pos * GPUS_PER_HOST + gpu


@dataclass(slots=True)
class Topology:
    hosts: list[Host]
    jobs: list[Job]
    comms: list[Comm]
    host_job: list[int]  # job index per host, -1 when idle
    host_entries: list[tuple[Entry, ...]]  # per host, () when idle
    n_agg: int
    name_prefix: str = ""

    def salt(self) -> int:
        """62 bits derived from the name prefix (0 without one), to vary random ids."""
        if not self.name_prefix:
            return 0
        return int.from_bytes(hashlib.sha256(self.name_prefix.encode()).digest()[:8], "big") >> 2

    def job_of(self, host: int) -> Job | None:
        j = self.host_job[host]
        return self.jobs[j] if j >= 0 else None

    def entry_index(self, host: int, comm: int, gpu: int) -> int:
        """Index in ``host_entries[host]`` of local GPU ``gpu``'s rank in ``comm``."""
        for e, ent in enumerate(self.host_entries[host]):
            if ent.comm == comm and ent.gpu == gpu:
                return e
        raise KeyError(f"comm {comm} has no rank on host {host} gpu {gpu}")

    def comm_of(self, host: int, kind: str, gpu: int) -> int:
        """The comm of ``kind`` holding local GPU ``gpu`` of ``host``."""
        for ent in self.host_entries[host]:
            c = self.comms[ent.comm]
            if c.kind == kind and ent.gpu == gpu:
                return ent.comm
        raise KeyError(f"no {kind} comm for host {host} gpu {gpu}")

    def rank_in(self, comm: int, host: int, gpu: int) -> int:
        return self.comms[comm].members.index((host, gpu))

    def to_inventory(self) -> Inventory:
        inv = Inventory()
        for h in self.hosts:
            inv.add_host(HostInventory(
                host=h.name, ips=(h.mgmt_ip, *h.rail_ips),
                gpu_bus_ids=tuple(gpu_bus_id(g) for g in range(GPUS_PER_HOST)),
                nics=h.nics, tor=h.tors, rail_ips=h.rail_ips,
                nic_bus_ids=tuple(nic_bus_id(n) for n in range(GPUS_PER_HOST))))
        for job in self.jobs:
            inv.jobs[job.name] = tuple(self.hosts[h].name for h in job.hosts)
            inv.ranks[job.name] = {
                job.global_rank(p, g): (self.hosts[h].name, g)
                for p, h in enumerate(job.hosts) for g in range(GPUS_PER_HOST)}
        return inv


def _ip(net: int, i: int, site: int = 0, n_hosts: int = 1) -> str:
    """Address ``i`` of network ``net`` (1 = management, 16 + r = rail r) at ``site``: the
    family shifts the second octet by 32, the block the third octet (kept in range)."""
    family, block = divmod(site, 256)
    block = min(block, 256 - (n_hosts + 199) // 200)
    return f"10.{net + 32 * family}.{block + i // 200}.{i % 200 + 10}"


def _comm_id(job: str, name: str) -> str:
    return hashlib.sha256(f"{job}/{name}".encode()).hexdigest()[:16]


def build_topology(n_hosts: int, hosts_per_job: int | None = None, pp: int = 1,
                   hosts_per_pod: int = 32, n_agg: int = 8, name_prefix: str = "",
                   ip_site: int | None = None) -> Topology:
    """Lay out ``n_hosts`` into jobs of ``hosts_per_job`` (all hosts when None).

    Hosts left over (fewer than 2·pp) stay idle. ``pp`` must divide a job's host count,
    otherwise that job runs without pipeline parallelism. ``name_prefix`` starts every host,
    job and switch name (so communicator ids differ too); ``ip_site`` (0..IP_SITES-1, default
    from the prefix) picks the address block.
    """
    site = ip_site_for(name_prefix) if ip_site is None else ip_site
    if not 0 <= site < IP_SITES or n_hosts > 256 * 200:
        raise ValueError(f"ip_site={site} (0..{IP_SITES - 1}), hosts={n_hosts} (<= 51200)")
    if n_hosts < 1:
        raise ValueError(f"hosts={n_hosts}: need at least 1")
    per_job = n_hosts if hosts_per_job is None else hosts_per_job
    if per_job < 1:
        raise ValueError(f"hosts_per_job={hosts_per_job}: need at least 1")
    hosts = []
    for i in range(n_hosts):
        pod = i // hosts_per_pod
        hosts.append(Host(i, host_name(i, name_prefix), pod, _ip(1, i, site, n_hosts),
                          tuple(_ip(16 + r, i, site, n_hosts) for r in range(GPUS_PER_HOST)),
                          tuple(f"{name_prefix}tor-p{pod}-r{r}" for r in range(GPUS_PER_HOST))))
    jobs: list[Job] = []
    comms: list[Comm] = []
    host_job = [-1] * n_hosts
    entries: list[tuple[Entry, ...]] = [()] * n_hosts
    start = 0
    while start < n_hosts:
        size = min(per_job, n_hosts - start)
        if jobs and size < min(per_job, 2):
            break  # a lone leftover host stays idle
        j = len(jobs)
        job = Job(j, job_name(j, name_prefix), tuple(range(start, start + size)), pp if size % pp == 0 else 1)
        jobs.append(job)
        _add_comms(job, comms)
        for h, ents in _entries_for(job, comms).items():
            host_job[h] = j
            entries[h] = ents
        start += size
    return Topology(hosts, jobs, comms, host_job, entries, n_agg, name_prefix)


def _add_comms(job: Job, comms: list[Comm]) -> None:
    stage_len = len(job.hosts) // job.pp
    stages = [job.hosts[s * stage_len:(s + 1) * stage_len] for s in range(job.pp)]

    def add(kind: str, rail: int, name: str, members: list[tuple[int, int]]) -> None:
        job.comms.append(len(comms))
        comms.append(Comm(_comm_id(job.name, name), job.index, kind, rail, tuple(members),
                          OPS_BY_KIND[kind]))

    for h in job.hosts:
        add("tp", -1, f"tp/{h}", [(h, g) for g in range(GPUS_PER_HOST)])
    for s, stage in enumerate(stages):
        for g in range(GPUS_PER_HOST):
            add("dp", g, f"dp/{s}/{g}", [(h, g) for h in stage])
    if job.pp > 1:
        for d in range(stage_len):
            for g in range(GPUS_PER_HOST):
                add("pp", g, f"pp/{d}/{g}", [(stage[d], g) for stage in stages])


def _entries_for(job: Job, comms: list[Comm]) -> dict[int, tuple[Entry, ...]]:
    """Per host of ``job``: its entries ordered tp, dp, pp, each by local GPU."""
    kinds = ("tp", "dp", "pp")
    lists: dict[int, list[Entry]] = {h: [] for h in job.hosts}
    for c in job.comms:
        for r, (h, g) in enumerate(comms[c].members):
            lists[h].append(Entry(c, r, g))
    return {h: tuple(sorted(ents, key=lambda e: (kinds.index(comms[e.comm].kind), e.gpu)))
            for h, ents in lists.items()}
