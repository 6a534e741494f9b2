"""The ToR switch roll-up (Aegis §2 rail-optimised wiring: NIC i of every host of a pod meets
the ToR of rail i): many troubled links behind one switch name the switch, once, in TD/N,
CL/WR/WC alignment and the Z-score correlator; a few bad links stay links."""

from __future__ import annotations

import pytest

from processors.core.alignment import AlignmentDetector
from processors.core.ccl_state import (
    CommRoster,
    Localisation,
    shared_switch,
    switch_of_most,
    tor_lookup,
)
from processors.core.correlate import Correlator, MetricFlag
from processors.core.log_classifier import classify
from processors.core.tdn_config import TDNConfig
from processors.core.tree_events import DecisionTreeConfig, TreeEvent
from processors.core.tree_peers import switch_of_nics
from processors.engine import Engine
from processors.settings import PipelineConfig
from producers.sim.simulation import SimConfig, Simulation
from schemas.inventory import HostInventory, Inventory
from schemas.records import RankSnapshot
from schemas.topics import CCL, LOGS, TELEMETRY
from tests.unit.test_alignment import JOB, SynthJob, run

COMM = "c0ffee0000000001"


def roster_of(hosts: int, per_tor: int) -> tuple[CommRoster, Inventory]:
    """A rail-3 ring of ``hosts`` ranks (rank = host) with ``per_tor`` hosts per ToR."""
    inv, roster = Inventory(), CommRoster(16, 8)
    for h in range(hosts):
        name = f"h{h:03d}"
        inv.add_host(HostInventory(name, tor=tuple(f"tor-p{h // per_tor}-r{g}" for g in range(8))))
        roster.learn(name, 100.0, RankSnapshot(COMM, hosts, h, 3, (), (), 100.0))
    return roster, inv


def scattered(*ranks: int) -> Localisation:
    return Localisation("scattered", tuple(ranks), ())


def test_many_scattered_ranks_behind_one_tor_name_the_switch() -> None:
    roster, inv = roster_of(64, 16)
    ranks = (15, *range(16, 28))  # 12 hosts behind tor-p1-r3 and the ring predecessor
    sw = shared_switch(scattered(*ranks), roster, COMM, tor_lookup(inv), 8, 3, 0.25)
    assert sw is not None and sw.tor == "tor-p1-r3"
    assert (sw.troubled_hosts, sw.behind) == (12, 16)
    assert len(sw.links) == 8 and all(link.endswith("<->tor-p1-r3") for link in sw.links)
    assert sw.hosts == [f"h{h:03d}" for h in range(16, 28)] and "h015" not in sw.hosts


@pytest.mark.parametrize(("ranks", "why"), [
    ((16, 17), "two hosts are two links"),
    ((16, 20, 24), "3 of 32 behind the ToR: independent links"),
    ((1, 2, 3, 16, 17, 18, 40), "no ToR holds more than half of the troubled hosts"),
])
def test_a_few_bad_links_stay_links(ranks: tuple[int, ...], why: str) -> None:
    roster, inv = roster_of(64, 32)
    assert shared_switch(scattered(*ranks), roster, COMM, tor_lookup(inv), 8, 3, 0.25) is None, why


def test_no_roll_up_without_inventory_when_disabled_or_for_one_endpoint() -> None:
    roster, inv = roster_of(64, 16)
    ranks = tuple(range(16, 28))
    assert shared_switch(scattered(*ranks), roster, COMM, tor_lookup(None), 8, 3, 0.25) is None
    assert shared_switch(scattered(*ranks), roster, COMM, tor_lookup(inv), 8, 0, 0.25) is None
    one = Localisation("endpoint", (16,), ((15, 16), (16, 17)))
    assert shared_switch(one, roster, COMM, tor_lookup(inv), 8, 3, 0.25) is None
    assert switch_of_most(scattered(16, 17, 40), roster, COMM, tor_lookup(inv)) == "tor-p1-r3"
    assert switch_of_most(scattered(16, 40), roster, COMM, tor_lookup(inv)) is None


def tdn_run(policy: PipelineConfig | None = None, seed: int = 3) -> tuple[Simulation, Engine]:
    sim = Simulation(SimConfig(hosts=16, hosts_per_job=16, hosts_per_pod=4, scenario="tor_degraded",
                               seed=seed, duration_s=200, fault_at_s=60))
    eng = Engine(policy, inventory=sim.inventory)
    for topic, _k, _ts, value in sim.iter_encoded():
        if topic == CCL.name:
            eng.feed(topic, value)
    eng.sink.flush()
    return sim, eng


def test_tdn_names_a_degraded_tor_once_with_one_netdiag() -> None:
    """Seed 3: the AllGather's smaller group (2 hosts behind the ToR and the ring
    predecessor) joins the AllReduce's switch incident instead of naming its 3 links."""
    sim, eng = tdn_run()
    (fault,) = sim.truth
    (tor,) = {t for _a, t in fault["expected_actions"]}
    assert [(d.kind, d.evidence["localised"]) for d in eng.sink.diagnoses] == [
        ("slow_network", "switch")]
    d = eng.sink.diagnoses[0]
    assert d.evidence["actions"] == [["run_netdiag", tor]] and d.evidence["switch"] == tor
    assert set(d.culprits.links) <= set(fault["culprit"]["links"])
    assert [(c.action, c.target) for c in eng.sink.commands] == [("run_netdiag", tor)]


def test_tdn_roll_up_can_be_turned_off() -> None:
    policy = PipelineConfig(sections={"tdn": TDNConfig(switch_min_hosts=0)})
    _, eng = tdn_run(policy)
    targets = {c.target for c in eng.sink.commands}
    assert len(targets) >= 3 and all("<->" in t for t in targets)


def test_alignment_names_a_dead_tor_not_each_link() -> None:
    """Every link behind one ToR stops completing: WR > WC on the ranks sending over them."""
    job = SynthJob(hosts=64)
    det = AlignmentDetector(JOB, inventory=job.inventory())
    assert not run(det, job, 20).diagnoses
    job.t += 1.0
    job.dp_pending = {}
    job.dp_wc[:] = job.dp_wr
    job.tp_cl += 1
    job.dp_cl += 1
    job.dp_wr += 2
    job.dp_wc += 2
    rail, dead = 3, range(36, 44)  # 8 of the 32 hosts behind tor-r3-1
    for h in dead:
        job.dp_wc[h, rail] -= 1
        job.dp_pending[(h, rail)] = (h + 1,)
        if h - 1 not in dead:
            job.dp_wc[h - 1, rail] -= 1
            job.dp_pending[(h - 1, rail)] = (h,)
    for g in range(job.G):
        if g != rail:
            job.tp_cl[:, g] += 1
    job.frozen = True
    out = run(det, job, 60)
    (d,) = [d for d in out.diagnoses if d.kind == "hang_network"]
    assert d.evidence["actions"] == [["run_netdiag", "tor-r3-1"]]
    assert d.evidence["localised"] == "switch" and d.evidence["switch_behind"] == 32
    assert all(link.endswith("<->tor-r3-1") for link in d.culprits.links)


def nic_flag(host: str, at: float = 1000.0) -> MetricFlag:
    return MetricFlag(device=f"{host}/nic3", device_kind="nic", host=host, local="mlx5_3",
                      metric="nic_ecn_per_s", direction="high", value=9e3, mean=1e3, std=2e3,
                      bound=5e3, window_s=600.0, sub_window_s=30.0, streak_start=400.0,
                      flagged_at=at)


def correlator(hosts: list[str], per_tor: int) -> Correlator:
    inv = Inventory()
    for i, h in enumerate(hosts):
        inv.add_host(HostInventory(h, nics=tuple(f"mlx5_{g}" for g in range(8)),
                                   tor=tuple(f"tor-p{i // per_tor}-r{g}" for g in range(8))))
    return Correlator("j", 60.0, inv, job_hosts=lambda: hosts, switch_min_hosts=3,
                      switch_min_share=0.25)


def test_zscore_nics_slow_together_behind_one_tor_name_the_switch_once() -> None:
    hosts = [f"h{i:03d}" for i in range(64)]
    c = correlator(hosts, 16)
    for h in hosts[16:22]:
        c.add(nic_flag(h))
    (d,) = c.due(1100.0)
    assert d.kind == "slow_network" and d.evidence["actions"] == [["run_netdiag", "tor-p1-r3"]]
    assert d.evidence["device_kind"] == "switch" and len(d.culprits.links) == 6
    assert d.culprits.hosts == tuple(hosts[16:22])
    c.add(nic_flag(hosts[23], at=1200.0))  # a later NIC behind the same switch joins it
    assert c.due(1300.0) == []
    restored = Correlator.restore(c.snapshot(), "j", 60.0, c.inventory, job_hosts=lambda: hosts,
                                  switch_min_hosts=3, switch_min_share=0.25)
    restored.add(nic_flag(hosts[24], at=1400.0))
    assert restored.due(1500.0) == []


def test_zscore_two_nics_behind_one_tor_stay_two_links() -> None:
    hosts = [f"h{i:03d}" for i in range(64)]
    c = correlator(hosts, 16)
    for h in hosts[16:18]:
        c.add(nic_flag(h))
    got = c.due(1100.0)
    assert [d.evidence["actions"] for d in got] == [
        [["run_netdiag", f"{h}/nic3<->tor-p1-r3"]] for h in hosts[16:18]]


def test_a_netdev_line_names_the_listed_nic_by_its_pci_bus() -> None:
    """``mlx5_core 0000:dc:00.0 enp220s0np0: Link down`` is NIC 7 when the inventory lists
    that bus: the same name (``h/nic7``) as its ``mlx5_7: Port: 1 Link DOWN`` line."""
    hi = HostInventory("h1", nics=tuple(f"mlx5_{i}" for i in range(8)),
                       nic_bus_ids=tuple(f"0000:{b:02x}:00.0" for b in range(0xD5, 0xDD)))
    assert hi.nic_for_bus("0000:DC:00.0") == 7 and hi.nic_for_bus("0000:01:00.0") is None
    line = "mlx5_core 0000:dc:00.0 enp220s0np0: Link down"
    assert classify(line, "kernel", host_inventory=hi).device == "mlx5_7"
    assert classify(line, "kernel").device == "enp220s0np0"  # no inventory: as logged
    inv = Inventory()
    inv.add_host(hi)
    back = Inventory.from_wire(inv.to_wire()).hosts["h1"]
    assert back.nic_bus_ids == hi.nic_bus_ids


def tor_down_run(topics: tuple[str, ...]) -> tuple[Simulation, Engine]:
    sim = Simulation(SimConfig(hosts=16, hosts_per_job=16, hosts_per_pod=4, scenario="tor_down",
                               seed=3, duration_s=300, fault_at_s=60))
    eng = Engine(None, inventory=sim.inventory)
    for topic, _k, _ts, value in sim.iter_encoded():
        if topic in topics:
            eng.feed(topic, value)
    eng.sink.flush()
    return sim, eng


def test_a_dead_tor_is_named_by_the_tree_from_the_logs_alone() -> None:
    """Its 4 hosts log their rail NIC down, their ring peers' IB errors follow: NetDiag on
    the switch before RootDiag could pick one of the hosts."""
    sim, eng = tor_down_run((LOGS.name,))
    (tor,) = {t for _a, t in sim.truth[0]["expected_actions"]}
    first = eng.sink.diagnoses[0]
    assert first.evidence["path"][-1] == "NetDiag:switch"
    assert first.evidence["actions"] == [["run_netdiag", tor]]
    assert not [c for c in eng.sink.commands if c.action.startswith("isolate")]
    assert [(c.action, c.target) for c in eng.sink.commands] == [("run_netdiag", tor)]


def test_a_dead_tor_is_named_by_the_alignment_and_once_in_all() -> None:
    sim, ccl = tor_down_run((CCL.name,))
    (tor,) = {t for _a, t in sim.truth[0]["expected_actions"]}
    assert [(d.kind, d.evidence["actions"]) for d in ccl.sink.diagnoses] == [
        ("hang_network", [["run_netdiag", tor]])]
    _, both = tor_down_run((LOGS.name, CCL.name, TELEMETRY.name))
    assert [(c.action, c.target) for c in both.sink.commands] == [("run_netdiag", tor)]


def test_the_tree_names_a_switch_only_for_three_hosts_or_more() -> None:
    """Two hosts with NIC faults behind one ToR are two links (switch_min_hosts 3)."""
    inv = Inventory()
    for h in ("a", "b", "c", "d"):
        inv.add_host(HostInventory(h, nics=("mlx5_0",), tor=("tor-1",)))

    def down(host: str) -> TreeEvent:
        return TreeEvent(1.0, host, "nic_or_link", "degraded", "nic_link_down", None, None,
                         None, None, None, "mlx5_0", "none", "")

    cfg, job = DecisionTreeConfig(), {"a", "b", "c", "d"}
    assert switch_of_nics([down("a"), down("b")], inv, job, cfg) is None
    assert switch_of_nics([down(h) for h in "abc"], inv, job, cfg) == (
        "tor-1", ["a/nic0<->tor-1", "b/nic0<->tor-1", "c/nic0<->tor-1"])
    assert switch_of_nics([down(h) for h in "abc"], None, job, cfg) is None
    off = DecisionTreeConfig(switch_min_hosts=0)
    assert switch_of_nics([down(h) for h in "abc"], inv, job, off) is None
