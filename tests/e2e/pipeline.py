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
from tests.simkafka import read_diagnoses, redis_commands
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
        time.sleep(settle_s)  # guard agent, Redis and the diagnoses topic catch up
        truth = [f for s in sims for f in s.truth]
        diags = read_diagnoses(bootstrap, w.topic("aegis.diagnoses"), timeout=30)
        cmds = redis_commands(redis_url, w.cluster)
        return sims, score(truth, diags, cmds), w
    finally:
        w.stop()


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
