"""Topology: rail-optimised hosts, jobs, communicators and the inventory they produce."""

from __future__ import annotations

import pytest

from producers.sim.topology import GPUS_PER_HOST, build_topology, gpu_bus_id
from schemas.inventory import Inventory, normalise_bus_id


def test_hosts_have_8_gpus_and_8_nics_on_rail_tors() -> None:
    topo = build_topology(70, hosts_per_job=16, hosts_per_pod=32)
    inv = topo.to_inventory()
    assert list(inv.hosts)[:2] == ["h0000", "h0001"] and len(inv.hosts) == 70
    h = inv.hosts["h0033"]
    assert h.nics == tuple(f"mlx5_{i}" for i in range(8))
    assert h.tor == tuple(f"tor-p1-r{i}" for i in range(8))  # NIC i -> ToR of rail i, pod 1
    assert len(h.gpu_bus_ids) == 8 and len(set(h.gpu_bus_ids)) == 8
    assert all(normalise_bus_id(b) == b for b in h.gpu_bus_ids)
    assert len(h.ips) == 9 and all(ip.startswith("10.") for ip in h.ips)
    assert len({ip for x in inv.hosts.values() for ip in x.ips}) == 70 * 9
    assert inv.host_for_ip(h.ips[3]) == "h0033"
    assert h.gpu_for_bus(gpu_bus_id(5).upper()) == 5


def test_jobs_ranks_and_leftover_host() -> None:
    topo = build_topology(10, hosts_per_job=3)
    inv = topo.to_inventory()
    assert inv.jobs == {"job-000": ("h0000", "h0001", "h0002"),
                        "job-001": ("h0003", "h0004", "h0005"),
                        "job-002": ("h0006", "h0007", "h0008")}
    assert topo.host_job[9] == -1 and topo.host_entries[9] == ()  # a lone leftover stays idle
    assert inv.ranks["job-001"][0] == ("h0003", 0) and inv.ranks["job-001"][23] == ("h0005", 7)
    wire = Inventory.from_wire(inv.to_wire())
    assert wire.ranks == inv.ranks and wire.jobs == inv.jobs


@pytest.mark.parametrize("pp", [1, 2])
def test_communicators(pp: int) -> None:
    topo = build_topology(8, hosts_per_job=8, pp=pp)
    kinds = [topo.comms[c].kind for c in topo.jobs[0].comms]
    assert kinds.count("tp") == 8
    assert kinds.count("dp") == 8 * pp
    assert kinds.count("pp") == (8 * (8 // pp) if pp > 1 else 0)
    for c in topo.comms:
        if c.kind == "tp":
            assert len({h for h, _ in c.members}) == 1 and [g for _, g in c.members] == list(range(8))
        elif c.kind == "dp":  # GPU i of every host of one stage, over rail i
            assert {g for _, g in c.members} == {c.rail} and c.size == 8 // pp
        else:
            assert {g for _, g in c.members} == {c.rail} and c.size == pp
    ents = topo.host_entries[3]
    assert len(ents) == GPUS_PER_HOST * (3 if pp > 1 else 2)
    for e in ents:  # every entry's rank maps back to this host and GPU
        assert topo.comms[e.comm].members[e.rank] == (3, e.gpu)
        assert topo.entry_index(3, e.comm, e.gpu) == ents.index(e)


def test_invalid_sizes() -> None:
    with pytest.raises(ValueError):
        build_topology(0)
    with pytest.raises(ValueError):
        build_topology(4, hosts_per_job=0)
