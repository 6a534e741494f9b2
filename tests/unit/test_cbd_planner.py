"""The planner: parallel test groups never share a ToR access link or an aggregation uplink
(Aegis Alg. 1 OfflineDiag: host segments grouped by ToR so parallel tests don't share links).
"""

from __future__ import annotations

import itertools

import pytest

from producers.cbd.planner import Fabric, offline_diag_diagnosis, plan_groups
from producers.sim.topology import GPUS_PER_HOST, Topology, build_topology


def links_used(topo: Topology, hosts: list[str]) -> set[str]:
    """Independent of the planner: the cables a collective among ``hosts`` can touch in the
    simulator's rail-optimised fabric (every ToR uplinked to every aggregation switch)."""
    by_name = {h.name: h for h in topo.hosts}
    out: set[str] = set()
    for a, b in itertools.combinations(sorted(hosts), 2):
        ha, hb = by_name[a], by_name[b]
        for r in range(GPUS_PER_HOST):
            out.add(f"access:{a}:{r}")
            out.add(f"access:{b}:{r}")
            if ha.tors[r] != hb.tors[r]:
                out.update(f"uplink:{t}:{k}" for t in (ha.tors[r], hb.tors[r])
                           for k in range(topo.n_agg))
    return out


@pytest.mark.parametrize("n_hosts, per_pod, max_group", [
    (8, 32, 8), (64, 16, 8), (64, 32, 8), (64, 16, 4), (100, 16, 8), (130, 32, 6), (17, 4, 2)])
def test_parallel_groups_never_share_a_link(n_hosts: int, per_pod: int, max_group: int) -> None:
    topo = build_topology(n_hosts, hosts_per_pod=per_pod, n_agg=4)
    plan = plan_groups([h.name for h in topo.hosts], Fabric.from_topology(topo), max_group)
    names = [h.name for h in topo.hosts]
    segments = [g for g in plan.groups() if g.kind == "tor_segment"]
    assert sorted(h for g in segments for h in g.hosts) == sorted(names)  # each host once
    for g in segments:
        assert len(g.hosts) <= max_group
        assert len({topo.hosts[int(h[1:])].pod for h in g.hosts}) == 1  # one ToR set
    for stage in plan.stages:
        for g1, g2 in itertools.combinations(stage, 2):
            shared = links_used(topo, g1.hosts) & links_used(topo, g2.hosts)
            assert not shared, (g1.id, g2.id, sorted(shared)[:3])
    pods = {h.pod for h in topo.hosts}
    crossed = {topo.hosts[int(h[1:])].pod for g in plan.groups() if g.kind == "cross_tor"
               for h in g.hosts}
    assert crossed == (pods if len(pods) > 1 else set())  # every ToR's uplinks exercised
    assert len(plan.stages[0]) == len(segments)  # all ToR segments run at once


def test_mixed_fabric_from_wire_and_unplaced_hosts() -> None:
    fabric = Fabric.from_wire({
        "hosts": {"a": ["t1", "t2"], "b": ["t1", "t2"], "c": ["t1", "t3"], "d": ["t4", "t3"]},
        "uplinks": {"t1": ["s1"], "t2": ["s1"], "t3": ["s2"], "t4": ["s2"]}})
    plan = plan_groups(["a", "b", "c", "d", "z"], fabric, max_group=2)
    assert plan.stages[-1][0].kind == "unplaced" and plan.stages[-1][0].hosts == ["z"]
    for stage in plan.stages:
        for g1, g2 in itertools.combinations(stage, 2):
            assert not g1.links & g2.links
    wire = plan.to_wire()
    assert "link_rule" in wire and wire["stages"][0][0]["hosts"]


def test_fabric_from_inventory_document() -> None:
    topo = build_topology(4, hosts_per_pod=2, n_agg=2)
    doc = topo.to_inventory().to_wire()
    fabric = Fabric.from_wire({**doc, "n_agg": 2})
    assert fabric.host_tors["h0000"][3] == "tor-p0-r3"
    assert fabric.uplinks["tor-p1-r0"] == ("agg-0", "agg-1")


def test_offline_diag_diagnosis_carries_the_plan() -> None:
    topo = build_topology(48, hosts_per_pod=16)
    d = offline_diag_diagnosis("job-000", [h.name for h in topo.hosts],
                               Fabric.from_topology(topo), 100.0, 130.0, "no pattern")
    assert d.kind == "offline_needed"
    assert d.evidence["actions"] == [["run_offline_diag", "job-000"]]
    stages = d.evidence["plan"]["stages"]
    assert len(stages[0]) == 6  # 3 pods x 2 segments of 8
    again = offline_diag_diagnosis("job-000", [h.name for h in topo.hosts],
                                   Fabric.from_topology(topo), 100.0, 130.0, "no pattern")
    assert again.id == d.id


def test_max_group_must_allow_a_pair() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        plan_groups(["a"], Fabric({}, {}), max_group=1)
