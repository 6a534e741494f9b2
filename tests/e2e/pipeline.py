"""Drive the whole pipeline for e2e tests: simulations → real Kafka topics → a real
``aegis worker`` → diagnoses topic and the Redis isolation stream; then score."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from processors.demo import DEMO_POLICY
from processors.scoring import Score, score
from producers.sim.kafka_out import KafkaSimSink
from producers.sim.simulation import SimConfig, Simulation
from schemas.inventory import Inventory
from tests.simkafka import read_diagnoses, redis_commands, topic_end
from tests.workerutil import WorkerProc


def run_pipeline(bootstrap: str, redis_url: str, uid: str, tmp: Path,
                 configs: list[SimConfig], settle_s: float = 20.0,
                 timeout_s: float = 900.0) -> tuple[list[Simulation], Score, WorkerProc]:
    sims = [Simulation(c) for c in configs]
    inventory = Inventory()
    for s in sims:
        inventory.merge(s.inventory)
    inv_path = tmp / "inventory.json"
    inv_path.write_bytes(inventory.dumps())
    w = WorkerProc(bootstrap, redis_url, uid, tmp / "worker.log", "--policy", DEMO_POLICY,
                   "--inventory", str(inv_path), partitions=4).start()
    try:
        sink = KafkaSimSink(bootstrap, w.prefix)
        counts: dict[str, int] = {}
        for s in sims:
            for topic, key, ts, value in s.iter_encoded():
                sink.emit_encoded(topic, key, ts, value)
                counts[topic] = counts.get(topic, 0) + 1
        sink.flush()
        deadline = time.monotonic() + timeout_s
        for topic, n in counts.items():  # wait until the worker has read everything
            w.wait_metric(f'aegis_events_in_total{{topic="{w.topic(topic)}"}} {float(n)}',
                          timeout=max(10.0, deadline - time.monotonic()))
        wait_guard_drained(bootstrap, w, settle_s, deadline)
        truth = [f for s in sims for f in s.truth]
        n_diags = topic_end(bootstrap, w.topic("aegis.diagnoses"))
        diags = read_diagnoses(bootstrap, w.topic("aegis.diagnoses"), timeout=60,
                               until=lambda ds: len(ds) >= n_diags)
        cmds = redis_commands(redis_url, w.cluster)
        return sims, score(truth, diags, cmds), w
    finally:
        w.stop()


def wait_guard_drained(bootstrap: str, w: WorkerProc, quiet_s: float, deadline: float) -> None:
    """Wait until the guard has read every record of the diagnoses topic and the topic has
    stopped growing for ``quiet_s`` (late Phase-2/Z-score diagnoses, guard follow-ups)."""
    topic = w.topic("aegis.diagnoses")
    needle = f'aegis_events_in_total{{topic="{topic}"}} '
    stable_since, last = time.monotonic(), -1
    while time.monotonic() < deadline:
        end = topic_end(bootstrap, topic)
        read = next((float(line[len(needle):]) for line in w.metrics().splitlines()
                     if line.startswith(needle)), 0.0)
        if end != last or read < end:
            stable_since, last = time.monotonic(), end
        elif time.monotonic() - stable_since >= quiet_s:
            return
        time.sleep(1.0)
    raise AssertionError(f"guard did not drain {topic} (end {last}):\n{w.tail()}")


def describe(result: Score) -> list[str]:
    out = []
    for r in result.results:
        f: Any = r.fault
        acts = ",".join(sorted({f"{c.action}:{c.target}" for c in r.commands})) or "none"
        delay = f"{r.delay_s:5.1f}s" if r.delay_s is not None else "    -"
        out.append(f"{f['scenario']:<18} {delay}  {'ok ' if r.correct else 'BAD'} {acts}")
    for c in result.unmatched_commands:
        out.append(f"  extra command: {c.action} {c.target} (job {c.job}, diagnosis {c.diagnosis_id})")
    s = result.summary()
    out.append(f"isolation precision {s['isolation_precision']}, action precision {s['precision']}, recall {s['recall']} false isolations "
               f"{s['false_isolations']} median delay {s['median_delay_s']}s over {s['faults']} faults")
    return out
