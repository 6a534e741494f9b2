"""The whole live pipeline: simulator → real Kafka → ``aegis worker`` → Redis, measured.

    python bench/pipeline.py --quick                 # every part, small, under 60 s
    python bench/pipeline.py --part throughput       # or latency, scale, all (default)

One Kafka broker and redis-server (scripts/localservices.py) and ONE worker serve every
part, so the figures are measured side by side in one run:

throughput  A healthy simulated cluster (``--hosts``, default 1,250 = 10,000 GPUs, one job
            unless ``--hosts-per-job``), all three input topics, ``--seconds`` of steady
            event time (the job's start-up seconds dropped), pre-loaded; then (1) a
            confluent-kafka Consumer reads them and ``schemas.codec.decode``s each (raw),
            (2) the worker starts on the backlog and is timed from the first message it
            counts to the last (start-up excluded). Ratio worker/raw, and x-realtime =
            worker rate / the rate the cluster produces at 1 Hz.
latency     An Xid 79 kernel line (LogRecord on the logs topic) for a fresh job and host,
            followed at once by that host's agent heartbeat stamped 6 s later, so the
            decision tree's 5-s settle window (Aegis Phase 1; EVENT time) has elapsed and it
            judges immediately. Wall time from producing the Xid line to the isolate_host
            command appearing in the Redis stream (XREAD BLOCK): two Kafka hops (logs,
            diagnoses), the tree, the guard and the Redis flush. The settle window itself is
            NOT in this figure: live, a real host's next heartbeat comes <= 5 s later, so
            add up to settle_s + heartbeat period of waiting. ``--repeats`` times, each on
            its own job and host, 2 h apart in event time (under no guard rate limit).
scale       The worker's CPU seconds (/proc/<pid>/stat) and wall time per message at 1K, 5K,
            10K and 20K GPUs, ``--scale-seconds`` of event time each, produced to the
            running worker and drained.

Between stretches the bench waits for the worker to write the final checkpoint of the jobs
that went quiet (``checkpoint_cpu_s``; see _harness.sweep) so it is not charged to the next
stretch. Prints progress on stderr; the LAST line is one JSON object.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h  # noqa: E402
import orjson  # noqa: E402
from _baseline import raw_consume_decode  # noqa: E402

from producers.sim.log_templates import XID79_TEXT, xid  # noqa: E402
from producers.sim.simulation import DEFAULT_EPOCH  # noqa: E402
from schemas.codec import encode  # noqa: E402
from schemas.records import LogRecord  # noqa: E402
from schemas.topics import INPUTS, LOGS  # noqa: E402
from sinks.redis_queue import stream_key  # noqa: E402

INPUT_NAMES = [t.name for t in INPUTS]
SCALE_HOSTS = (125, 625, 1250, 2500)
SETTLE_GAP_S = 6.0  # heartbeat this long after the Xid line: past the tree's settle_s = 5
LATENCY_EPOCH = DEFAULT_EPOCH + 30 * 86400.0  # far from the simulated runs' event time
LATENCY_SPACING_S = 7200.0  # > the guard's rate-limit windows (3,600 s)


def stretch(worker: Any, svc: h.Services, records: list[h.Encoded], partition: int,
            timeout: float) -> h.Drain:
    """Produce ``records`` to one partition of the running worker's topics and time it until
    it has counted them."""
    topics = [worker.topic(t) for t in INPUT_NAMES]
    start = h.mark(worker, topics, svc.broker_pid)
    h.produce(svc.bootstrap, worker.prefix, records, partition=partition)
    return h.wait_drain(worker, topics, start.n + len(records), timeout=timeout,
                        broker_pid=svc.broker_pid, start=start)


def throughput(svc: h.Services, worker: Any, records: list[h.Encoded], hosts: int,
               seconds: float, timeout: float) -> dict[str, Any]:
    per_topic = h.mix(records)
    out: dict[str, Any] = {"hosts": hosts, "gpus": 8 * hosts, "event_seconds": seconds,
                           "messages": len(records), "mix": per_topic,
                           "bytes_per_msg": round(sum(len(r[3]) for r in records) / len(records))}
    out["produce_s"] = round(h.produce(svc.bootstrap, worker.prefix, records), 2)
    types = {worker.topic(t): h.RECORD_TYPES[t] for t in per_topic}
    raw = raw_consume_decode(svc.bootstrap, types, len(records), timeout)
    out.update(raw.figures())
    worker.start()
    drain = h.wait_drain(worker, list(types), len(records), timeout=timeout,
                         broker_pid=svc.broker_pid)
    out.update(drain.figures())
    rate = drain.messages / drain.wall_s
    needed = len(records) / seconds
    out.update({"worker_vs_raw": round(rate / raw.messages * raw.wall_s, 3),
                "needed_msgs_per_s_1hz": round(needed), "x_realtime": round(rate / needed, 2),
                "worker_cpu_cores_at_1hz": round(drain.cpu_s / drain.messages * needed, 2)})
    h.log(f"throughput: raw {out['raw_msgs_per_s']:.0f}/s, worker {rate:.0f}/s "
          f"({out['worker_vs_raw']:.2f}x raw), {out['x_realtime']:.2f}x real time")
    return out


def latency(svc: h.Services, worker: Any, repeats: int, timeout: float = 60.0) -> dict[str, Any]:
    import redis
    from confluent_kafka import Producer

    r = redis.Redis.from_url(svc.redis_url)
    key = stream_key(worker.cluster)
    last: Any = r.xrevrange(key, count=1)
    last_id: Any = last[0][0] if last else b"0-0"
    p = Producer({"bootstrap.servers": svc.bootstrap, "linger.ms": 0, "acks": "all"})
    topic = worker.topic(LOGS.name)
    tag = uuid.uuid4().hex[:6]
    line = xid("0000:3b:00.0", 79, XID79_TEXT, 4242)
    waits: list[float] = []
    for k in range(repeats):
        host, job = f"lat{tag}h{k:04d}", f"lat{tag}j{k:04d}"
        ts = LATENCY_EPOCH + k * LATENCY_SPACING_S
        first = encode(LogRecord(host, ts, "kernel", line, job))
        beat = encode(LogRecord(host, ts + SETTLE_GAP_S, "agent", "aegis-agent heartbeat seq=1", job))
        t0 = time.perf_counter()
        p.produce(topic, key=job.encode(), value=first)
        p.produce(topic, key=job.encode(), value=beat)
        p.flush(10)
        deadline = t0 + timeout
        found = False
        while not found:
            left_ms = int((deadline - time.perf_counter()) * 1000)
            if left_ms <= 0:
                raise TimeoutError(f"no isolate_host {host} in {key} after {timeout}s:\n"
                                   f"{worker.tail()}")
            got: Any = r.xread({key: last_id}, block=left_ms, count=100)
            for _key, entries in got or []:
                for entry_id, fields in entries:
                    last_id = entry_id
                    cmd = orjson.loads(fields[b"cmd"])
                    if cmd["action"] == "isolate_host" and cmd["target"] == host:
                        found = True
        waits.append((time.perf_counter() - t0) * 1000)
    out = {"repeats": repeats, "p50_ms": round(h.percentile(waits, 50), 1),
           "p99_ms": round(h.percentile(waits, 99), 1), "min_ms": round(min(waits), 1),
           "max_ms": round(max(waits), 1), "settle_s_event_time_not_included": 5.0}
    h.log(f"latency: p50 {out['p50_ms']} ms, p99 {out['p99_ms']} ms over {repeats}")
    return out


def scale_point(svc: h.Services, worker: Any, hosts: int, records: list[h.Encoded],
                seconds: float, partition: int, timeout: float) -> dict[str, Any]:
    d = stretch(worker, svc, records, partition, timeout)
    needed = len(records) / seconds
    out = {"hosts": hosts, "gpus": 8 * hosts, "messages": len(records),
           "cpu_us_per_msg": round(d.cpu_s / d.messages * 1e6, 1),
           "wall_us_per_msg": round(d.wall_s / d.messages * 1e6, 1),
           "msgs_per_s": round(d.messages / d.wall_s, 1), "cpu_s": round(d.cpu_s, 3),
           "wall_s": round(d.wall_s, 3), "needed_msgs_per_s_1hz": round(needed),
           "worker_cpu_cores_at_1hz": round(d.cpu_s / seconds, 2),
           "x_realtime": round(d.messages / d.wall_s / needed, 2)}
    h.log(f"scale {8 * hosts} GPUs: {out['cpu_us_per_msg']} us CPU, {out['wall_us_per_msg']} us "
          f"wall per msg, {out['worker_cpu_cores_at_1hz']} cores at 1 Hz")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("throughput", "latency", "scale", "all"), default="all")
    ap.add_argument("--quick", action="store_true", help="every part, small: under 60 s")
    ap.add_argument("--hosts", type=int, default=1250, help="throughput: hosts (8 GPUs each)")
    ap.add_argument("--hosts-per-job", type=int, default=0, help="0: one job over every host")
    ap.add_argument("--seconds", type=float, default=None, help="throughput: event seconds (20)")
    ap.add_argument("--repeats", type=int, default=None, help="latency: repetitions (100)")
    ap.add_argument("--scale-hosts", default=",".join(map(str, SCALE_HOSTS)))
    ap.add_argument("--scale-seconds", type=float, default=None, help="event seconds each (10)")
    ap.add_argument("--partitions", type=int, default=2,
                    help="of the worker's topics (at least one per scale point)")
    ap.add_argument("--timeout", type=float, default=600.0)
    a = ap.parse_args(argv)
    parts = ("throughput", "latency", "scale") if a.part == "all" else (a.part,)
    seconds = a.seconds or (2.0 if a.quick else 20.0)
    repeats = a.repeats or (20 if a.quick else 100)
    scale_s = a.scale_seconds or (1.0 if a.quick else 10.0)
    per_job = a.hosts_per_job or None
    sizes = [int(n) for n in a.scale_hosts.split(",")] if "scale" in parts else []
    partitions = max(a.partitions, len(sizes))  # each scale point has a partition to itself
    t_all = time.monotonic()
    starter = h.ServicesStarter()
    recs = h.simulate(a.hosts, seconds, hosts_per_job=per_job) if "throughput" in parts else []
    sample = h.sweep_sample()
    svc = starter.get()
    result: dict[str, Any] = {"bench": "pipeline", "quick": a.quick, "parts": list(parts),
                              "hosts_per_job": per_job or "all", "partitions": partitions}
    try:
        with h.workdir() as tmp:
            w = h.make_worker(svc, tmp, partitions=partitions)
            try:
                if "throughput" in parts:
                    result["throughput"] = throughput(svc, w, recs, a.hosts, seconds, a.timeout)
                    del recs
                else:
                    w.start().wait_metric("aegis_events_in", timeout=60)
                quiet_since = time.monotonic()
                scale_recs = {}
                if "scale" in parts:  # simulate while the last stretch's jobs go quiet
                    for n in sizes:
                        scale_recs[n] = h.simulate(n, scale_s, hosts_per_job=per_job,
                                                   name_prefix=f"s{n}x")
                ckpt = h.sweep(svc, w, sample, range(partitions), quiet_since)
                if "throughput" in parts:
                    result["throughput"]["checkpoint_cpu_s"] = round(ckpt, 3)
                if "latency" in parts:
                    result["latency"] = latency(svc, w, repeats)
                if "scale" in parts:
                    curve, ended = [], []
                    for i, (n, rs) in enumerate(scale_recs.items()):
                        curve.append(scale_point(svc, w, n, rs, scale_s, i, a.timeout))
                        ended.append(time.monotonic())
                    for i, point in enumerate(curve):  # each point's job has its partition
                        point["checkpoint_cpu_s"] = round(
                            h.sweep(svc, w, sample, [i], ended[i]), 3)
                    result["scale"] = {"event_seconds": scale_s, "points": curve}
                result["diagnoses"] = h.counter(w.metrics(), "aegis_diagnoses_total")
            finally:
                w.stop()
    finally:
        svc.stop()
    result.update({"total_s": round(time.monotonic() - t_all, 1), **h.machine()})
    h.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
