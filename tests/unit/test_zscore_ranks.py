"""Z-score scores only what holds the job's ranks, when the inventory lists them: a spare host
beside the job, or a GPU the job does not use, idles, and compared with the busy ranks it
looked like an outlier (Aegis §5.1 compares the devices of one synchronous job)."""

from __future__ import annotations

import numpy as np

from processors.core.zscore import ZScoreDetector
from schemas.inventory import Inventory
from tests.unit.test_zscore_sim import T0, Cluster, host_name, run, step_fault

END = T0 + 1500.0
IDLE = {"gpu": {"gpu_util_pct": 0.0, "gpu_power_w": 70.0, "gpu_tensor_tflops": 0.0,
                "gpu_sm_clock_mhz": 210.0, "gpu_temp_c": 35.0, "gpu_nvlink_rx_bps": 0.0,
                "gpu_nvlink_tx_bps": 0.0, "gpu_pcie_rx_bps": 0.0, "gpu_pcie_tx_bps": 0.0},
        "nic": {"nic_tx_bps": 0.0, "nic_rx_bps": 0.0},
        "host": {"host_cpu_util_pct": 2.0}}


def idle(host: str, gpus: tuple[int, ...] | None = None):
    """``host`` idles from the start: every kind (a spare), or only ``gpus``."""
    def fault(h: str, ts: float, kind: str, values: dict[str, np.ndarray]) -> None:
        if h != host or (gpus is not None and kind != "gpu"):
            return
        for m, v in IDLE[kind].items():
            if gpus is None:
                values[m][:] = v
            else:
                values[m][list(gpus)] = v
    return fault


def ranks(hosts: range, gpus: range = range(8)) -> Inventory:
    inv = Inventory()
    inv.ranks["j1"] = {i * len(gpus) + k: (host_name(i), g)
                       for i in hosts for k, g in enumerate(gpus)}
    return inv


def test_a_spare_host_without_a_rank_is_not_scored() -> None:
    c = Cluster(faults=[idle("h0015")])
    blind = run(ZScoreDetector("j1"), c.batches(T0, END))
    assert any("h0015" in (*d.culprits.hosts, *(g.split("/")[0] for g in d.culprits.gpus))
               for d in blind.diagnoses)  # without the rank map: the spare looks broken
    out = run(ZScoreDetector("j1", inventory=ranks(range(15))), c.batches(T0, END))
    assert out.diagnoses == []
    notes = [r for r in out.rejections if r.reason == "no_rank"]
    assert len(notes) == 1 and notes[0].host == "h0015"


def test_gpus_without_a_rank_are_not_scored_and_ranked_ones_still_are() -> None:
    c = Cluster(faults=[idle("h0003", gpus=(5,)),
                        step_fault("h0007", "gpu", 2, "gpu_sm_clock_mhz", T0 + 300, END, 1400.0)])
    out = run(ZScoreDetector("j1", inventory=ranks(range(16), range(4))), c.batches(T0, END))
    assert [d.culprits.gpus for d in out.diagnoses] == [("h0007/gpu2",)]
    notes = {r.detail.split()[0] for r in out.rejections if r.reason == "no_rank"}
    assert notes == {f"{host_name(i)}/gpu{g}" for i in range(16) for g in range(4, 8)}


def test_an_inventory_without_ranks_scores_everything() -> None:
    c = Cluster(faults=[idle("h0003", gpus=(5,))])
    out = run(ZScoreDetector("j1", inventory=Inventory()), c.batches(T0, END))
    assert [d.culprits.gpus for d in out.diagnoses] == [("h0003/gpu5",)]
