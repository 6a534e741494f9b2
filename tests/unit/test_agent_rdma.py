"""The sysfs RDMA collector on the fixture tree (real mlx5 layout, tests/data/sysfs)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from producers.agent.collector import Notices
from producers.agent.rates import U32, U64
from producers.agent.rdma import RdmaCollector, natural_key, parse_state
from schemas.inventory import Inventory

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "sysfs"


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(FIXTURE / "class", root / "class")
    return root


def port(root: Path, dev: str) -> Path:
    return root / "class" / "infiniband" / dev / "ports" / "1"


def bump(root: Path, dev: str, name: str, value: int) -> None:
    (port(root, dev) / name).write_text(f"{value}\n")


def read(root: Path, dev: str, name: str) -> int:
    return int((port(root, dev) / name).read_text())


def collector(root: Path, **kw: object) -> tuple[RdmaCollector, Notices]:
    seen: list[str] = []
    notices = Notices(seen.append)
    return RdmaCollector("h01", root, notices, **kw), notices  # type: ignore[arg-type]


def test_fixture_has_the_real_layout() -> None:
    p = port(FIXTURE, "mlx5_0")
    assert (p / "state").read_text().strip() == "4: ACTIVE"
    for f in ("counters/port_xmit_data", "counters/port_rcv_data", "counters/symbol_error",
              "hw_counters/np_ecn_marked_roce_packets", "hw_counters/np_cnp_sent",
              "hw_counters/rp_cnp_handled", "hw_counters/out_of_sequence",
              "hw_counters/packet_seq_err", "hw_counters/local_ack_timeout_err"):
        assert (p / f).is_file(), f
    assert sorted(d.name for d in (FIXTURE / "class" / "infiniband").iterdir()) == \
        [f"mlx5_{i}" for i in range(8)]


def test_first_sample_has_link_state_and_no_rates(sysfs: Path) -> None:
    c, _ = collector(sysfs)
    part = c.collect(100.0)
    nics = part.devices["nic"]
    assert sorted(nics, key=natural_key) == [f"h01/nic{i}" for i in range(8)]
    assert all(v == {"nic_link_up": 1.0, "nic_link_downed_total": 0.0} for v in nics.values())


def test_rates_and_unit_conversion(sysfs: Path) -> None:
    c, _ = collector(sysfs)
    c.collect(100.0)
    d = "mlx5_3"
    bump(sysfs, d, "counters/port_xmit_data", read(sysfs, d, "counters/port_xmit_data") + 1_000)
    bump(sysfs, d, "counters/port_rcv_data", read(sysfs, d, "counters/port_rcv_data") + 500)
    bump(sysfs, d, "hw_counters/local_ack_timeout_err", read(sysfs, d, "hw_counters/local_ack_timeout_err") + 30)
    bump(sysfs, d, "hw_counters/packet_seq_err", read(sysfs, d, "hw_counters/packet_seq_err") + 10)
    bump(sysfs, d, "hw_counters/np_ecn_marked_roce_packets", 20_000)
    bump(sysfs, d, "hw_counters/np_cnp_sent", read(sysfs, d, "hw_counters/np_cnp_sent") + 6)
    bump(sysfs, d, "hw_counters/rp_cnp_handled", read(sysfs, d, "hw_counters/rp_cnp_handled") + 8)
    bump(sysfs, d, "hw_counters/out_of_sequence", read(sysfs, d, "hw_counters/out_of_sequence") + 4)
    (port(sysfs, d) / "state").write_text("1: DOWN\n")
    m = c.collect(102.0).devices["nic"]["h01/nic3"]
    assert m["nic_tx_bps"] == 2_000.0  # 1000 words × 4 bytes / 2 s
    assert m["nic_rx_bps"] == 1_000.0
    assert m["nic_retrans_per_s"] == 20.0  # (30 + 10) / 2
    assert m["nic_ecn_per_s"] == (20_000 - 1_204 - 3 * 13) / 2
    assert m["nic_cnp_sent_per_s"] == 3.0
    assert m["nic_cnp_handled_per_s"] == 4.0
    assert m["nic_out_of_seq_per_s"] == 2.0
    assert m["nic_link_up"] == 0.0
    assert c.collect(103.0).devices["nic"]["h01/nic0"]["nic_tx_bps"] == 0.0


@pytest.mark.parametrize(("before", "after", "rate"), [
    (U32 - 100, 300, 400 * 4),  # 32-bit port_xmit_data wraps
    (U64 - 100, 300, 400 * 4),  # 64-bit wraps
    (9_204_118_650_977, 50, 50 * 4),  # reset (driver reload): count since reset, not negative
])
def test_wrap_and_reset(sysfs: Path, before: int, after: int, rate: float) -> None:
    c, notices = collector(sysfs)
    bump(sysfs, "mlx5_0", "counters/port_xmit_data", before)
    c.collect(10.0)
    bump(sysfs, "mlx5_0", "counters/port_xmit_data", after)
    m = c.collect(11.0).devices["nic"]["h01/nic0"]
    assert m["nic_tx_bps"] == rate
    assert all(v >= 0 for v in m.values())
    assert any("was reset" in h for h in notices.history) == (before > U32 and before < U64 - 1000)


def test_device_disappears_and_returns(sysfs: Path) -> None:
    c, notices = collector(sysfs)
    c.collect(1.0)
    c.collect(2.0)
    gone = sysfs / "class" / "infiniband" / "mlx5_5"
    saved = sysfs.parent / "saved"
    shutil.move(gone, saved)
    for t in (3.0, 4.0):  # never raises; announced once; ids keep their rail index
        nics = c.collect(t).devices["nic"]
        assert nics["h01/nic5"]["nic_link_up"] == 0.0 and nics["h01/nic5"]["nic_tx_bps"] == 0.0
        assert nics["h01/nic6"]["nic_link_up"] == 1.0
    assert sum("disappeared" in h for h in notices.history) == 1
    shutil.move(saved, gone)
    back = c.collect(5.0).devices["nic"]["h01/nic5"]
    assert back["nic_link_up"] == 1.0 and "nic_tx_bps" not in back  # re-baselined
    assert any("is back" in h for h in notices.history)
    assert "nic_tx_bps" in c.collect(6.0).devices["nic"]["h01/nic5"]


def test_unreadable_counter_is_reported_once_and_left_out(sysfs: Path) -> None:
    f = port(sysfs, "mlx5_1") / "hw_counters" / "np_cnp_sent"
    f.unlink()
    f.mkdir()  # reading a directory fails with an OSError, like EACCES would
    c, notices = collector(sysfs)
    c.collect(1.0)
    m = c.collect(2.0).devices["nic"]["h01/nic1"]
    c.collect(3.0)
    assert "nic_cnp_sent_per_s" not in m and "nic_ecn_per_s" in m
    assert sum("cannot read" in h for h in notices.history) == 1


def test_no_infiniband_class(tmp_path: Path) -> None:
    c, notices = collector(tmp_path)
    assert c.collect(1.0).devices == {}
    assert c.collect(2.0).devices == {}
    assert notices.history == [f"RDMA not available: no {tmp_path}/class/infiniband"]


def test_explicit_rail_order(sysfs: Path) -> None:
    c, _ = collector(sysfs, nics=["mlx5_7", "mlx5_6/1"])
    nics = c.collect(1.0).devices["nic"]
    assert sorted(nics) == ["h01/nic0", "h01/nic1"]
    assert c.nic_names() == {"h01/nic0": "mlx5_7/1", "h01/nic1": "mlx5_6/1"}


@pytest.mark.parametrize(("text", "up"), [
    ("4: ACTIVE\n", 1.0), ("1: DOWN", 0.0), ("2: INIT", 0.0), ("ACTIVE", 1.0), ("", None)])
def test_parse_state(text: str, up: float | None) -> None:
    assert parse_state(text) == up


def test_saturated_pma_counters_are_unknown_not_zero(sysfs: Path) -> None:
    # a 32-bit PortCounters HCA (no PortCountersExtended): port_xmit_data stops at 2**32-1;
    # symbol_error is 16 bits and stops at 65535 (IBA PMA counters saturate, they don't wrap)
    c, notices = collector(sysfs)
    bump(sysfs, "mlx5_2", "counters/port_xmit_data", U32 - 1)
    bump(sysfs, "mlx5_2", "counters/symbol_error", 0xFFFF)
    bump(sysfs, "mlx5_2", "counters/port_rcv_errors", 10)
    c.collect(1.0)
    bump(sysfs, "mlx5_2", "counters/port_rcv_errors", 14)
    for t in (2.0, 3.0):
        m = c.collect(t).devices["nic"]["h01/nic2"]
        assert "nic_tx_bps" not in m  # not 0 B/s: a saturated counter says nothing
        assert "nic_rx_bps" in m
        assert m["nic_port_err_per_s"] == (4.0 if t == 2.0 else 0.0)  # the others still count
    assert sum("saturated" in h for h in notices.history) == 2
    bump(sysfs, "mlx5_2", "counters/port_xmit_data", 1_000)  # perfquery -x -R cleared it
    c.collect(4.0)
    bump(sysfs, "mlx5_2", "counters/port_xmit_data", 2_000)
    assert c.collect(5.0).devices["nic"]["h01/nic2"]["nic_tx_bps"] == 4_000.0


def test_a_64_bit_data_counter_passing_2_32_minus_1_is_not_saturated(sysfs: Path) -> None:
    c, notices = collector(sysfs)
    bump(sysfs, "mlx5_2", "counters/port_xmit_data", U32 + 5)
    c.collect(1.0)
    bump(sysfs, "mlx5_2", "counters/port_xmit_data", U32 + 10)
    assert c.collect(2.0).devices["nic"]["h01/nic2"]["nic_tx_bps"] == 20.0
    assert not any("saturated" in h for h in notices.history)


def test_nic_bus_ids_follow_the_device_links_in_nic_order(sysfs: Path) -> None:
    # real sysfs: /sys/class/infiniband/mlx5_0/device -> ../../../0000:3b:00.0; a software
    # device (rxe) or a missing link gives "", so the list still lines up with the NICs
    ib = sysfs / "class" / "infiniband"
    (ib / "mlx5_7" / "device").symlink_to("../../../0000:DC:00.1")
    (ib / "mlx5_6" / "device").symlink_to("../../../0000:3b:00.0/")
    c, _ = collector(sysfs, nics=["mlx5_7", "mlx5_6", "mlx5_5"])
    c.collect(1.0)
    assert c.nic_bus_ids() == ["0000:dc:00.1", "0000:3b:00.0", ""]
    inv = Inventory.from_wire({"hosts": [{"host": "h01", "nics": ["mlx5_7", "mlx5_6", "mlx5_5"],
                                          "nic_bus_ids": c.nic_bus_ids()}]})
    assert inv.hosts["h01"].nic_for_bus("0000:dc:00.1") == 0
    assert inv.hosts["h01"].nic_for_bus("3b:00.0") == 1
