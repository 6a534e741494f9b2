"""Multi-metric correlation: one Diagnosis per device, kind by rule, joined within the wait."""

from __future__ import annotations

import msgpack
import pytest

from processors.core.correlate import Correlator, MetricFlag, classify, confidence, tor_for
from schemas.inventory import HostInventory, Inventory


def flag(metric: str, direction: str, at: float = 1000.0, device: str = "h1/nic3",
         kind: str = "nic", local: str = "mlx5_3", start: float = 400.0) -> MetricFlag:
    return MetricFlag(device=device, device_kind=kind, host=device.split("/")[0], local=local,
                      metric=metric, direction=direction, value=9.0, mean=1.0, std=2.0,
                      bound=5.0, window_s=600.0, sub_window_s=30.0, streak_start=start,
                      flagged_at=at)


def gpu_flag(metric: str, direction: str, at: float = 1000.0, start: float = 400.0) -> MetricFlag:
    return flag(metric, direction, at, "h1/gpu2", "gpu", "2", start)


@pytest.mark.parametrize(("kind", "flags", "expected", "support"), [
    ("nic", [("nic_ecn_per_s", "high")], "slow_network", ["nic_ecn_per_s"]),
    ("nic", [("nic_ecn_per_s", "high"), ("nic_retrans_per_s", "high"), ("nic_tx_bps", "low")],
     "slow_network", ["nic_ecn_per_s", "nic_retrans_per_s", "nic_tx_bps"]),
    ("nic", [("nic_cnp_handled_per_s", "high")], "outlier", ["nic_cnp_handled_per_s"]),
    ("nic", [("nic_cnp_handled_per_s", "high"), ("nic_cnp_sent_per_s", "high")], "slow_network",
     ["nic_cnp_handled_per_s", "nic_cnp_sent_per_s"]),
    ("nic", [("nic_port_err_per_s", "high")], "slow_network", ["nic_port_err_per_s"]),
    ("nic", [("nic_out_of_seq_per_s", "high")], "slow_network", ["nic_out_of_seq_per_s"]),
    ("nic", [("nic_link_up", "low")], "slow_network", ["nic_link_up"]),
    ("nic", [("nic_tx_bps", "low"), ("nic_rx_bps", "low")], "slow_network",
     ["nic_rx_bps", "nic_tx_bps"]),
    ("nic", [("nic_tx_bps", "low")], "outlier", ["nic_tx_bps"]),
    ("gpu", [("gpu_sm_clock_mhz", "low")], "slow_compute", ["gpu_sm_clock_mhz"]),
    ("gpu", [("gpu_temp_c", "high"), ("gpu_sm_clock_mhz", "low"), ("gpu_power_w", "low")],
     "slow_compute", ["gpu_sm_clock_mhz", "gpu_temp_c"]),
    ("gpu", [("gpu_tensor_tflops", "low")], "slow_compute", ["gpu_tensor_tflops"]),
    ("gpu", [("gpu_util_pct", "low")], "slow_compute", ["gpu_util_pct"]),
    ("gpu", [("gpu_ecc_sbe_per_s", "high")], "outlier", ["gpu_ecc_sbe_per_s"]),
    ("gpu", [("gpu_temp_c", "low")], "outlier", ["gpu_temp_c"]),
    ("gpu", [("gpu_temp_c", "high")], "outlier", ["gpu_temp_c"]),  # hotter, not slower
    ("gpu", [("gpu_power_w", "high")], "outlier", ["gpu_power_w"]),
    ("host", [("host_cpu_util_pct", "high")], "outlier", ["host_cpu_util_pct"]),
])
def test_classify(kind: str, flags: list[tuple[str, str]], expected: str,
                  support: list[str]) -> None:
    got = classify(kind, {m: flag(m, d, kind=kind) for m, d in flags})
    assert got == (expected, support)


def test_confidence_grows_with_agreement_and_stays_bounded() -> None:
    slow = [confidence("slow_network", k) for k in range(1, 8)]
    assert slow == sorted(slow) and slow[0] < slow[1] and max(slow) <= 0.95
    assert confidence("outlier", 1) < confidence("slow_compute", 1)


@pytest.mark.parametrize(("host", "local", "tor"), [
    ("h1", "mlx5_3", "tor-r3"), ("h1", "mlx5_9", "tor"), ("h1", "eth0", "tor"),
    ("h2", "mlx5_1", "tor"), ("h3", "mlx5_1", "tor-x"),
    # the agent's ids: a rail index, with or without the host (they named the switch "tor")
    ("h1", "nic4", "tor-r4"), ("h1", "h1/nic4", "tor-r4"), ("h1", "h1/mlx5_2", "tor-r2"),
    ("h3", "nic1", "tor-x"), ("h3", "nic2", "tor"), ("h4", "mlx5_4", "tor-r4"),
    ("h4", "nic4", "tor-r4"), ("h5", "mlx5_2", "tor-b"),
])
def test_tor_for(host: str, local: str, tor: str) -> None:
    inv = Inventory()
    inv.add_host(HostInventory("h1", nics=tuple(f"mlx5_{i}" for i in range(8)),
                               tor=tuple(f"tor-r{i}" for i in range(8))))
    inv.add_host(HostInventory("h3", nics=("mlx5_5", "mlx5_1"), tor=("tor-y", "tor-x")))
    inv.add_host(HostInventory("h4", tor=tuple(f"tor-r{i}" for i in range(8))))  # no nics listed
    inv.add_host(HostInventory("h5", nics=("mlx5_1/1", "mlx5_2/1"), tor=("tor-a", "tor-b")))
    assert tor_for(inv, host, local) == tor
    assert tor_for(None, host, local) == "tor"


def test_flags_within_wait_join_one_diagnosis() -> None:
    c = Correlator("j1", wait_s=60)
    c.add(flag("nic_ecn_per_s", "high", at=1000, start=390))
    assert c.due(1059) == []
    c.add(flag("nic_retrans_per_s", "high", at=1030, start=410))
    [d] = c.due(1060)
    assert d.kind == "slow_network" and d.event_ts == 390 and d.detected_ts == 1060
    assert set(d.evidence["metrics"]) == {"nic_ecn_per_s", "nic_retrans_per_s"}
    assert d.evidence["actions"] == [["run_netdiag", "h1/nic3<->tor"]]
    c.add(flag("nic_cnp_sent_per_s", "high", at=1200))
    assert c.due(5000) == []  # same kind for the same device: already said


def test_due_strictness_and_order() -> None:
    c = Correlator("j1", wait_s=30)
    c.add(flag("nic_ecn_per_s", "high", at=100, device="h2/nic0", local="mlx5_0"))
    c.add(gpu_flag("gpu_sm_clock_mhz", "low", at=90))
    assert c.due(119) == []
    assert [d.kind for d in c.due(130, inclusive=False)] == ["slow_compute"]
    assert [d.kind for d in c.due(130)] == ["slow_network"]


def test_release_forgets_the_device_so_a_new_incident_reports() -> None:
    c = Correlator("j1", wait_s=0)
    c.add(gpu_flag("gpu_sm_clock_mhz", "low", at=100, start=10))
    assert len(c.due(100)) == 1
    c.release("h1/gpu2")
    c.add(gpu_flag("gpu_sm_clock_mhz", "low", at=900, start=800))
    [d] = c.due(900)
    assert d.event_ts == 800 and d.evidence["actions"] == [["isolate_gpu", "h1/gpu2"]]


def test_release_keeps_a_pending_device() -> None:
    c = Correlator("j1", wait_s=60)
    c.add(gpu_flag("gpu_temp_c", "high"))
    c.release("h1/gpu2")
    assert c.pending() == 1


def test_snapshot_roundtrip_through_msgpack() -> None:
    c = Correlator("j1", wait_s=60)
    c.add(flag("nic_ecn_per_s", "high", at=1000))
    c.add(gpu_flag("gpu_ecc_sbe_per_s", "high", at=900))
    assert [d.kind for d in c.due(960)] == ["outlier"]
    state = msgpack.unpackb(msgpack.packb(c.snapshot()))
    again = Correlator.restore(state, "j1", 60)
    assert again.snapshot() == c.snapshot()
    assert [d.to_wire() for d in again.due(2000)] == [d.to_wire() for d in c.due(2000)]
