"""Mixed mode at scale (one fault per job, overlapping in time, every requested fault placed),
and degradation faults that keep a job's throughput in a sane band for 15 minutes."""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgpack
import numpy as np
import pytest

from producers.sim.faults import (
    CATALOGUE,
    CATEGORY_SCENARIOS,
    CATEGORY_SHARES,
    MIN_RING,
    MIXED_DEFAULT,
    share_weights,
)
from producers.sim.simulation import SimConfig, Simulation
from schemas.errors import ConfigError

BIG = dict(hosts=200, hosts_per_job=4, scenario="mixed", duration_s=400, fault_at_s=60,
           mixed_spacing_s=4.0)


def truth(**kw: Any) -> list[dict[str, Any]]:
    return Simulation(SimConfig(**kw)).truth


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fifty_overlapping_faults_on_fifty_jobs(seed: int) -> None:
    faults = truth(**BIG, seed=seed, mixed_faults=50)
    assert len(faults) == 50 and len({f["job"] for f in faults}) == 50
    starts = [f["start_ts"] for f in faults]  # config_error is never drawn by share
    assert all(b - a == 4.0 for a, b in zip(starts, starts[1:], strict=False))
    overlapping = sum(f["end_ts"] > g["start_ts"] for f, g in zip(faults, faults[1:], strict=False))
    assert overlapping == 49  # each fault still runs when the next starts
    assert len({f["scenario"] for f in faults}) >= 8


def test_default_count_fills_jobs_and_time() -> None:
    faults = truth(**BIG, seed=5)
    assert len(faults) == 50  # (400 - 60 - 60) / 4 + 1 = 71 slots, 50 jobs


def test_cover_all_then_shares() -> None:
    faults = truth(**BIG, seed=6, mixed_faults=50, mixed_cover_all=True)
    first = [f["scenario"] for f in faults[:len(MIXED_DEFAULT)]]
    assert sorted(first) == sorted(MIXED_DEFAULT)
    assert "gpu_conn_fail" in CATALOGUE and "gpu_conn_fail" not in MIXED_DEFAULT
    rest = Counter(f["scenario"] for f in faults[len(MIXED_DEFAULT):])
    assert "config_error" not in rest and sum(rest.values()) == 50 - len(MIXED_DEFAULT)


def test_restricted_scenarios() -> None:
    allowed = ("xid79", "slow_link", "config_error")
    faults = truth(**BIG, seed=7, mixed_faults=30, mixed_scenarios=allowed)
    assert len(faults) == 30 and {f["scenario"] for f in faults} == {"xid79", "slow_link"}
    cover = truth(**BIG, seed=7, mixed_faults=5, mixed_scenarios=allowed,
                  mixed_cover_all=True)
    assert {f["scenario"] for f in cover[:3]} == set(allowed)
    only = truth(**BIG, seed=7, mixed_faults=3, mixed_scenarios=("config_error",))
    assert [f["scenario"] for f in only] == ["config_error"] * 3


def test_rings_too_small_pick_another_scenario() -> None:
    # pp=2 on 4-host jobs: rings of 2, so the N-ratio link faults (MIN_RING 4) never fit
    faults = truth(**BIG, seed=8, pp=2, mixed_faults=50)
    assert len(faults) == 50
    assert all(MIN_RING.get(f["scenario"], 1) <= 2 for f in faults)
    with pytest.raises(ConfigError, match="no free job fits"):
        truth(**BIG, seed=8, pp=2, mixed_faults=5, mixed_scenarios=("slow_link",))


def test_uneven_jobs_keep_large_ones_for_link_faults() -> None:
    # jobs of 4, 4, 2 hosts: two link faults and one 2-host-capable fault all get placed
    faults = truth(hosts=10, hosts_per_job=4, scenario="mixed", duration_s=400, fault_at_s=60,
                   mixed_spacing_s=4.0, seed=9, mixed_faults=3, mixed_cover_all=True,
                   mixed_scenarios=("xid79", "slow_link", "nic_ecn"))
    by_scenario = {f["scenario"]: f["job"] for f in faults}
    assert set(by_scenario) == {"xid79", "slow_link", "nic_ecn"}
    assert by_scenario["xid79"] == "job-002"  # the 2-host job


@pytest.mark.parametrize("kwargs, match", [
    (dict(mixed_faults=51), "only 50 jobs"),
    (dict(mixed_faults=50, mixed_spacing_s=10.0), "after the run"),
    (dict(hosts=40, mixed_cover_all=True), "needs 15 faults"),
    (dict(mixed_scenarios=("nope",)), "mixed_scenarios"),
])
def test_mixed_config_errors(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        truth(**{**BIG, **kwargs, "seed": 1})


def test_share_weights_keep_category_shares() -> None:
    names = list(CATALOGUE)
    w = dict(zip(names, share_weights(names), strict=True))
    total = sum(CATEGORY_SHARES.values())
    assert w["config_error"] == 0.0 and abs(sum(w.values()) - 1) < 1e-12
    assert abs(w["nvlink_error"] - CATEGORY_SHARES["NVLink"] / total) < 1e-12
    optics = sum(w[s] for s in CATEGORY_SCENARIOS["optics"])
    assert abs(optics - CATEGORY_SHARES["optics"] / total) < 1e-12
    gpu, nic = CATEGORY_SHARES["GPU"], CATEGORY_SHARES["NIC"]
    ws = share_weights(["xid79", "nic_ecn"])  # each takes its whole category's share
    assert np.allclose(ws, [gpu / (gpu + nic), nic / (gpu + nic)])


# --- degradation faults keep throughput in a sane band ---------------------------------------


@pytest.mark.parametrize("scenario", ["slow_link", "nic_ecn", "large_packet_loss", "optics_flap",
                                      "pcie_degradation", "slow_gpu", "thermal_throttle"])
def test_degraded_job_throughput_stays_in_band_for_15_minutes(scenario: str) -> None:
    sim = Simulation(SimConfig(hosts=4, hosts_per_job=4, scenario=scenario, seed=2,
                               duration_s=1000, fault_at_s=60, init_s=5, noise_logs=False,
                               heartbeat_s=0.0))
    nic: dict[float, list[float]] = {}
    tflops: dict[float, list[float]] = {}
    for topic, _, ts, value in sim.iter_encoded():
        if topic == "aegis.telemetry" and ts >= sim.truth[0]["start_ts"]:
            d = msgpack.unpackb(value)
            nic.setdefault(ts, []).extend(d["devices"]["nic"]["values"]["nic_tx_bps"])
            tflops.setdefault(ts, []).extend(d["devices"]["gpu"]["values"]["gpu_tensor_tflops"])
    assert len(nic) >= 900
    job_nic = np.array([np.mean(v) for v in nic.values()])
    job_tflops = np.array([np.mean(v) for v in tflops.values()])
    assert job_nic.min() > 5e9 and job_nic.max() < 4e10  # healthy ~22 GB/s, /slow <= 1.45
    assert job_tflops.min() > 150 and job_tflops.max() < 500
    late, early = job_nic[-60:].mean(), job_nic[:60].mean()
    assert 0.7 < late / early < 1.4  # no drift: the slowdown does not compound
