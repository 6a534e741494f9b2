"""Edge cases of the §5.1 Z-score: bad values, late and duplicate samples, zero variance,
small groups, clock skew, hosts joining and leaving."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from processors.core.zscore import ZScoreConfig, ZScoreDetector
from processors.core.zscore_devices import device_name
from schemas.errors import ConfigError
from schemas.records import DeviceGroup, TelemetryBatch
from tests.unit.test_zscore_sim import T0, Cluster, host_name, run, step_fault

CFG = ZScoreConfig(window_s=60, sub_window_s=10, lateness_s=5, correlate_wait_s=10)


def temps(host: str, ts: float, values: list[float], job: str | None = "j1",
          metric: str = "gpu_temp_c") -> TelemetryBatch:
    ids = tuple(str(i) for i in range(len(values)))
    return TelemetryBatch(host, ts, {"gpu": DeviceGroup(ids, {metric: tuple(values)})}, job=job)


def open_counts(det: ZScoreDetector) -> float:
    """Total number of samples counted in the open sub-windows."""
    return sum(float(np.sum(c)) for win in det.open.values() for _, c in win.values())


@pytest.mark.parametrize(("host", "local", "kind", "alone", "name"), [
    ("h1", "3", "gpu", False, "h1/gpu3"),
    ("h1", "0000:3b:00.0", "gpu", False, "h1/0000:3b:00.0"),
    ("h1", "mlx5_7", "nic", False, "h1/nic7"),
    ("h1", "2", "nic", False, "h1/nic2"),
    ("h1", "eth0", "nic", False, "h1/eth0"),
    ("h1", "host", "host", True, "h1"),
    ("h1", "anything", "host", True, "h1"),
    ("h1", "psu1", "host", False, "h1/psu1"),
])
def test_device_names(host: str, local: str, kind: str, alone: bool, name: str) -> None:
    assert device_name(host, kind, local, alone) == name


@pytest.mark.parametrize(("bad", "metric", "reason"), [
    (math.nan, "gpu_temp_c", "not_finite"),
    (math.inf, "gpu_temp_c", "not_finite"),
    (-3.0, "gpu_pcie_replay_per_s", "negative_counter"),
    (1e300, "gpu_temp_c", "out_of_range"),
    (-1e300, "gpu_temp_c", "out_of_range"),
])
def test_bad_values_rejected_with_reason_rest_counts(bad: float, metric: str, reason: str) -> None:
    det = ZScoreDetector("j1", CFG)
    out = det.observe(temps("h7", T0, [60.0, bad, 61.0], metric=metric))
    [r] = out.rejections
    assert r.reason == reason and r.host == "h7" and r.detector == "zscore"
    assert metric in r.detail and "h7/gpu1" in r.detail and repr(bad) in r.detail
    assert open_counts(det) == 2


def test_negative_non_counter_is_accepted() -> None:
    det = ZScoreDetector("j1", CFG)
    assert det.observe(temps("h1", T0, [-5.0, 1.0])).rejections == []


def test_unknown_metric_reported_once_per_metric() -> None:
    det = ZScoreDetector("j1", CFG)
    reasons = []
    for i in range(3):
        b = TelemetryBatch("h1", T0 + i, {"gpu": DeviceGroup(("0",), {"gpu_fancy": (1.0,),
                                                                       "gpu_temp_c": (60.0,)}),
                                          "nic": DeviceGroup(("mlx5_0",), {"gpu_temp_c": (1.0,)})})
        reasons += [(r.reason, r.detail.split()[0]) for r in det.observe(b).rejections]
    assert reasons == [("unknown_metric", "gpu/gpu_fancy"), ("unknown_metric", "nic/gpu_temp_c")]


def test_wrong_job_bad_shape_and_duplicate_ids_rejected() -> None:
    det = ZScoreDetector("j1", CFG)
    assert det.observe(temps("h1", T0, [1.0], job="other")).rejections[0].reason == "wrong_job"
    assert det.observe(temps("h1", T0, [1.0], job=None)).rejections == []
    ragged = TelemetryBatch("h1", T0 + 1, {"gpu": DeviceGroup(("0", "1"), {"gpu_temp_c": (1.0,)})})
    assert det.observe(ragged).rejections[0].reason == "bad_shape"
    twice = TelemetryBatch("h1", T0 + 2, {"gpu": DeviceGroup(("0", "0"),
                                                             {"gpu_temp_c": (1.0, 2.0)})})
    assert det.observe(twice).rejections[0].reason == "duplicate_device"


def test_out_of_order_within_lateness_accepted_beyond_is_late() -> None:
    det = ZScoreDetector("j1", CFG)
    assert run(det, [temps("h1", T0 + 12, [60.0]), temps("h2", T0 + 8, [60.0])]).rejections == []
    det.observe(temps("h1", T0 + 40, [60.0]))  # watermark 35: windows ending ≤ 30 close
    out = det.observe(temps("h2", T0 + 11, [60.0]))
    assert [r.reason for r in out.rejections] == ["late"]
    assert det.observe(temps("h2", T0 + 36, [60.0])).rejections == []


def test_duplicates_ignored_and_counted_also_after_close() -> None:
    det = ZScoreDetector("j1", CFG)
    b = temps("h1", T0 + 1, [60.0, 61.0])
    det.observe(b)
    out = det.observe(b)
    assert [r.reason for r in out.rejections] == ["duplicate"]
    assert open_counts(det) == 2
    det.observe(temps("h1", T0 + 30, [60.0, 61.0]))  # closes the first sub-window
    assert [r.reason for r in det.observe(b).rejections] == ["duplicate"]


def test_zero_variance_never_divides_by_zero() -> None:
    det = ZScoreDetector("j1", CFG)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for k in range(30):
            for h in range(6):
                v = [1980.0] * 8
                if h == 0:
                    v[0] = 1975.0  # within the absolute tolerance
                if h == 1:
                    v[4] = 1200.0  # far outside, while δ of the rest is exactly 0
                b = TelemetryBatch(host_name(h), T0 + 5 * k,
                                   {"gpu": DeviceGroup(tuple(map(str, range(8))),
                                                       {"gpu_sm_clock_mhz": tuple(v)})})
                out.append(det.observe(b))
        out.append(det.advance(T0 + 200))
    diags = [d for o in out for d in o.diagnoses]
    assert [(d.kind, d.culprits.gpus) for d in diags] == [("slow_compute", ("h0001/gpu4",))]
    assert diags[0].evidence["metrics"]["gpu_sm_clock_mhz"]["z"] is not None


def test_group_too_small_reported_once_per_change() -> None:
    det = ZScoreDetector("j1", CFG)
    reasons = []
    for k in range(40):  # 3 devices, then 5, then 3 again
        n = 5 if 10 <= k < 20 else 3
        reasons += [r.detail.split(":")[0] for r in
                    det.observe(temps("h1", T0 + 5 * k, [60.0] * n)).rejections
                    if r.reason == "group_too_small"]
    assert reasons == ["gpu metric gpu_temp_c", "gpu metric gpu_temp_c"]


def test_lone_host_far_ahead_is_clock_skew_and_does_not_move_the_clock() -> None:
    det = ZScoreDetector("j1", CFG)
    det.observe(temps("h1", T0, [60.0] * 4))
    det.observe(temps("h2", T0, [60.0] * 4))
    out = det.observe(temps("h2", T0 + 3600, [60.0] * 4))
    assert [r.reason for r in out.rejections] == ["clock_skew"]
    assert det.observe(temps("h1", T0 + 2, [60.0] * 4)).rejections == []
    det.observe(temps("h2", T0 + 3600, [60.0] * 4))  # h2 still ahead…
    out = det.observe(temps("h1", T0 + 3601, [60.0] * 4))  # …and h1 agrees: the clock moves
    assert out.rejections == [] and det.max_ts == T0 + 3601


def test_hosts_joining_and_leaving_do_not_flag() -> None:
    cfg = ZScoreConfig(window_s=120, sub_window_s=10)
    late_joiner, leaver = host_name(3), host_name(5)

    def absent(h: str, ts: float) -> bool:
        return (h == late_joiner and ts < T0 + 400) or (h == leaver and ts >= T0 + 300)
    out = run(ZScoreDetector("j1", cfg), Cluster(absent=absent).batches(T0, T0 + 900))
    assert out.diagnoses == [] and out.rejections == []


def test_absence_longer_than_gap_restarts_the_streak() -> None:
    cfg = ZScoreConfig(window_s=120, sub_window_s=10, gap_s=30, correlate_wait_s=10)
    fault = step_fault("h0002", "nic", 1, "nic_ecn_per_s", T0 + 100, T0 + 900, 2e4)

    def away(h: str, ts: float) -> bool:
        return h == "h0002" and T0 + 180 <= ts < T0 + 240  # 60 s away, mid-streak
    out = run(ZScoreDetector("j1", cfg), Cluster(faults=[fault], absent=away).batches(T0, T0 + 900))
    [d] = out.diagnoses
    assert abs(d.event_ts - (T0 + 240)) < 10  # the streak restarted on return


def test_short_absence_keeps_the_streak() -> None:
    cfg = ZScoreConfig(window_s=120, sub_window_s=10, gap_s=30, correlate_wait_s=10)
    fault = step_fault("h0002", "nic", 1, "nic_ecn_per_s", T0 + 100, T0 + 900, 2e4)

    def away(h: str, ts: float) -> bool:
        return h == "h0002" and T0 + 180 <= ts < T0 + 195
    out = run(ZScoreDetector("j1", cfg), Cluster(faults=[fault], absent=away).batches(T0, T0 + 900))
    [d] = out.diagnoses
    assert abs(d.event_ts - (T0 + 100)) < 10


@pytest.mark.parametrize("kwargs", [
    {"sub_window_s": 0}, {"sub_window_s": 700}, {"min_devices": 1}, {"sigma": 0},
    {"lateness_s": -1},
])
def test_bad_config_rejected(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        ZScoreConfig(**kwargs)


def test_flush_closes_open_windows_and_emits_pending() -> None:
    cfg = ZScoreConfig(window_s=60, sub_window_s=10, correlate_wait_s=30)
    f = step_fault("h0001", "nic", 0, "nic_ecn_per_s", T0 + 50, T0 + 200, 2e4)
    det = ZScoreDetector("j1", cfg)
    out = run(det, Cluster(faults=[f]).batches(T0, T0 + 140))
    assert out.diagnoses == []
    [d] = det.flush().diagnoses
    assert d.kind == "slow_network" and det.open == {}
    assert ZScoreDetector("j1").flush().diagnoses == []
