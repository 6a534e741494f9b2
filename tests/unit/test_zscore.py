"""Known-answer scenarios for the §5.1 Z-score detector (Aegis §5.1: λ±2δ throughout T)."""

from __future__ import annotations

import pytest

from processors.core.zscore import ZScoreConfig, ZScoreDetector
from schemas.inventory import HostInventory, Inventory
from tests.unit.test_zscore_sim import T0, Cluster, run, step_fault

W = 30.0  # default sub-window
T = 600.0  # default window
FAULT = T0 + 300.0  # faults start after five minutes of healthy history


def ecn(r):  # the paper's case: 0 → 10–30K ECN marks/s
    return r.uniform(1e4, 3e4)


def test_paper_ecn_case_flags_after_t_once_with_fault_start() -> None:
    c = Cluster(faults=[step_fault("h0005", "nic", 3, "nic_ecn_per_s", FAULT, FAULT + 1800, ecn)])
    det = ZScoreDetector("j1")
    before = run(det, c.batches(T0, FAULT + T - W))
    assert before.diagnoses == []
    after = run(det, c.batches(FAULT + T - W, FAULT + 1800))
    assert before.rejections == after.rejections == []
    [d] = after.diagnoses
    assert d.kind == "slow_network"
    assert d.culprits.links == ("h0005/nic3<->tor",)
    assert d.culprits.hosts == ("h0005",)
    assert d.evidence["actions"] == [["run_netdiag", "h0005/nic3<->tor"]]
    assert abs(d.event_ts - FAULT) < W
    assert FAULT + T <= d.detected_ts <= FAULT + T + 2 * W + ZScoreConfig().correlate_wait_s
    ev = d.evidence["metrics"]["nic_ecn_per_s"]
    assert ev["value"] > ev["bound"] > ev["mean"] and ev["window_s"] == T
    assert ev["streak_start"] == d.event_ts


def test_link_uses_inventory_tor_name() -> None:
    inv = Inventory()
    inv.add_host(HostInventory("h0005", nics=tuple(f"mlx5_{i}" for i in range(8)),
                               tor=tuple(f"tor-p0-r{i}" for i in range(8))))
    c = Cluster(faults=[step_fault("h0005", "nic", 3, "nic_ecn_per_s", FAULT, FAULT + 1200, ecn)])
    out = run(ZScoreDetector("j1", inventory=inv), c.batches(T0, FAULT + 1200))
    [d] = out.diagnoses
    assert d.culprits.links == ("h0005/nic3<->tor-p0-r3",)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_healthy_run_with_noise_flags_nothing(seed: int) -> None:
    out = run(ZScoreDetector("j1"), Cluster(seed=seed).batches(T0, T0 + 1800), until=T0 + 1900)
    assert out.diagnoses == [] and out.rejections == []


def test_two_host_blip_shorter_than_t_flags_nothing() -> None:
    faults = [step_fault(h, "nic", 2, m, FAULT, FAULT + 300, 2e4)
              for h in ("h0003", "h0009") for m in ("nic_ecn_per_s", "nic_retrans_per_s")]
    out = run(ZScoreDetector("j1"), Cluster(faults=faults).batches(T0, T0 + 1800))
    assert out.diagnoses == []


def test_low_bad_clock_drop_and_temp_rise_give_one_slow_compute() -> None:
    faults = [step_fault("h0007", "gpu", 5, "gpu_sm_clock_mhz", FAULT, FAULT + 1500, 1400.0),
              step_fault("h0007", "gpu", 5, "gpu_temp_c", FAULT, FAULT + 1500, 88.0)]
    out = run(ZScoreDetector("j1"), Cluster(faults=faults).batches(T0, FAULT + 1500))
    [d] = out.diagnoses
    assert d.kind == "slow_compute"
    assert d.culprits.gpus == ("h0007/gpu5",)
    assert d.evidence["actions"] == [["isolate_gpu", "h0007/gpu5"]]
    assert set(d.evidence["metrics"]) == {"gpu_sm_clock_mhz", "gpu_temp_c"}
    assert d.evidence["metrics"]["gpu_sm_clock_mhz"]["direction"] == "low"
    assert d.evidence["metrics"]["gpu_temp_c"]["direction"] == "high"
    assert abs(d.event_ts - FAULT) < W
    single = run(ZScoreDetector("j1"), Cluster(faults=faults[:1]).batches(T0, FAULT + 1500))
    assert d.confidence > single.diagnoses[0].confidence


def test_correctable_ecc_alone_is_an_outlier_without_action() -> None:
    f = step_fault("h0002", "gpu", 1, "gpu_ecc_sbe_per_s", FAULT, FAULT + 1200, 400.0)
    [d] = run(ZScoreDetector("j1"), Cluster(faults=[f]).batches(T0, FAULT + 1200)).diagnoses
    assert d.kind == "outlier" and d.evidence["actions"] == []
    assert d.culprits.gpus == ("h0002/gpu1",)


def test_link_down_is_slow_network() -> None:
    f = step_fault("h0004", "nic", 6, "nic_link_up", FAULT, FAULT + 1200, 0.0)
    [d] = run(ZScoreDetector("j1"), Cluster(faults=[f]).batches(T0, FAULT + 1200)).diagnoses
    assert d.kind == "slow_network" and d.culprits.links == ("h0004/nic6<->tor",)


@pytest.mark.parametrize(("value", "flags"), [(30.0, False), (400.0, True)])
def test_abnormal_metric_needs_its_floor(value: float, flags: bool) -> None:
    """nic_retrans_per_s: floor 50/s; a steady 30/s on a quiet fabric stays unflagged."""
    f = step_fault("h0001", "nic", 0, "nic_retrans_per_s", FAULT, FAULT + 1200, value)
    out = run(ZScoreDetector("j1"), Cluster(faults=[f]).batches(T0, FAULT + 1200))
    assert [d.kind for d in out.diagnoses] == (["slow_network"] if flags else [])


def test_incident_reported_once_and_again_after_recovery() -> None:
    cfg = ZScoreConfig(window_s=120, sub_window_s=10, recover_s=60, correlate_wait_s=10)
    fault = step_fault("h0001", "nic", 0, "nic_ecn_per_s", T0 + 100, T0 + 600, 2e4)
    again = step_fault("h0001", "nic", 0, "nic_ecn_per_s", T0 + 800, T0 + 1100, 2e4)
    out = run(ZScoreDetector("j1", cfg), Cluster(faults=[fault, again]).batches(T0, T0 + 1200))
    starts = [d.event_ts for d in out.diagnoses]
    assert len(starts) == 2
    assert abs(starts[0] - (T0 + 100)) < 10 and abs(starts[1] - (T0 + 800)) < 10


def test_short_normal_dip_does_not_reopen_an_incident() -> None:
    """A flap (beyond, normal for 40 s, beyond again) inside recover_s stays one incident."""
    cfg = ZScoreConfig(window_s=120, sub_window_s=10, recover_s=120, correlate_wait_s=10)
    faults = [step_fault("h0001", "nic", 0, "nic_ecn_per_s", T0 + 100, T0 + 400, 2e4),
              step_fault("h0001", "nic", 0, "nic_ecn_per_s", T0 + 440, T0 + 900, 2e4)]
    out = run(ZScoreDetector("j1", cfg), Cluster(faults=faults).batches(T0, T0 + 1000))
    assert len(out.diagnoses) == 1


def test_metrics_flagging_within_the_wait_join_and_later_kind_change_is_new() -> None:
    cfg = ZScoreConfig(window_s=120, sub_window_s=10, correlate_wait_s=30)
    faults = [step_fault("h0003", "gpu", 2, "gpu_ecc_sbe_per_s", T0 + 100, T0 + 900, 500.0),
              step_fault("h0003", "gpu", 2, "gpu_pcie_replay_per_s", T0 + 115, T0 + 900, 50.0),
              step_fault("h0003", "gpu", 2, "gpu_sm_clock_mhz", T0 + 400, T0 + 900, 1200.0)]
    out = run(ZScoreDetector("j1", cfg), Cluster(faults=faults).batches(T0, T0 + 900))
    first, second = out.diagnoses
    assert first.kind == "outlier"
    assert set(first.evidence["metrics"]) == {"gpu_ecc_sbe_per_s", "gpu_pcie_replay_per_s"}
    assert second.kind == "slow_compute" and abs(second.event_ts - (T0 + 400)) < 10
    assert "gpu_ecc_sbe_per_s" in second.evidence["metrics"]


def test_job_wide_shift_marks_nobody() -> None:
    """Every GPU drops to 0 % for 4 min (a checkpoint): nobody differs from the rest."""
    cfg = ZScoreConfig(window_s=120, sub_window_s=10)

    def checkpoint(h, ts, kind, values):
        if kind == "gpu" and T0 + 300 <= ts < T0 + 540:
            values["gpu_util_pct"][:] = 0.0
            values["gpu_tensor_tflops"][:] = 0.0
    out = run(ZScoreDetector("j1", cfg), Cluster(faults=[checkpoint]).batches(T0, T0 + 900))
    assert out.diagnoses == []


def test_job_moving_together_over_time_does_not_hide_a_slow_nic() -> None:
    """Bandwidth of the whole job swings 1.0↔0.3 every 150 s; one NIC runs at half of it.
    δ is the cross-device spread within each sub-window pooled over T, so the job's own
    swing over time does not widen the bound."""
    def phases(h, ts, kind, values):
        if kind == "nic" and int((ts - T0) // 150) % 2:
            values["nic_tx_bps"] *= 0.3
            values["nic_rx_bps"] *= 0.3

    def half(h, ts, kind, values):
        if h == "h0011" and kind == "nic" and ts >= FAULT:
            values["nic_tx_bps"][4] *= 0.5
            values["nic_rx_bps"][4] *= 0.5
    out = run(ZScoreDetector("j1"), Cluster(faults=[phases, half]).batches(T0, FAULT + 1200))
    [d] = out.diagnoses
    assert d.kind == "slow_network" and d.culprits.links == ("h0011/nic4<->tor",)
    assert set(d.evidence["metrics"]) == {"nic_tx_bps", "nic_rx_bps"}
    assert abs(d.event_ts - FAULT) < W
