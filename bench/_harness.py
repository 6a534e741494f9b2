"""Shared helpers for the live-pipeline benches (bench/pipeline.py, bench/zscore.py).

Real services only: Kafka 3.9.1 and redis-server from scripts/localservices.py (or the ones
named by AEGIS_KAFKA_BOOTSTRAP / AEGIS_REDIS_URL), a real ``aegis worker`` subprocess
(tests/workerutil.py) and the simulator's encoded records. What is measured:

- the worker: messages counted by its ``aegis_events_in_total{topic}`` counter, polled every
  ``POLL_S``; wall time from the first poll that sees the counter move to the first poll
  that sees it reach the target (so the worker's start-up is not counted), and the
  worker's CPU seconds (utime + stime of its process, /proc/<pid>/stat) over that window;
- the baseline (bench/_baseline.py): a confluent-kafka Consumer reading the same topics
  from the beginning and calling ``schemas.codec.decode`` on each value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _p in (str(ROOT), str(ROOT / "scripts")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from producers.sim.simulation import SimConfig, Simulation  # noqa: E402
from schemas.codec import decode, encode  # noqa: E402
from schemas.errors import WireError  # noqa: E402
from schemas.records import CCLRecord, LogRecord, TelemetryBatch  # noqa: E402
from schemas.topics import CCL, LOGS, TELEMETRY  # noqa: E402

POLL_S = 0.1
CLK_TCK = os.sysconf("SC_CLK_TCK")
RECORD_TYPES: dict[str, type] = {TELEMETRY.name: TelemetryBatch, LOGS.name: LogRecord,
                                 CCL.name: CCLRecord}
QUIET_WALL_S = 5.0  # processors.checkpoints.AckHolder: a job idle this long is checkpointed
Encoded = tuple[str, str, float, bytes]


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "load1": round(os.getloadavg()[0], 2),
            "date": time.strftime("%Y-%m-%d")}


# -- services --------------------------------------------------------------------------
@dataclass
class Services:
    bootstrap: str
    redis_url: str
    broker_pid: int | None = None
    startup_s: float = 0.0
    _stack: Any = None

    def stop(self) -> None:
        if self._stack is not None:
            self._stack.stop()


class ServicesStarter:
    """Start Kafka + Redis in a thread so the caller can simulate meanwhile; ``get()`` waits."""

    def __init__(self) -> None:
        self._result: Services | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.monotonic()
        try:
            boot, url = os.environ.get("AEGIS_KAFKA_BOOTSTRAP"), os.environ.get("AEGIS_REDIS_URL")
            if boot and url:
                self._result = Services(boot, url)
                return
            from localservices import LocalStack

            stack = LocalStack.start()
            pid = stack.kafka.proc.pid if stack.kafka.proc else None
            self._result = Services(stack.kafka.bootstrap, stack.redis.url, pid,
                                    time.monotonic() - t0, stack)
        except BaseException as e:  # re-raised in get()
            self._error = e

    def get(self) -> Services:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


# -- simulation ------------------------------------------------------------------------
def simulate(hosts: int, seconds: float, *, hosts_per_job: int | None = None, skip_s: float = 2.0,
             topics: Iterable[str] | None = None, name_prefix: str = "", seed: int = 0
             ) -> list[Encoded]:
    """A healthy cluster's encoded records for ``seconds`` of steady event time: the first
    ``skip_s`` (the job's start-up: its burst of launch log lines, no CCL yet) are dropped."""
    cfg = SimConfig(hosts=hosts, hosts_per_job=hosts_per_job, scenario="healthy", seed=seed,
                    duration_s=skip_s + seconds, init_s=min(1.0, skip_s), name_prefix=name_prefix)
    keep = set(topics) if topics is not None else None
    start = cfg.start_ts + skip_s
    return [r for r in Simulation(cfg).iter_encoded()
            if r[2] >= start and (keep is None or r[0] in keep)]


def mix(records: Iterable[Encoded]) -> dict[str, int]:
    return dict(Counter(r[0] for r in records))


def produce(bootstrap: str, prefix: str, records: Iterable[Encoded], partition: int | None = None
            ) -> float:
    """Produce as the simulator's Kafka sink does (lz4, idempotent, keyed by job; partition
    by the key unless ``partition`` is given); seconds until all are acknowledged."""
    from confluent_kafka import Producer

    t0 = time.monotonic()
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "compression.type": "lz4", "linger.ms": 20, "batch.size": 1 << 20,
                  "queue.buffering.max.messages": 500_000, "queue.buffering.max.kbytes": 1 << 20})
    part = -1 if partition is None else partition  # -1: librdkafka's partitioner, by key
    for i, (topic, key, ts, value) in enumerate(records):
        while True:
            try:
                p.produce(prefix + topic, value=value, key=key.encode(), timestamp=int(ts * 1000),
                          partition=part)
                break
            except BufferError:
                p.poll(0.05)
        if i % 1000 == 0:
            p.poll(0)
    left = p.flush(120)
    if left:
        raise RuntimeError(f"{left} messages not delivered to Kafka")
    return time.monotonic() - t0


# -- the worker ------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def runqueue_wait_s(pid: int) -> float:
    """Seconds the process's threads were ready to run but waiting for a CPU (other load on
    the machine), summed from /proc/<pid>/task/*/schedstat."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


_SAMPLE = re.compile(r'^(\w+)\{([^}]*)\} ([0-9.eE+-]+)$', re.M)


def counter(text: str, name: str) -> dict[str, float]:
    """``{labels: value}`` of one metric family in Prometheus text."""
    return {m.group(2): float(m.group(3)) for m in _SAMPLE.finditer(text) if m.group(1) == name}


def make_worker(services: Services, tmp: Path, *extra: str, partitions: int = 2) -> Any:
    """A real ``aegis worker`` on its own topic prefix, its topics created; not started."""
    from tests.workerutil import WorkerProc

    uid = uuid.uuid4().hex[:10]
    return WorkerProc(services.bootstrap, services.redis_url, uid, tmp / f"worker-{uid}.log",
                      *extra, partitions=partitions)


def events_in(worker: Any, topics: Iterable[str] | None = None) -> float:
    """Messages the worker has consumed on ``topics`` (full names; None: every topic)."""
    by_label = counter(worker.metrics(), "aegis_events_in_total")
    want = None if topics is None else {f'topic="{t}"' for t in topics}
    return sum(v for k, v in by_label.items() if want is None or k in want)


@dataclass
class Drain:
    """One measured stretch of the worker's consumption."""

    messages: int
    wall_s: float
    cpu_s: float
    runq_s: float = 0.0
    broker_cpu_s: float | None = None
    startup_s: float | None = None

    def figures(self, prefix: str = "worker_") -> dict[str, Any]:
        out: dict[str, Any] = {
            f"{prefix}messages": self.messages, f"{prefix}wall_s": round(self.wall_s, 3),
            f"{prefix}cpu_s": round(self.cpu_s, 3),
            f"{prefix}runqueue_wait_s": round(self.runq_s, 3),
            f"{prefix}io_wait_s": round(max(0.0, self.wall_s - self.cpu_s - self.runq_s), 3),
            f"{prefix}msgs_per_s": round(self.messages / self.wall_s, 1) if self.wall_s else None,
            f"{prefix}cpu_us_per_msg": round(self.cpu_s / self.messages * 1e6, 1)
            if self.messages else None}
        if self.broker_cpu_s is not None:
            out["broker_cpu_s"] = round(self.broker_cpu_s, 3)
        if self.startup_s is not None:
            out[f"{prefix}startup_s"] = round(self.startup_s, 2)
        return out


@dataclass
class Mark:
    """The worker's counter and CPU (and the broker's) at one instant."""

    t: float
    n: float
    cpu: float
    broker_cpu: float
    runq: float


def mark(worker: Any, topics: Iterable[str], broker_pid: int | None = None) -> Mark:
    pid = worker.proc.pid
    return Mark(time.monotonic(), events_in(worker, topics), cpu_seconds(pid),
                _cpu_or_zero(broker_pid), runqueue_wait_s(pid))


def wait_drain(worker: Any, topics: Iterable[str], target: float, *, timeout: float,
               broker_pid: int | None = None, start: Mark | None = None) -> Drain:
    """Poll until the worker has counted ``target`` messages on ``topics``.

    Without ``start`` (a worker started on a pre-loaded backlog) the window opens at the
    first poll that sees the counter move, so start-up is not counted; with it (a running
    worker, ``start`` taken just before producing) it opens at ``start``. It closes at the
    first poll that sees ``target``."""
    topics = list(topics)
    t_call = time.monotonic()
    deadline = t_call + timeout
    first = start
    n: float | None = None
    while True:
        if not worker.alive():
            raise RuntimeError(f"worker exited:\n{worker.tail()}")
        try:
            n = events_in(worker, topics)
        except OSError:  # metrics endpoint not up yet
            n = None
        if n is not None:
            if first is None and n > 0:
                first = mark(worker, topics, broker_pid)
            if first is not None and n >= target:
                end = mark(worker, topics, broker_pid)
                return Drain(int(end.n - first.n), end.t - first.t, end.cpu - first.cpu,
                             end.runq - first.runq, end.broker_cpu - first.broker_cpu if broker_pid else None,
                             first.t - t_call if start is None else None)
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker counted {n} of {target} on {topics} in {timeout:.0f}s:\n"
                               f"{worker.tail()}")
        time.sleep(POLL_S)


def _cpu_or_zero(pid: int | None) -> float:
    if pid is None:
        return 0.0
    with contextlib.suppress(OSError):
        return cpu_seconds(pid)
    return 0.0


def sweep(services: Services, worker: Any, sample: dict[str, bytes], partitions: Iterable[int],
          after_wall: float, timeout: float = 60.0) -> float:
    """Make the worker write the final checkpoint of the jobs gone quiet in ``partitions``;
    the worker's CPU seconds for it.

    processors.checkpoints checkpoints a job idle for ``QUIET_WALL_S`` of wall time when the
    next message of its agent and partition arrives, so after waiting that long past
    ``after_wall`` this sends one small record (``sample``, re-keyed to a fresh job) to every
    input topic in those partitions. Called between measured stretches so one stretch's
    final checkpoint is measured on its own and not charged to the next."""
    from confluent_kafka import Producer

    time.sleep(max(0.0, after_wall + QUIET_WALL_S + 0.3 - time.monotonic()))
    tag = uuid.uuid4().hex[:6]
    parts = list(partitions)
    targets = [worker.topic(t) for t in sample]
    before = events_in(worker, targets)
    cpu0 = cpu_seconds(worker.proc.pid)
    p = Producer({"bootstrap.servers": services.bootstrap, "linger.ms": 0})
    for topic, raw in sample.items():
        rec = decode(RECORD_TYPES[topic], raw)
        assert not isinstance(rec, WireError), rec
        for part in parts:
            job = f"sweep-{tag}-{part}"
            new = dataclasses.replace(rec, job=job)
            p.produce(worker.topic(topic), key=job.encode(), value=encode(new), partition=part)
    p.flush(30)
    want = before + len(targets) * len(parts)
    deadline = time.monotonic() + timeout
    while events_in(worker, targets) < want:
        if time.monotonic() > deadline or not worker.alive():
            raise TimeoutError(f"worker did not count the sweep records:\n{worker.tail()}")
        time.sleep(POLL_S)
    time.sleep(0.3)  # the checkpoints are written after the counter moves
    return cpu_seconds(worker.proc.pid) - cpu0


def sweep_sample() -> dict[str, bytes]:
    """One small valid record per input topic (telemetry and CCL of a 2-host simulated job,
    an agent heartbeat), for :func:`sweep` and warm-ups."""
    out = {r[0]: r[3] for r in simulate(2, 1.0, name_prefix="sweep")
           if r[0] in (TELEMETRY.name, CCL.name)}
    out[LOGS.name] = encode(LogRecord("sweep-h", 1.0, "agent", "aegis-agent heartbeat seq=1"))
    return out


# -- reporting -------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(-(-q * len(s) // 100)) - 1))
    return s[k]


def emit(result: dict[str, Any]) -> None:
    """The bench's figures: one JSON object, the last line of stdout."""
    import json

    print(json.dumps(result, sort_keys=False), flush=True)


@contextlib.contextmanager
def workdir(keep: bool = False) -> Iterator[Path]:
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="aegis-bench-"))
    try:
        yield d
    finally:
        if not keep:
            shutil.rmtree(d, ignore_errors=True)
