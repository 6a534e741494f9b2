"""Z-score at scale: the live worker's telemetry agent on a 10,000-GPU job, against the raw
consume-and-decode rate of the same topic and the pure core, measured side by side.

    python bench/zscore.py --quick     # 10 s of event time (12,500 messages), under 60 s
    python bench/zscore.py             # 60 s of event time (75,000 messages), a few minutes

One simulated job of ``--hosts`` hosts (default 1,250 = 10,000 GPUs) sends one
TelemetryBatch per host per second (Aegis §5.1: 8 GPUs, 8 NICs and the host, every
catalogue metric). The telemetry records alone are pre-loaded into a fresh topic; then

1. raw: a confluent-kafka Consumer reads them all and calls ``schemas.codec.decode``;
2. core: ``ZScoreDetector`` (built as the worker builds it) runs ``observe`` + ``advance``
   on the same decoded batches, in this process, no Kafka;
3. worker: a real ``aegis worker`` starts on the backlog; from the first message it counts
   to the last (``aegis_events_in_total``, polled every 0.1 s; start-up excluded). Its
   periodic detector-state checkpoints (every 10 s of event time) are included.

The event-time window starts 24 s in, so it crosses a 30-s sub-window close (two in the
full run). Prints a summary on stderr; the LAST line is one JSON object. One core keeps up
with the job at 1 Hz when the worker handles >= ``hosts`` messages per second.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h  # noqa: E402
from _baseline import raw_consume_decode  # noqa: E402

from processors.core.zscore import ZScoreDetector  # noqa: E402
from processors.settings import PipelineConfig  # noqa: E402
from schemas.codec import decode  # noqa: E402
from schemas.records import TelemetryBatch  # noqa: E402
from schemas.topics import TELEMETRY  # noqa: E402

SKIP_S = 24.0  # event time before the measured window: it then crosses the 30-s close


def core_cost(values: list[bytes]) -> dict[str, Any]:
    """The pure detector on the decoded batches: observe + advance per batch, as the
    pipeline calls them (processors.pipeline.InputProcessor.observe)."""
    batches: list[TelemetryBatch] = []
    for v in values:
        b = decode(TelemetryBatch, v)
        assert isinstance(b, TelemetryBatch), b
        batches.append(b)
    job = batches[0].job or batches[0].host
    det = PipelineConfig().build(ZScoreDetector, job, None)
    per_batch = [sum(len(g.ids) * len(g.values) for g in b.devices.values()) for b in batches]
    devices = [sum(len(g.ids) for g in b.devices.values()) for b in batches]
    now = 0.0
    t0, c0 = time.perf_counter(), time.process_time()
    for b in batches:
        now = max(now, b.ts)
        det.observe(b)
        det.advance(now)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    values_n = sum(per_batch)
    return {"core_batches": len(batches), "core_wall_s": round(wall, 3),
            "core_msgs_per_s": round(len(batches) / wall, 1),
            "core_us_per_msg": round(wall / len(batches) * 1e6, 1),
            "core_ns_per_device_metric_update": round(wall / values_n * 1e9, 1),
            "core_cpu_s": round(cpu, 3),
            "values_per_msg": round(values_n / len(batches), 1),
            "devices_per_msg": round(sum(devices) / len(batches), 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10 s of event time (under 60 s)")
    ap.add_argument("--hosts", type=int, default=1250, help="hosts of the job (8 GPUs each)")
    ap.add_argument("--seconds", type=float, default=None, help="event seconds (default 60)")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--checkpoint-every", type=float, default=None,
                    help="pass to the worker (event seconds between state checkpoints; its "
                         "default is 10); a huge value shows the cost without checkpoints")
    a = ap.parse_args(argv)
    seconds = a.seconds or (10.0 if a.quick else 60.0)
    t_all = time.monotonic()
    starter = h.ServicesStarter()
    recs = h.simulate(a.hosts, seconds, skip_s=SKIP_S, topics=[TELEMETRY.name])
    n = len(recs)
    h.log(f"{n} telemetry messages ({a.hosts} hosts x {seconds:g} s), "
          f"{sum(len(r[3]) for r in recs) / n:.0f} B each")
    svc = starter.get()
    result: dict[str, Any] = {"bench": "zscore", "quick": a.quick, "hosts": a.hosts,
                              "checkpoint_every_s": a.checkpoint_every or 10.0,
                              "gpus": 8 * a.hosts, "event_seconds": seconds, "messages": n,
                              "bytes_per_msg": round(sum(len(r[3]) for r in recs) / n)}
    try:
        with h.workdir() as tmp:
            extra = ("--checkpoint-every", str(a.checkpoint_every)) if a.checkpoint_every else ()
            w = h.make_worker(svc, tmp, *extra, partitions=a.partitions)
            topic = w.topic(TELEMETRY.name)
            result["produce_s"] = round(h.produce(svc.bootstrap, w.prefix, recs), 2)
            raw = raw_consume_decode(svc.bootstrap, {topic: TelemetryBatch}, n, a.timeout)
            result.update(raw.figures())
            result.update(core_cost([r[3] for r in recs]))
            del recs
            w.start()
            try:
                drain = h.wait_drain(w, [topic], n, timeout=a.timeout, broker_pid=svc.broker_pid)
                diag = h.counter(w.metrics(), "aegis_diagnoses_total")
            finally:
                w.stop()
    finally:
        svc.stop()
    result.update(drain.figures())
    rate = drain.messages / drain.wall_s
    result.update({
        "worker_device_samples_per_s": round(rate * result["devices_per_msg"]),
        "worker_device_metric_values_per_s": round(rate * result["values_per_msg"]),
        "worker_vs_raw": round(rate / result["raw_msgs_per_s"], 3),
        "worker_vs_core": round(rate / result["core_msgs_per_s"], 3),
        "needed_msgs_per_s": a.hosts,
        "keeps_up_1hz": rate >= a.hosts,
        "keeps_up_1hz_by_cpu": drain.cpu_s / drain.messages * a.hosts < 1.0,
        "headroom_x": round(rate / a.hosts, 2),
        "worker_cpu_cores_at_1hz": round(drain.cpu_s / drain.messages * a.hosts, 2),
        "diagnoses": sum(diag.values()),
        "total_s": round(time.monotonic() - t_all, 1), **h.machine()})
    h.log(f"raw {result['raw_msgs_per_s']:.0f}/s, core {result['core_msgs_per_s']:.0f}/s, "
          f"worker {rate:.0f}/s ({result['worker_vs_raw']:.2f}x raw), need {a.hosts}/s: "
          f"{'keeps up' if rate >= a.hosts else 'does NOT keep up'}")
    h.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
