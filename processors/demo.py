"""``aegis demo``: simulate a mixed-fault cluster, diagnose it with the in-process engine
(or, with ``--kafka``, through real Kafka, the worker and Redis), and score the result
against the simulator's ground truth.

Prints one row per injected fault: fault → diagnosis → action → detection delay → correct,
then a summary. ``--json`` makes the last line one JSON object with ``faults``,
``precision``, ``recall``, ``false_isolations`` and ``median_delay_s``.

Exit codes: 0 done (whatever the score); 1 the pipeline failed; 2 usage; 3 services.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import orjson

from processors.engine import Engine
from processors.progress import Progress
from processors.scoring import Score, score
from processors.settings import PipelineConfig

DEMO_POLICY = os.path.join(os.path.dirname(__file__), "demo_policy.toml")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aegis demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=32, help="hosts in the cluster (8 GPUs each)")
    p.add_argument("--hosts-per-job", type=int, default=4, help="hosts per training job")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--duration", type=float, default=420.0, help="simulated seconds")
    p.add_argument("--spacing", type=float, default=20.0, help="seconds between fault starts")
    p.add_argument("--cover-all", action="store_true",
                   help="inject every fault scenario once first (needs a job per scenario: "
                        "use --hosts 64)")
    p.add_argument("--policy", default=DEMO_POLICY, help="TOML policy (default: the demo's)")
    p.add_argument("--kafka", action="store_true",
                   help="run through real Kafka + aegis worker + Redis (started locally)")
    p.add_argument("--json", action="store_true", help="end with one JSON summary line")
    return p


def sim_config(a: argparse.Namespace) -> Any:
    from producers.sim.simulation import SimConfig

    return SimConfig(hosts=a.hosts, hosts_per_job=a.hosts_per_job, scenario="mixed", seed=a.seed,
                     duration_s=a.duration, fault_at_s=30.0, mixed_spacing_s=a.spacing,
                     mixed_cover_all=a.cover_all)


def run_in_process(a: argparse.Namespace) -> tuple[Any, Engine]:
    from producers.sim.simulation import Simulation

    sim = Simulation(sim_config(a))
    engine = Engine(PipelineConfig.from_toml(a.policy), sim.inventory)
    progress = Progress("demo", total=int(sim.end_ts - sim.config.start_ts))
    t0 = sim.config.start_ts
    for topic, _key, ts, value in sim.iter_encoded():
        engine.feed(topic, value)
        progress.update(int(ts - t0))
    engine.finish()
    progress.done()
    return sim, engine


def _fmt_culprit(f: Mapping[str, Any]) -> str:
    c = f.get("culprit", {})
    for k in ("nics", "gpus", "hosts"):
        if c.get(k):
            return ",".join(c[k][:2])
    return f.get("job", "")


def table(result: Score) -> str:
    rows = [("fault", "culprit", "diagnosis", "action", "delay", "ok")]
    for r in result.results:
        f = r.fault
        kinds = ",".join(sorted({d.kind for d in r.diagnoses})) or "-"
        acts = ",".join(sorted({f"{c.action}:{c.target}" for c in r.commands})) or (
            "none" if not r.expects_action else "-")
        if r.wrong_isolations:
            acts = ",".join(f"{c.action}:{c.target}" for c in r.wrong_isolations)
        delay = f"{r.delay_s:.0f}s" if r.delay_s is not None else "-"
        rows.append((f["scenario"], _fmt_culprit(f), kinds, acts[:48], delay,
                     "yes" if r.correct else "NO"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    started = time.monotonic()
    if a.kafka:
        from processors.demo_kafka import run_through_kafka

        try:
            sim, diagnoses, commands = run_through_kafka(a)
        except Exception as e:  # report any service failure plainly
            print(f"aegis demo --kafka: {type(e).__name__}: {e}", file=sys.stderr)
            return 3
    else:
        sim, engine = run_in_process(a)
        diagnoses, commands = engine.sink.diagnoses, engine.sink.commands
    result = score(sim.truth, diagnoses, commands)
    print(table(result))
    s = result.summary()
    s["wall_s"] = round(time.monotonic() - started, 1)
    s["mode"] = "kafka" if a.kafka else "in-process"
    print(f"\n{s['faults']} faults ({s['actionable_faults']} needing action): precision "
          f"{s['precision']:.2f} (isolations {s['isolation_precision']:.2f}), recall {s['recall']:.2f}, false isolations "
          f"{s['false_isolations']}, median detection delay {s['median_delay_s']}s "
          f"(event time), {s['commands']} commands, {s['wall_s']}s wall")
    if a.json:
        print(orjson.dumps(s).decode())
    return 0
