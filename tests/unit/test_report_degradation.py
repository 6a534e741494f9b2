"""Aegis §5 degradation from DP progress: Σ(Tk − Ts)/ΣTk with Ts = 1.2 × normal."""

from __future__ import annotations

import math

import numpy as np
import pytest

from processors.report.degradation import (
    forward_fill,
    launch_ratio,
    measure,
    pacing_comms,
    percent,
    progress_of,
)

NAN = math.nan


def seq_from_rates(rates: list[float], ranks: int = 4, bucket_s: float = 5.0) -> np.ndarray:
    """Cumulative launches per bucket for a communicator progressing at ``rates`` (launches/s)."""
    cum = np.cumsum([0.0] + [r * bucket_s for r in rates])
    return np.tile(cum, (ranks, 1))


def test_forward_fill_keeps_leading_gaps():
    a = np.array([[NAN, 1, NAN, 3], [2, NAN, NAN, NAN]])
    out = forward_fill(a)
    assert np.isnan(out[0, 0]) and out[0, 1:].tolist() == [1, 1, 3]
    assert out[1].tolist() == [2, 2, 2, 2]


def test_progress_is_the_slowest_rank_and_stops_after_the_last_report():
    seq = np.array([[0, 10, 20, NAN, NAN], [0, 9, 19, 30, NAN]], dtype=float)
    p = progress_of(seq)
    assert p[:4].tolist() == [0, 9, 19, 20] and np.isnan(p[4])


def test_steady_job_has_no_degradation():
    d = measure("j", {"c": seq_from_rates([20.0] * 40)}, 5.0)
    assert d.fraction == 0.0 and d.stalled_s == 0 and d.normal_launch_s == pytest.approx(0.05)


@pytest.mark.parametrize("slow,expected", [
    (1.1, 0.0),  # 10% slower: within Ts = 1.2x, not degradation (the loose threshold)
    (1.5, 0.5 * (1 - 1.2 / 1.5)),  # half the time 1.5x slower
    (2.0, 0.5 * (1 - 1.2 / 2.0)),
])
def test_slow_half(slow, expected):
    rates = [20.0] * 30 + [20.0 / slow] * 30
    d = measure("j", {"c": seq_from_rates(rates)}, 5.0)
    assert d.fraction == pytest.approx(expected, abs=1e-9)
    assert d.slow_buckets == (30 if slow > 1.2 else 0)


def test_a_stall_is_lost_time_and_the_worst_comm_gates():
    fast = seq_from_rates([20.0] * 20)
    stalled = seq_from_rates([20.0] * 15 + [0.0] * 5)
    d = measure("j", {"a": fast, "b": stalled}, 5.0)
    assert d.stalled_s == 25.0 and d.lost_s == 25.0
    assert d.fraction == pytest.approx(25.0 / 100.0)
    assert d.comms == ["a", "b"]


def test_long_fault_does_not_become_normal():
    rates = [20.0] * 10 + [20.0 / 1.26] * 90  # +26% for 90% of the run (Aegis §5.1 case)
    d = measure("j", {"c": seq_from_rates(rates)}, 5.0)
    assert d.normal_launch_s == pytest.approx(0.05)
    assert d.fraction == pytest.approx(0.9 * (1 - 1.2 / 1.26), rel=1e-6)


def test_start_up_before_first_progress_is_not_counted():
    seq = seq_from_rates([0.0] * 10 + [20.0] * 10)
    d = measure("j", {"c": seq}, 5.0)
    assert d.fraction == 0.0 and d.running_s == 50.0


def test_no_progress_at_all_gives_no_measure():
    d = measure("j", {"c": np.zeros((2, 5))}, 5.0)
    assert d.fraction is None and percent(d.fraction) == "n/a"
    r, tau0 = launch_ratio(np.array([1.0]), 5.0)
    assert tau0 is None and np.isnan(r).all()


def test_pacing_comms_prefers_the_widest_dp_allreduce():
    hosts = {"tp0": {"h0"}, "tp1": {"h1"}, "dp0": {"h0", "h1", "h2"}, "dp1": {"h0", "h1", "h2"},
             "pp": {"h0", "h1"}}
    ops = {"tp0": ["AllGather"], "tp1": ["AllGather"], "dp0": ["AllReduce"],
           "dp1": ["AllReduce", "AllGather"], "pp": ["Send"]}
    assert pacing_comms(hosts, ops) == ["dp0", "dp1"]
    assert pacing_comms({"tp0": {"h0"}}, {"tp0": ["AllGather"]}) == ["tp0"]
    assert pacing_comms({}, {}) == []


def test_percent():
    assert percent(0.0412) == "4.1%" and percent(None) == "n/a"
