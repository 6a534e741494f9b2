"""§5.1's limit: the Z-score finds a few hosts that differ, not two populations of a job."""

from __future__ import annotations

import numpy as np

from processors.core.zscore import ZScoreConfig, ZScoreDetector
from tests.unit.test_zscore_sim import T0, Cluster, Fault, host_name, run, step_fault

END = T0 + 1200.0
FAULT = T0 + 300.0


def stage(hosts: range, start: float = T0) -> list[Fault]:
    """A pipeline stage (or a group of busier experts) that runs every GPU of its hosts at
    a lower utilisation, throughput and power than the rest of the job, all along."""
    lower = {"gpu_util_pct": 80.0, "gpu_tensor_tflops": 250.0, "gpu_power_w": 540.0}
    return [step_fault(host_name(h), "gpu", g, m, start, END, v)
            for h in hosts for g in range(8) for m, v in lower.items()]


def test_a_whole_stage_below_the_rest_is_two_populations_not_outliers() -> None:
    clock = step_fault("h0012", "gpu", 3, "gpu_sm_clock_mhz", FAULT, END, 1400.0)
    job = Cluster(hosts=64, faults=stage(range(8)) + [clock])  # 8 hosts of 64: past 10 %
    out = run(ZScoreDetector("j1"), job.batches(T0, END))
    [d] = out.diagnoses  # the real culprit is still named
    assert d.culprits.gpus == ("h0012/gpu3",)
    assert d.evidence["actions"] == [["isolate_gpu", "h0012/gpu3"]]
    split = [r for r in out.rejections if r.reason == "two_populations"]
    assert {r.detail.split()[0] for r in split} == {
        "gpu/gpu_util_pct/low", "gpu/gpu_tensor_tflops/low", "gpu/gpu_power_w/low"}
    assert all("64 devices" in r.detail for r in split)


def test_two_hosts_that_differ_are_still_outliers() -> None:
    out = run(ZScoreDetector("j1"), Cluster(faults=stage(range(2), FAULT)).batches(T0, END))
    assert {h for d in out.diagnoses for h in d.culprits.hosts} == {"h0000", "h0001"}
    assert not [r for r in out.rejections if r.reason == "two_populations"]


def test_the_cap_is_a_share_of_the_job() -> None:
    job = Cluster(hosts=64, faults=stage(range(8), FAULT))
    wide = ZScoreConfig(max_outlier_hosts=8)
    out = run(ZScoreDetector("j1", config=wide), job.batches(T0, END))
    assert len({h for d in out.diagnoses for h in d.culprits.hosts}) == 8
    job = Cluster(hosts=48, faults=stage(range(4), FAULT))  # 4 hosts of 48: under 10 %
    out = run(ZScoreDetector("j1"), job.batches(T0, END))
    assert len({h for d in out.diagnoses for h in d.culprits.hosts}) == 4


def test_abnormal_metrics_are_not_exempt() -> None:
    retrans = [step_fault(host_name(h), "nic", 1, "nic_retrans_per_s", FAULT, END, 500.0)
               for h in range(6)]
    out = run(ZScoreDetector("j1"), Cluster(faults=retrans).batches(T0, END))
    assert len({h for d in out.diagnoses for h in d.culprits.hosts}) == 6
    assert not [r for r in out.rejections if r.reason == "two_populations"]


def test_noise_never_trips_the_guard() -> None:
    for seed in (1, 2):
        out = run(ZScoreDetector("j1"), Cluster(hosts=64, seed=seed).batches(T0, T0 + 900))
        assert out.diagnoses == [] and out.rejections == []
    assert np.isfinite(ZScoreConfig().max_outlier_share)
