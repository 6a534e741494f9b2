"""The agent's own telemetry, as it goes on the wire, through the Z-score detector: the device
ids the agent sends (``h/gpu2``) must give the culprit names every other detector uses."""

from __future__ import annotations

from typing import Any

from processors.core.zscore import ZScoreDetector
from producers.agent.agent import build_groups
from producers.agent.simgpu import SimulatedGpuCollector
from schemas.codec import decode, encode
from schemas.records import TelemetryBatch

T0 = 1_767_225_600.0


class SlowGpu(SimulatedGpuCollector):
    """GPU ``slow`` runs at a throttled SM clock from ``since`` on."""

    def __init__(self, host: str, slow: int, since: float, seed: int) -> None:
        super().__init__(host, 8, seed)
        self.slow, self.since, self.now = slow, since, 0.0

    def collect(self, now: float) -> Any:
        self.now = now
        return super().collect(now)

    def _gauges(self, i: int) -> dict[str, float]:
        g = super()._gauges(i)
        if i == self.slow and self.now >= self.since:
            g["gpu_sm_clock_mhz"] = 1150.0
        return g


def test_a_slow_gpu_in_the_agents_own_telemetry_is_named_as_every_detector_names_it() -> None:
    hosts = [f"h{i:04d}" for i in range(16)]
    gpus = {h: SlowGpu(h, 2 if h == "h0005" else -1, T0 + 120, seed=i)
            for i, h in enumerate(hosts)}
    det = ZScoreDetector("j1")
    diags = []
    for step in range(int(900 / 5)):
        ts = T0 + 5 * step
        for h in hosts:
            part = gpus[h].collect(ts)
            batch = TelemetryBatch(h, ts, build_groups(part.devices), "j1")
            assert batch.devices["gpu"].ids[0] == f"{h}/gpu0"  # the agent's full names
            wire = decode(TelemetryBatch, encode(batch))
            assert isinstance(wire, TelemetryBatch)
            diags += det.observe(wire).diagnoses
    diags += det.flush().diagnoses
    assert [(d.kind, d.culprits.gpus) for d in diags] == [("slow_compute", ("h0005/gpu2",))]
    assert diags[0].evidence["actions"] == [["isolate_gpu", "h0005/gpu2"]]
