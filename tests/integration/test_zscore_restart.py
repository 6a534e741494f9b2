"""Aegis §5.1 across a worker crash: kill -9 the worker in the middle of the persistence
window, restart it; the outlier is still found, at the right event time, exactly once."""

from __future__ import annotations

import time

import pytest

from processors.engine import Engine
from processors.settings import PipelineConfig
from producers.sim.kafka_out import KafkaSimSink
from producers.sim.simulation import SimConfig, Simulation
from schemas.topics import TELEMETRY
from tests.simkafka import read_diagnoses
from tests.workerutil import WorkerProc

pytestmark = pytest.mark.integration

POLICY = """
[zscore]
window_s = 120.0
correlate_wait_s = 10.0
"""


def test_outlier_found_once_across_kill(kafka_bootstrap, redis_url, uid, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    cfg = SimConfig(hosts=16, hosts_per_job=8, scenario="nic_ecn", seed=5, duration_s=420,
                    fault_at_s=60)
    sim = Simulation(cfg)
    entries = [e for e in sim.iter_encoded() if e[0] == TELEMETRY.name]
    # what an uninterrupted run finds
    engine = Engine(PipelineConfig.from_toml(str(policy)), sim.inventory)
    for topic, _k, _ts, value in entries:
        engine.feed(topic, value)
    engine.sink.flush()  # no finish(): exactly what a live worker emits by the last record
    expected = [d for d in engine.sink.diagnoses if d.kind == "slow_network"]
    assert len(expected) == 1, expected
    want = expected[0]
    cut_ts = sim.truth[0]["start_ts"] + 70  # mid-window: the streak is 70 s old of 120
    first = [e for e in entries if e[2] <= cut_ts]
    rest = entries[len(first):]

    inventory = tmp_path / "inventory.json"
    inventory.write_bytes(sim.inventory.dumps())
    w = WorkerProc(kafka_bootstrap, redis_url, uid, tmp_path / "w1.log", "--policy", str(policy),
                   "--checkpoint-every", "10", "--inventory", str(inventory))
    w.start()
    sink = KafkaSimSink(kafka_bootstrap, w.prefix)
    for e in first:
        sink.emit_encoded(*e)
    sink.flush()
    topic = w.topic("aegis.telemetry")
    w.wait_metric(f'aegis_events_in_total{{topic="{topic}"}} {float(len(first))}', timeout=120)
    time.sleep(3)  # let a commit happen; whatever was not committed is re-read
    w.stop(hard=True)  # SIGKILL mid-window
    w.log = tmp_path / "w2.log"
    w.start()
    try:
        for e in rest:
            sink.emit_encoded(*e)
        sink.flush()
        diags = read_diagnoses(kafka_bootstrap, w.topic("aegis.diagnoses"), timeout=150,
                               until=lambda ds: any(d.kind == "slow_network" for d in ds))
        w.wait_metric(f'aegis_events_in_total{{topic="{topic}"}}', timeout=30)
        time.sleep(5)  # anything emitted twice would show up by now
        diags = read_diagnoses(kafka_bootstrap, w.topic("aegis.diagnoses"), timeout=20)
    finally:
        w.stop()
    got = [d for d in diags if d.kind == "slow_network"]
    assert len(got) == 1, (got, w.tail())
    detail = f"got {got[0].to_wire()}\nwant {want.to_wire()}"
    assert got[0].id == want.id, detail
    assert got[0].event_ts == want.event_ts and got[0].detected_ts == want.detected_ts
    assert got[0].culprits == want.culprits
