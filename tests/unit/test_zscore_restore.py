"""snapshot → msgpack → restore mid-window gives exactly the outputs of an uninterrupted run."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import numpy as np
import pytest

from processors.core.base import Outputs
from processors.core.zscore import ZScoreConfig, ZScoreDetector
from schemas.errors import ConfigError
from schemas.records import TelemetryBatch
from tests.unit.test_zscore_sim import T0, Cluster, step_fault

CFG = ZScoreConfig(window_s=120, sub_window_s=10, lateness_s=5, correlate_wait_s=20)


def _nan_now_and_then(h: str, ts: float, kind: str, values: dict[str, np.ndarray]) -> None:
    if h == "h0001" and kind == "gpu" and int(ts) % 35 == 0:
        values["gpu_temp_c"][0] = np.nan


def _batches() -> list[TelemetryBatch]:
    faults = [step_fault("h0005", "nic", 3, "nic_ecn_per_s", T0 + 100, T0 + 700, 2e4),
              step_fault("h0005", "nic", 3, "nic_retrans_per_s", T0 + 110, T0 + 700, 900.0),
              step_fault("h0009", "gpu", 6, "gpu_sm_clock_mhz", T0 + 200, T0 + 700, 1300.0),
              _nan_now_and_then]
    return list(Cluster(hosts=10, faults=faults).batches(T0, T0 + 700))


BATCHES = _batches()


def _feed(det: ZScoreDetector, batches: list[TelemetryBatch]) -> Outputs:
    out = Outputs()
    for i, b in enumerate(batches):
        out.extend(det.observe(b))
        if i % 97 == 0:
            out.extend(det.advance(b.ts))
    return out


def _wire(out: Outputs) -> tuple[list[Any], list[Any]]:
    return [d.to_wire() for d in out.diagnoses], list(out.rejections)


def _roundtrip(det: ZScoreDetector) -> ZScoreDetector:
    state = msgpack.unpackb(msgpack.packb(det.snapshot()), strict_map_key=False)
    return ZScoreDetector.restore(state, "j1", CFG)


def test_scenario_has_something_to_compare() -> None:
    diags, rejections = _wire(_feed(ZScoreDetector("j1", CFG), BATCHES))
    assert {d["kind"] for d in diags} == {"slow_network", "slow_compute"}
    assert {r.reason for r in rejections} == {"not_finite"}


@pytest.mark.parametrize("cut", [1, 333, 701, 1001, 1234, len(BATCHES) - 1])
def test_restore_mid_window_is_exact(cut: int) -> None:
    whole = _wire(_feed(ZScoreDetector("j1", CFG), BATCHES))
    det = ZScoreDetector("j1", CFG)
    first = _feed(det, BATCHES[:cut])
    second = _feed(_roundtrip(det), BATCHES[cut:])
    assert _wire(first.extend(second)) == whole


@pytest.mark.parametrize("cut", [700, 1300])
def test_replay_after_restore_is_not_double_counted(cut: int) -> None:
    whole = _wire(_feed(ZScoreDetector("j1", CFG), BATCHES))
    det = ZScoreDetector("j1", CFG)
    first = _feed(det, BATCHES[:cut])
    replay = _feed(_roundtrip(det), BATCHES[cut - 60:])  # 6 ticks re-delivered
    diags, rejections = _wire(first.extend(replay))
    assert diags == whole[0]
    assert [r for r in rejections if r.reason != "duplicate"] == whole[1]
    assert sum(r.reason == "duplicate" for r in rejections) == 60


def test_snapshot_is_plain_json() -> None:
    det = ZScoreDetector("j1", CFG)
    _feed(det, BATCHES[:1001])
    text = json.dumps(det.snapshot(), allow_nan=False)
    again = ZScoreDetector.restore(json.loads(text), "j1", CFG)
    assert again.snapshot() == det.snapshot()


def test_restore_refuses_another_sub_window() -> None:
    state = ZScoreDetector("j1", CFG).snapshot()
    with pytest.raises(ConfigError):
        ZScoreDetector.restore(state, "j1", ZScoreConfig(sub_window_s=30))


def test_restore_maps_metric_rows_by_name() -> None:
    """A snapshot from a build whose catalogue had another metric order restores the same."""
    det = ZScoreDetector("j1", CFG)
    _feed(det, BATCHES[:701])
    state = det.snapshot()
    gpu = state["kinds"]["gpu"]
    order = list(range(len(gpu["metrics"])))[::-1] + [len(gpu["metrics"])]
    old_names = gpu["metrics"] + ["gpu_retired_metric"]

    def shuffle(rows: list) -> list:
        rows = rows + [rows[0] if not isinstance(rows[0], list) else [0] * len(rows[0])]
        return [rows[i] for i in order]
    gpu["metrics"] = [old_names[i] for i in order]
    gpu["small"] = shuffle(gpu["small"])
    gpu["history"] = [[s, shuffle(a), shuffle(b), shuffle(c)] for s, a, b, c in gpu["history"]]
    gpu["streak"] = [[order.index(r), d, s, e, f] for r, d, s, e, f in gpu["streak"]]
    state["open"] = [[s, k, shuffle(t), shuffle(c)] if k == "gpu" else [s, k, t, c]
                     for s, k, t, c in state["open"]]
    again = ZScoreDetector.restore(state, "j1", CFG)
    assert again.snapshot() == det.snapshot()
