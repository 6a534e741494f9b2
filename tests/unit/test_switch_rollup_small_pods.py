"""Small pods: a job spread over pods holds only 2 hosts behind each rail ToR. When every one
of them (2+) is troubled on that rail, the switch is named, in the tree, the Z-score
correlator and the CCL detectors; one bad link inside such a pod stays a link."""

from __future__ import annotations

import pytest

from processors.core.ccl_state import (
    Located,
    beside_switch,
    locate_group,
    shared_switch,
    tor_lookup,
)
from processors.core.tdn_state import NetFinding, OpState, merged_by_comm
from processors.core.tree_events import DecisionTreeConfig, TreeEvent
from processors.core.tree_peers import switch_of_nics
from processors.engine import Engine
from processors.scoring import score
from processors.settings import PipelineConfig
from producers.sim.simulation import SimConfig, Simulation
from schemas.inventory import HostInventory, Inventory
from tests.unit.test_switch_rollup import COMM, correlator, nic_flag, roster_of, scattered


def run_engine(cfg: SimConfig, config: PipelineConfig | None = None) -> tuple[Simulation, Engine]:
    """Simulate ``cfg`` and feed every record to an in-process engine, finished."""
    sim = Simulation(cfg)
    eng = Engine(config, inventory=sim.inventory)
    for topic, _k, _ts, value in sim.iter_encoded():
        eng.feed(topic, value)
    eng.finish()
    return sim, eng


def down(host: str) -> TreeEvent:
    return TreeEvent(1.0, host, "nic_or_link", "degraded", "nic_link_down", None, None,
                     None, None, None, "mlx5_0", "none", "")


def test_the_tree_names_a_switch_when_every_job_host_behind_it_lost_its_nic() -> None:
    inv = Inventory()
    for h, tor in (("a", "tor-1"), ("b", "tor-1"), ("c", "tor-2"), ("d", "tor-2")):
        inv.add_host(HostInventory(h, nics=("mlx5_0",), tor=(tor,)))
    cfg, job = DecisionTreeConfig(), {"a", "b", "c", "d"}
    assert switch_of_nics([down("a"), down("b")], inv, job, cfg) == (
        "tor-1", ["a/nic0<->tor-1", "b/nic0<->tor-1"])
    assert switch_of_nics([down("a")], inv, job, cfg) is None  # one host: its link
    assert switch_of_nics([down(h) for h in "abcd"], inv, job, cfg) is None  # no majority


def test_zscore_names_a_small_pods_switch_and_keeps_a_big_pods_links() -> None:
    hosts = [f"h{i:03d}" for i in range(20)]
    small = correlator(hosts, 2)
    for h in hosts[6:8]:  # both hosts behind tor-p3-r3
        small.add(nic_flag(h))
    (d,) = small.due(1100.0)
    assert d.evidence["actions"] == [["run_netdiag", "tor-p3-r3"]]
    big = correlator(hosts, 4)
    for h in hosts[4:6]:  # 2 of the 4 behind tor-p1-r3
        big.add(nic_flag(h))
    assert len(big.due(1100.0)) == 2


@pytest.mark.parametrize(("ranks", "tor"), [
    ((3, 4, 5), "tor-p2-r3"),  # the pod and its ring predecessor (a degraded ToR)
    ((3, 4, 5, 6), "tor-p2-r3"),  # and its successor (a dead one: both ways)
    ((4, 5), None),  # the pod alone: one bad link between its two hosts looks the same
    ((2, 3, 4, 5, 6), None),  # more than the ring neighbours: not this switch alone
])
def test_ccl_roll_up_for_a_small_pod(ranks: tuple[int, ...], tor: str | None) -> None:
    roster, inv = roster_of(16, 2)
    sw = shared_switch(scattered(*ranks), roster, COMM, tor_lookup(inv), 8, 3, 0.25)
    assert (sw.tor if sw else None) == tor


@pytest.mark.parametrize("scenario", ["tor_down", "tor_degraded"])
def test_small_pod_tor_faults_name_the_switch_and_isolate_nobody(scenario: str) -> None:
    """20 hosts, jobs of 10, 2 hosts per pod: RootDiag isolated a GPU of a dead ToR's host,
    and the Z-score, TD/N and alignment sent its links to NetDiag one by one."""
    sim, eng = run_engine(SimConfig(hosts=20, hosts_per_job=10, hosts_per_pod=2, scenario=scenario,
                               seed=5, duration_s=420))
    (tor,) = {t for _a, t in sim.truth[0]["expected_actions"]}
    targets = [c.target for c in eng.sink.commands]
    assert {c.action for c in eng.sink.commands} == {"run_netdiag"} and tor in targets
    # TD/N may see the pod's two hosts alone in one op (a link between them looks the same)
    # before it sees the ToR in another: at most that one link goes to NetDiag first
    assert all(t == tor or t.endswith("<->" + tor) for t in targets) and len(targets) <= 2
    result = score(sim.truth, eng.sink.diagnoses, eng.sink.commands)
    assert result.recall == 1.0 and result.false_isolations == 0


@pytest.mark.parametrize(("group", "beside"), [
    ([3, 5], True),  # a host behind tor-p2-r3 and its ring successor
    ([3], True),  # its ring predecessor alone, sending into it
    ([4], True),
    ([5, 7], False),  # a rank beyond the neighbours: a fault of its own
    ([0, 1], False),
])
def test_a_later_group_beside_a_named_switch_is_that_switchs(group: list[int],
                                                              beside: bool) -> None:
    roster, inv = roster_of(16, 2)  # tor-p2-r3 serves ranks 4 and 5
    got = beside_switch(group, roster, COMM, tor_lookup(inv), "tor-p2-r3")
    assert got is beside


@pytest.mark.parametrize("seed", [31, 5])
def test_a_small_pods_degraded_tor_sends_no_neighbours_link_to_netdiag(seed: int) -> None:
    """8 hosts, 2 per pod: after TD/N named the ToR, another op's group of one host behind
    it and its ring neighbour (seed 31), or of the neighbour alone (seed 5), sent the
    neighbour's link to NetDiag (precision 0.75 and 0.667)."""
    sim, eng = run_engine(SimConfig(hosts=8, hosts_per_job=8, hosts_per_pod=2, seed=seed,
                               scenario="tor_degraded", duration_s=420))
    (tor,) = {t for _a, t in sim.truth[0]["expected_actions"]}
    targets = [c.target for c in eng.sink.commands]
    assert tor in targets and all(t == tor or t.endswith("<->" + tor) for t in targets)
    result = score(sim.truth, eng.sink.diagnoses, eng.sink.commands)
    assert result.recall == 1.0 and result.false_isolations == 0


@pytest.mark.parametrize("hosts", [12, 24])
def test_ops_evaluated_in_one_call_let_the_switch_take_in_the_links_beside_it(hosts: int) -> None:
    """3 hosts per pod, no heartbeats (seed 23). 12 hosts: one record closed the AllReduce
    (ranks 0, 2 and 11: no switch) before the AllGather (0, 1, 2, 11: the ToR), and the
    AllReduce's 3 links went to NetDiag beside the ToR. 24 hosts, jobs of 12: the AllReduce
    saw 8, 9, 11 and the AllGather 8, 10, 11, each 2 of the pod's 3 hosts, and 4 links went
    to NetDiag before a later op named the ToR. Link findings now wait for the call's end,
    where one communicator's ops are also read together."""
    sim, eng = run_engine(SimConfig(hosts=hosts, hosts_per_job=12, hosts_per_pod=3, seed=23,
                               heartbeat_s=0.0, scenario="tor_degraded", duration_s=420))
    (tor,) = {t for _a, t in sim.truth[0]["expected_actions"]}
    assert [c.target for c in eng.sink.commands] == [tor]


@pytest.mark.parametrize(("groups", "tor"), [
    (([4, 5], [6, 7]), "tor-p1-r3"),  # two ops, two halves of one pod: its ToR
    (([5], [6]), None),  # two hosts of a pod of 4: links, as one op would see them
    (([4, 5], [4, 5]), None),  # the same op kind twice is no second view
])
def test_one_communicators_ops_are_read_together(groups: tuple[list[int], ...],
                                                 tor: str | None) -> None:
    roster, inv = roster_of(16, 4)
    tor_of = tor_lookup(inv)

    def locate(comm: str, group: list[int], size: int) -> Located:
        return locate_group(roster, tor_of, comm, group, size, 8, 3, 0.25)

    ops = ["AllReduce", "AllGather"] if groups[0] != groups[1] else ["AllReduce", "AllReduce"]
    found = []
    for op, g in zip(ops, groups, strict=True):
        loc, links, hosts, _nics, sw = locate(COMM, g, 16)
        assert sw is None
        found.append(NetFinding(COMM, op, OpState(16), g, loc, links, hosts, None,
                                {"degraded_ranks": g}, 1.0))
    (merged,) = merged_by_comm(found, locate)
    assert {f.switch.tor if f.switch else None for f in merged} == {tor}
    if tor is not None:
        assert merged[0].evidence["degraded_ranks"] == sorted({*groups[0], *groups[1]})
        assert merged[0].evidence["actions"] == [["run_netdiag", tor]]
