"""Host roll-up: a host whose GPUs are slow together is the culprit, not one of its GPUs."""

from __future__ import annotations

import pytest

from processors.core.zscore import ZScoreConfig, ZScoreDetector
from sinks.guard import Guard
from tests.unit.test_zscore_sim import T0, Cluster, run, step_fault

FAULT = T0 + 300.0
END = T0 + 1200.0


def throttled(gpus: range, host: str = "h0003") -> list:
    """A power cap or a cooling fault: the host's GPUs clock down and heat up together."""
    return [step_fault(host, "gpu", g, m, FAULT, END, v) for g in gpus
            for m, v in (("gpu_sm_clock_mhz", 1400.0), ("gpu_temp_c", 88.0))]


def commands(diagnoses: list) -> list[tuple[str, str]]:
    g = Guard()
    g.set_job_size("j1", 16)
    return [(c.action, c.target) for d in diagnoses for c in g.decide(d).commands]


@pytest.mark.parametrize("gpus", [range(8), range(4)])
def test_half_or_more_of_a_hosts_gpus_slow_together_isolate_the_host(gpus: range) -> None:
    out = run(ZScoreDetector("j1"), Cluster(faults=throttled(gpus)).batches(T0, END))
    [d] = out.diagnoses
    assert d.kind == "slow_compute" and d.culprits.hosts == ("h0003",)
    assert d.culprits.gpus == tuple(f"h0003/gpu{g}" for g in gpus)
    assert d.evidence["actions"] == [["isolate_host", "h0003"]]
    assert d.evidence["host_gpus"] == 8 and set(d.evidence["devices"]) == set(d.culprits.gpus)
    assert all(set(v["metrics"]) == {"gpu_sm_clock_mhz", "gpu_temp_c"}
               for v in d.evidence["devices"].values())
    assert abs(d.event_ts - FAULT) < ZScoreConfig().sub_window_s
    assert f"{len(gpus)} of its 8 GPUs" in d.summary
    assert commands(out.diagnoses) == [("isolate_host", "h0003")]


def test_a_few_slow_gpus_of_a_host_are_isolated_one_by_one() -> None:
    out = run(ZScoreDetector("j1"), Cluster(faults=throttled(range(3))).batches(T0, END))
    assert sorted(d.culprits.gpus for d in out.diagnoses) == [
        ("h0003/gpu0",), ("h0003/gpu1",), ("h0003/gpu2",)]
    assert all(d.evidence["actions"][0][0] == "isolate_gpu" for d in out.diagnoses)


def test_roll_up_off_gives_per_gpu_diagnoses_and_the_guard_keeps_one() -> None:
    cfg = ZScoreConfig(host_rollup_share=0.0)
    out = run(ZScoreDetector("j1", config=cfg), Cluster(faults=throttled(range(8))).batches(T0, END))
    assert len(out.diagnoses) == 8
    assert len(commands(out.diagnoses)) == 1  # why the roll-up exists: 7 slow GPUs stay


def test_roll_up_survives_a_snapshot_between_flag_and_emission() -> None:
    c = Cluster(faults=throttled(range(8)))
    det = ZScoreDetector("j1")
    cut = FAULT + 600 + 45  # flags raised, the correlation wait still running
    first = run(det, c.batches(T0, cut))
    assert first.diagnoses == [] and det.corr.pending() == 8
    again = ZScoreDetector.restore(det.snapshot(), "j1")
    [d] = run(again, c.batches(cut, END)).diagnoses
    assert d.evidence["actions"] == [["isolate_host", "h0003"]]


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_bad_share_rejected(share: float) -> None:
    with pytest.raises(Exception, match="host_rollup_share"):
        ZScoreConfig(host_rollup_share=share)
