"""Which NIC a GPU uses (HostInventory.nic_for_gpu) and the names every detector derives
from it: 1 NIC per GPU, one bonded NIC for 8 GPUs, 16 GPUs on 8 NICs, an explicit map."""

from __future__ import annotations

import orjson
import pytest

from processors.core.alignment import AlignmentDetector
from processors.core.ccl_state import CommRoster, Localisation, links_for, tor_lookup
from processors.core.tdn import TDNDetector
from processors.core.zscore import ZScoreDetector
from processors.core.zscore_devices import device_name
from schemas.errors import ValidationError
from schemas.inventory import HostInventory, Inventory
from schemas.records import DeviceGroup, RankSnapshot, TelemetryBatch
from tests.unit.test_alignment import JOB, SynthJob
from tests.unit.test_alignment import run as run_alignment
from tests.unit.test_tdn import run as run_tdn
from tests.unit.test_zscore_sim import T0, Cluster, step_fault
from tests.unit.test_zscore_sim import run as run_zscore


def buses(n: int) -> tuple[str, ...]:
    return tuple(f"0000:{0x10 + g:02x}:00.0" for g in range(n))


def host(gpus: int, nics: int, gpu_nics: tuple[int, ...] = (), name: str = "h1",
         rails: bool = False) -> HostInventory:
    return HostInventory(name, gpu_bus_ids=buses(gpus),
                         nics=tuple(f"mlx5_{n}" for n in range(nics)),
                         tor=tuple(f"tor-r{n}" for n in range(nics)),
                         rail_ips=tuple(f"10.9.{n}.1" for n in range(nics)) if rails else (),
                         gpu_nics=gpu_nics)


def inventory(job: SynthJob, nics: int, gpu_nics: tuple[int, ...] = ()) -> Inventory:
    inv = Inventory()
    for name in job.hosts:
        inv.add_host(host(job.G, nics, gpu_nics, name))
    return inv


# ---- the map ---------------------------------------------------------------------------
@pytest.mark.parametrize(("gpus", "nics", "gpu_nics", "want"), [
    (8, 8, (), [0, 1, 2, 3, 4, 5, 6, 7]),  # rail-optimised, today's identity
    (8, 0, (), [0, 1, 2, 3, 4, 5, 6, 7]),  # no NICs listed: identity
    (8, 1, (), [0] * 8),  # one bonded NIC
    (16, 8, (), [g // 2 for g in range(16)]),  # NIC k serves GPUs 2k, 2k+1
    (8, 4, (), [0, 0, 1, 1, 2, 2, 3, 3]),
    (6, 4, (), [None] * 6),  # no even split: unknown, never an invented index
    (4, 2, (1, 1, 0, 0), [1, 1, 0, 0]),  # explicit map wins over the block rule
    (8, 8, (7, 6, 5, 4, 3, 2, 1, 0), [7, 6, 5, 4, 3, 2, 1, 0]),
])
def test_nic_for_gpu(gpus: int, nics: int, gpu_nics: tuple[int, ...],
                     want: list[int | None]) -> None:
    h = host(gpus, nics, gpu_nics)
    assert [h.nic_for_gpu(g) for g in range(gpus)] == want
    assert h.nic_for_gpu(-1) is None and h.nic_for_gpu(gpus) in (None, gpus)
    for n in range(nics):
        assert h.gpus_for_nic(n) == tuple(g for g in range(gpus) if want[g] == n)


def test_nic_for_gpu_without_bus_ids_keeps_identity_within_the_nics() -> None:
    h = HostInventory("h1", nics=tuple(f"mlx5_{n}" for n in range(8)))
    assert h.nic_for_gpu(5) == 5 and h.nic_for_gpu(8) is None
    assert HostInventory("h1").nic_for_gpu(12) == 12


@pytest.mark.parametrize(("gpus", "nics", "gpu_nics", "want"), [
    (8, 8, (), [0, 1, 2, 3, 4, 5, 6, 7]),  # rail IP of NIC i names GPU i
    (8, 1, (), [None]),  # a bonded NIC serves every GPU: the host, not GPU 0
    (16, 8, (), [None] * 8),  # NIC 3 serves GPUs 6 and 7: not GPU 3
    (4, 4, (2, 3, 0, 1), [2, 3, 0, 1]),  # explicit one-to-one map
])
def test_gpu_for_ip_names_a_gpu_only_when_one_uses_the_nic(
        gpus: int, nics: int, gpu_nics: tuple[int, ...], want: list[int | None]) -> None:
    h = host(gpus, nics, gpu_nics, rails=True)
    assert [h.gpu_for_ip(ip) for ip in h.rail_ips] == want


@pytest.mark.parametrize(("gpus", "nics", "gpu_nics", "field"), [
    (4, 2, (0, 2, 0, 1), "h1.gpu_nics[1]"),  # no NIC 2
    (4, 2, (0, -1, 0, 1), "h1.gpu_nics[1]"),
    (4, 2, (0, True, 0, 1), "h1.gpu_nics[1]"),  # a bool is not an index
    (4, 0, (0, 0, 0, 0), "h1.gpu_nics[0]"),  # no NICs to point at
    (4, 2, (0, 1), "h1.gpu_nics"),  # one entry per GPU
])
def test_invalid_gpu_nics_are_rejected(gpus: int, nics: int, gpu_nics: tuple[int, ...],
                                       field: str) -> None:
    with pytest.raises(ValidationError) as e:
        host(gpus, nics, gpu_nics)
    assert e.value.field == field


def test_invalid_gpu_nics_on_the_wire_are_rejected() -> None:
    wire = Inventory(hosts={"h1": host(4, 2)}).to_wire()
    for bad in ([0, 0, 0, "1"], [0, 0, 0, 9], "0011", [0.0, 0, 0, 1]):
        wire["hosts"][0]["gpu_nics"] = bad
        with pytest.raises(ValidationError):
            Inventory.from_wire(wire)


def test_gpu_nics_on_the_wire_only_when_given() -> None:
    inv = Inventory()
    inv.add_host(host(8, 8))
    before = inv.dumps()
    assert b"gpu_nics" not in before  # old inventories stay byte-identical
    assert Inventory.from_wire(orjson.loads(before)).dumps() == before
    inv = Inventory()
    inv.add_host(host(4, 2, (1, 1, 0, 0)))
    wire = orjson.loads(inv.dumps())
    assert wire["hosts"][0]["gpu_nics"] == [1, 1, 0, 0]
    back = Inventory.from_wire(wire)
    assert back.hosts["h1"].gpu_nics == (1, 1, 0, 0) and back.dumps() == inv.dumps()


# ---- CCL detectors ---------------------------------------------------------------------
def test_links_for_names_the_nic_the_gpu_uses() -> None:
    inv = Inventory()
    inv.add_host(host(16, 8, name="a"))
    inv.add_host(host(16, 8, name="b"))
    roster = CommRoster(8, 8)
    for r, (h, g) in enumerate([("a", 7), ("b", 6)]):
        roster.learn(h, 1.0, RankSnapshot("c1", 2, r, g, (), (), 1.0))
    tor_of = tor_lookup(inv)
    assert tor_of("a", 7) == "tor-r3" and tor_of.nic("a", 7) == "a/nic3"
    end = links_for(Localisation("endpoint", (0,), ()), roster, "c1", tor_of, 8)
    assert end == (["a/nic3<->tor-r3"], ["a"], ["a/nic3"])
    pair = links_for(Localisation("pair", (), ((0, 1),)), roster, "c1", tor_of, 8)
    assert pair == (["a/nic3<->b/nic3"], ["a", "b"], [])
    # without an inventory GPU i uses NIC i, as before
    assert links_for(Localisation("endpoint", (0,), ()), roster, "c1", tor_lookup(None), 8) \
        == (["a/nic7<->tor"], ["a"], ["a/nic7"])


@pytest.mark.parametrize(("gpus", "nics", "gpu", "link", "nic"), [
    (16, 8, 7, "h0005/nic3<->tor-r3", "nic3"),  # GPU 7 of 16 uses NIC 3 of 8
    (8, 1, 5, "h0005/nic0<->tor-r0", "nic0"),  # one bonded NIC
    (6, 4, 5, "h0005/nic<->tor", "nic"),  # unknown: the host's NIC, not a made-up index
])
def test_network_hang_on_shared_nics(gpus: int, nics: int, gpu: int, link: str,
                                     nic: str) -> None:
    job = SynthJob(hosts=8, gpus=gpus)
    det = AlignmentDetector(JOB, inventory=inventory(job, nics))
    run_alignment(det, job, 10)
    job.link_down(5, gpu)
    d, = run_alignment(det, job, 50).diagnoses
    assert d.kind == "hang_network" and d.culprits.links == (link,)
    assert d.evidence["suspect_nics"] == [f"h0005/{nic}"]
    assert {o["rank"]: o["nic"] for o in d.evidence["outstanding"]} == {
        4: f"h0004/{nic}", 5: f"h0005/{nic}"}


def test_slow_link_on_a_16_gpu_8_nic_host_names_the_shared_nic() -> None:
    job = SynthJob(hosts=8, gpus=16)
    det = TDNDetector(JOB, inventory=inventory(job, 8))
    run_tdn(det, job, 10)
    job.slow_links[(5, 7)] = 3.0
    d, = run_tdn(det, job, 60).diagnoses
    assert d.kind == "slow_network" and d.culprits.links == ("h0005/nic3<->tor-r3",)
    assert d.evidence["suspect_nics"] == ["h0005/nic3"]


# ---- Z-score ---------------------------------------------------------------------------
NAMES = tuple(f"mlx5_{i + 1}" for i in range(8))  # mlx5_1..mlx5_8 at index 0..7


@pytest.mark.parametrize(("local", "with_inv", "name"), [
    ("mlx5_4", True, "h1/nic3"), ("mlx5_1", True, "h1/nic0"), ("mlx5_8", True, "h1/nic7"),
    ("mlx5_0", True, "h1/mlx5_0"),  # not one of the listed rails (a management port)
    ("mlx5_4", False, "h1/nic4"), ("eth0", True, "h1/eth0"),
])
def test_zscore_names_a_nic_by_its_inventory_index(local: str, with_inv: bool,
                                                   name: str) -> None:
    inv = Inventory()
    inv.add_host(HostInventory("h1", nics=NAMES))
    assert device_name("h1", "nic", local, False, inv if with_inv else None) == name
    assert device_name("h2", "nic", "mlx5_4", False, inv) == "h2/nic4"  # host not listed


def renamed(batches: list[TelemetryBatch]) -> list[TelemetryBatch]:
    """The same telemetry with the NICs reported as mlx5_1..mlx5_8."""
    out = []
    for b in batches:
        nic = b.devices["nic"]
        devices = {**b.devices, "nic": DeviceGroup(NAMES, nic.values)}
        out.append(TelemetryBatch(host=b.host, ts=b.ts, devices=devices, job=b.job))
    return out


@pytest.mark.parametrize("with_inv", [True, False])
def test_zscore_and_tor_agree_on_mlx5_1_to_8(with_inv: bool) -> None:
    inv = Inventory()
    for i in range(16):
        inv.add_host(HostInventory(f"h{i:04d}", nics=NAMES,
                                   tor=tuple(f"tor-r{n}" for n in range(8))))
    fault = step_fault("h0005", "nic", 3, "nic_ecn_per_s", T0 + 300, T0 + 1500, 2e4)  # mlx5_4
    det = ZScoreDetector("j1", inventory=inv if with_inv else None)
    d, = run_zscore(det, renamed(list(Cluster(faults=[fault]).batches(T0, T0 + 1500)))).diagnoses
    want = "h0005/nic3<->tor-r3" if with_inv else "h0005/nic4<->tor"
    assert d.culprits.links == (want,)
    assert d.evidence["device"] == want.split("<->")[0]


def test_log_and_telemetry_name_a_nic_the_same_way() -> None:
    """The tree's NetDiag names a NIC a log line mentions as Z-score and the CCL detectors do."""
    from processors.core.base import nic_named
    from processors.core.tree_events import TreeEvent
    from processors.core.tree_peers import suspect_links

    inv = Inventory()
    inv.add_host(HostInventory("h1", nics=NAMES))
    inv.add_host(HostInventory("h3", nics=("mlx5_0/1", "mlx5_1/1")))
    assert nic_named(inv, "h1", "mlx5_4") == "h1/nic3"
    assert nic_named(inv, "h1", "mlx5_0") == "h1/mlx5_0"
    assert nic_named(inv, "h3", "mlx5_1") == "h3/nic1"  # listed as device/port
    assert nic_named(None, "h2", "mlx5_4") == "h2/nic4"
    assert nic_named(inv, "h2", "ib0") == "h2/ib0"
    ev = TreeEvent(ts=0.0, host="h1", cat="nic_or_link", sev="degraded", rule="mlx5_link_down",
                   xid=None, gpu=None, peer=None, peer_rank=None, rank=None, device="mlx5_4",
                   action="", line="mlx5_core: mlx5_4: Link down")
    assert suspect_links([ev], [], frozenset(), inv) == ["h1/nic3"]


def with_mgmt_port(batches: list[TelemetryBatch]) -> list[TelemetryBatch]:
    """mlx5_1..8 plus a management port mlx5_0 that carries almost nothing."""
    out = []
    for b in renamed(batches):
        nic = b.devices["nic"]
        values = {m: (1e3 if m.endswith("_bps") else 0.0, *v) for m, v in nic.values.items()}
        devices = {**b.devices, "nic": DeviceGroup(("mlx5_0", *NAMES), values)}
        out.append(TelemetryBatch(host=b.host, ts=b.ts, devices=devices, job=b.job))
    return out


def test_a_management_port_the_inventory_does_not_list_is_not_scored() -> None:
    """Every host also reports mlx5_0, a management port idle next to the rails: compared
    with them it looked like a slow NIC on every host (scenario round 4)."""
    inv = Inventory()
    for i in range(16):
        inv.add_host(HostInventory(f"h{i:04d}", nics=NAMES))
    fault = step_fault("h0005", "nic", 3, "nic_ecn_per_s", T0 + 300, T0 + 1500, 2e4)
    det = ZScoreDetector("j1", inventory=inv)
    out = run_zscore(det, with_mgmt_port(list(Cluster(faults=[fault]).batches(T0, T0 + 1500))))
    d, = out.diagnoses
    assert d.culprits.links == ("h0005/nic3<->tor",)  # mlx5_4 (column 4 here), still found
    unlisted = sorted(r.detail.split()[0] for r in out.rejections if r.reason == "unlisted_nic")
    assert unlisted == [f"h{i:04d}/mlx5_0" for i in range(16)]  # once per port, counted


def test_agent_style_full_device_ids_name_the_same_culprits() -> None:
    """The agent keys devices by full name (h/gpu3, h/nic3): culprits are h/gpu3, not h/h/gpu3."""
    assert device_name("h1", "gpu", "h1/gpu3", False) == "h1/gpu3"
    assert device_name("h1", "gpu", "gpu3", False) == "h1/gpu3"
    assert device_name("h1", "nic", "h1/nic3", False) == "h1/nic3"
    inv = Inventory()
    inv.add_host(HostInventory("h1", nics=NAMES))
    assert device_name("h1", "nic", "h1/nic3", False, inv) == "h1/nic3"
    from processors.core.base import nic_listed

    assert nic_listed(inv, "h1", "h1/nic7") and not nic_listed(inv, "h1", "h1/nic8")
    assert nic_listed(inv, "h1", "mlx5_8") and not nic_listed(inv, "h1", "mlx5_0")
    assert nic_listed(None, "h1", "mlx5_0") and nic_listed(inv, "h2", "anything")
