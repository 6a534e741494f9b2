"""Phase 2 through the real broker: simulator → ccl topic → worker's ccl agent →
diagnosis topic (hang_compute naming the lagging GPU) and the Redis isolation stream."""

from __future__ import annotations

import pytest

from producers.sim.simulation import SimConfig
from schemas.topics import CCL
from tests.simkafka import publish_sim, read_diagnoses, redis_commands, wait_for
from tests.workerutil import WorkerProc

pytestmark = pytest.mark.integration


def test_compute_hang_from_ccl_topic(kafka_bootstrap, redis_url, uid, tmp_path):
    w = WorkerProc(kafka_bootstrap, redis_url, uid, tmp_path / "worker.log").start()
    try:
        sim = publish_sim(kafka_bootstrap, w.prefix, SimConfig(
            hosts=16, hosts_per_job=8, scenario="compute_hang", seed=2, duration_s=200,
            fault_at_s=60), topics=[CCL.name])
        fault = sim.truth[0]
        diags = read_diagnoses(kafka_bootstrap, w.topic("aegis.diagnoses"), timeout=120,
                               until=lambda ds: any(d.kind == "hang_compute" for d in ds))
        hang = [d for d in diags if d.kind == "hang_compute"]
        assert hang, (diags, w.tail())
        assert set(hang[0].culprits.gpus) == set(fault["culprit"]["gpus"]), hang[0]
        delay = hang[0].detected_ts - fault["start_ts"]
        assert delay <= 30 + 5 + 1, delay  # stall threshold + 5 s (+1 s snapshot grid)
        cmds = wait_for(lambda: redis_commands(redis_url, w.cluster), 60, "commands in Redis")
        assert {c.target for c in cmds if c.action == "isolate_host"} == set(fault["culprit"]["hosts"])
    finally:
        w.stop()
