"""``aegis agent``: run the host agent (NVML, sysfs RDMA, /proc, kernel and training logs,
the CCL socket) and publish to Kafka through the local spool. ``--once`` samples twice,
``--interval`` apart, prints what it collected as JSON and exits 0; it needs no broker.

Progress and problems go to stderr; SIGTERM/SIGINT flush what Kafka will take within
``--drain-s`` and leave the rest in the spool for the next start. See docs/agent.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import tempfile
import time
from typing import Any

import orjson

from producers.agent.agent import Agent
from producers.agent.collector import Collector, Notices
from producers.agent.host import HostCollector
from producers.agent.jobs import EnvJob, FileJob, FixedJob, JobSource
from producers.agent.logtail import DEFAULT_PREFILTER, LogTailer, open_kernel_log
from producers.agent.nvml import NvmlCollector
from producers.agent.publisher import NullProducer, ProducerLike, SpoolingPublisher, kafka_producer
from producers.agent.rdma import RdmaCollector
from producers.agent.simgpu import SimulatedGpuCollector
from producers.agent.spool import Spool

DEFAULT_CCL_SOCKET = "/run/aegis/ccl.sock"  # ccl_receiver.DEFAULT_SOCKET, the plugin's default


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="aegis agent", description=__doc__.split("\n\n")[0])
    p.add_argument("--brokers", default=os.environ.get("AEGIS_KAFKA_BOOTSTRAP", "localhost:9092"),
                   help="Kafka bootstrap servers (env AEGIS_KAFKA_BOOTSTRAP)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    p.add_argument("--host", default=os.environ.get("AEGIS_HOST") or socket.gethostname(),
                   help="host name in records (env AEGIS_HOST; in Kubernetes pass the node name)")
    job = p.add_mutually_exclusive_group()
    job.add_argument("--job-env", metavar="VAR", help="read the job id from this env var "
                     "(default AEGIS_JOB_ID)")
    job.add_argument("--job-file", metavar="F", help="read the job id from a file the scheduler writes")
    job.add_argument("--job", metavar="J", help="a fixed job id")
    p.add_argument("--sysfs-root", default="/sys")
    p.add_argument("--proc-root", default="/proc")
    p.add_argument("--nics", help="rail NICs in order, e.g. mlx5_0,mlx5_1 (default: all, natural order)")
    p.add_argument("--kmsg", metavar="PATH", help="kernel log: /dev/kmsg or a text file "
                   "(default: /dev/kmsg, else kern.log/messages, else journalctl)")
    p.add_argument("--no-kernel-log", action="store_true")
    p.add_argument("--log", metavar="FILE", action="append", default=[],
                   help="a training log file to follow (repeatable)")
    p.add_argument("--log-filter", default=DEFAULT_PREFILTER,
                   help="regex a log line must match to be sent ('' sends every line)")
    p.add_argument("--ccl-socket", metavar="PATH", default=os.environ.get("AEGIS_CCL_SOCKET"),
                   help=f"the CCL hooks' datagram socket (env AEGIS_CCL_SOCKET; default "
                   f"{DEFAULT_CCL_SOCKET}, not opened by --once unless given)")
    p.add_argument("--no-ccl", action="store_true", help="do not open the CCL socket")
    p.add_argument("--spool-dir", default="/var/lib/aegis-agent/spool")
    p.add_argument("--spool-max-mb", type=float, default=256.0)
    p.add_argument("--spool-policy", choices=("oldest", "newest"), default="oldest",
                   help="what a full spool drops")
    p.add_argument("--heartbeat", type=float, default=5.0, help="seconds between heartbeats")
    p.add_argument("--gpu-peak-tflops", type=float, help="peak for the tensor-throughput estimate")
    p.add_argument("--sim-gpus", type=int, default=0, metavar="N",
                   help="simulate N GPUs instead of NVML (bench, machines without GPUs)")
    p.add_argument("--sink", choices=("kafka", "null"), default="kafka",
                   help="null: spool and discard (benchmarks)")
    p.add_argument("--once", action="store_true", help="sample twice, print JSON, exit")
    p.add_argument("--duration", type=float, default=0.0, help="exit after this many seconds")
    p.add_argument("--drain-s", type=float, default=5.0, help="flush time allowed at shutdown")
    p.add_argument("--status-every", type=float, default=60.0, help="seconds between status lines")
    a = p.parse_args(argv)
    if a.interval <= 0 or a.heartbeat <= 0:
        p.error("--interval and --heartbeat must be positive")
    return a


def job_source(a: argparse.Namespace) -> JobSource:
    if a.job_file:
        return FileJob(a.job_file)
    if a.job is not None:
        return FixedJob(a.job)
    return EnvJob(a.job_env or "AEGIS_JOB_ID")


def open_ccl(path: str | None, host: str, job: JobSource, notices: Notices) -> Any:
    if not path:
        return None
    try:
        from producers.agent.ccl_receiver import CCLReceiver
    except ImportError as e:
        notices.once("ccl:none", f"CCL receiver not available: {e}")
        return None
    try:
        return CCLReceiver(path, host, job.current)
    except Exception as e:
        notices.once("ccl:open", f"CCL receiver not available on {path}: {type(e).__name__}: {e}")
        return None


def open_spool(a: argparse.Namespace, notices: Notices) -> Spool:
    kw: dict[str, Any] = {"max_bytes": int(a.spool_max_mb * (1 << 20)), "policy": a.spool_policy}
    try:
        return Spool(a.spool_dir, **kw)
    except OSError as e:
        fallback = os.path.join(tempfile.gettempdir(), f"aegis-agent-spool-{os.getuid()}")
        notices.once("spool:dir", f"spool dir {a.spool_dir} unusable ({e.strerror}); using {fallback}")
        return Spool(fallback, **kw)


def build(a: argparse.Namespace, notices: Notices, with_publisher: bool) -> tuple[Agent, Any]:
    job = job_source(a)
    gpu: Any = (SimulatedGpuCollector(a.host, a.sim_gpus) if a.sim_gpus > 0
                else NvmlCollector(a.host, notices, peak_tflops=a.gpu_peak_tflops))
    rdma = RdmaCollector(a.host, a.sysfs_root, notices, a.nics.split(",") if a.nics else None)
    collectors: list[Collector] = [gpu, rdma, HostCollector(a.host, a.proc_root, notices)]
    kernel = None if a.no_kernel_log else open_kernel_log(a.kmsg, notices)
    logs = LogTailer(kernel, a.log, a.log_filter or None, notices)
    publisher = None
    if with_publisher:
        def factory() -> ProducerLike:
            if a.sink == "null":
                return NullProducer()
            return kafka_producer(a.brokers, f"aegis-agent-{a.host}", notices)

        publisher = SpoolingPublisher(factory(), open_spool(a, notices), notices=notices,
                                      factory=factory)
    path = None if a.no_ccl else (a.ccl_socket or (None if a.once else DEFAULT_CCL_SOCKET))
    ccl = open_ccl(path, a.host, job, notices)
    agent = Agent(a.host, job, collectors, logs, ccl, publisher, notices, a.interval, a.heartbeat)
    return agent, (gpu, rdma)


def run_once(a: argparse.Namespace) -> int:
    notices = Notices()
    agent, (gpu, rdma) = build(a, notices, with_publisher=False)
    try:
        first = agent.step(time.time())
        time.sleep(a.interval)
        second = agent.step(time.time())
        batch = agent.last_batch
        logs = [r.to_wire() for r in [*first, *second] if r.__class__.__name__ == "LogRecord"]
        ccl = [r.to_wire() for r in second if r.__class__.__name__ == "CCLRecord"]
        out = {"host": a.host, "job": agent.job.current(),
               "telemetry": batch.to_wire() if batch else None,
               "extras": agent.last_extras, "logs": logs, "ccl": ccl,
               "inventory": {"gpus": gpu.inventory() if hasattr(gpu, "inventory") else [],
                             "nics": rdma.nic_names(), "nic_bus_ids": rdma.nic_bus_ids()},
               "notices": notices.history}
        sys.stdout.buffer.write(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")
        sys.stdout.flush()
    finally:
        agent.close()
    return 0


def run(a: argparse.Namespace) -> int:
    notices = Notices()
    stop: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        stop.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent, _ = build(a, notices, with_publisher=True)
    pub = agent.publisher
    assert pub is not None
    say(f"started: host={a.host} job={agent.job.current()} ({agent.job.describe()}) "
        f"sink={a.sink} brokers={a.brokers} interval={a.interval}s spool={pub.spool.dir} "
        f"({pub.spool.pending()} records waiting)")
    t0 = time.monotonic()
    next_status = t0 + a.status_every
    try:
        while not stop:
            agent.step(time.time())
            mono = time.monotonic()
            if mono >= next_status:
                next_status = mono + a.status_every
                say("status " + orjson.dumps(agent.status()).decode())
            if a.duration and mono - t0 >= a.duration:
                break
            backlog = pub.spool.pending() > len(pub.inflight)
            wait = 0.02 if backlog else min(0.25, a.interval / 4)
            before = time.monotonic()
            pub.pump(wait)
            rest = wait - (time.monotonic() - before)
            if rest > 0.002 and not stop:
                time.sleep(rest)
    finally:
        why = f"signal {stop[0]}" if stop else "end of run"
        ok = pub.close(a.drain_s)
        agent.close()
        say(f"stopped ({why}): " + ("everything delivered" if ok else
            f"{pub.spool.pending()} records left in the spool for the next start")
            + " status " + orjson.dumps(agent.status()).decode())
    return 0


def say(message: str) -> None:
    print(f"aegis-agent: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    return run_once(a) if a.once else run(a)


if __name__ == "__main__":
    sys.exit(main())
