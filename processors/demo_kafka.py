"""``aegis demo --kafka``: the demo through the real stack — the simulator publishes to
Kafka, an ``aegis worker`` subprocess diagnoses, the guard writes commands to Redis — then
the diagnoses are read back from their topic and the commands from the Redis stream.

Services: AEGIS_KAFKA_BOOTSTRAP and AEGIS_REDIS_URL when set; otherwise, from a source
checkout, a local Kafka broker and redis-server are started with scripts/localservices.py
(and stopped at the end).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from schemas.codec import decode
from schemas.errors import ServiceUnavailable
from schemas.inventory import Inventory
from schemas.records import Diagnosis, IsolationCommand
from schemas.topics import ALL

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def services() -> Iterator[tuple[str, str]]:
    kafka, redis_url = os.environ.get("AEGIS_KAFKA_BOOTSTRAP"), os.environ.get("AEGIS_REDIS_URL")
    if kafka and redis_url:
        yield kafka, redis_url
        return
    helper = ROOT / "scripts" / "localservices.py"
    if not helper.exists():
        raise ServiceUnavailable("set AEGIS_KAFKA_BOOTSTRAP and AEGIS_REDIS_URL (or run from a "
                                 "source checkout, which starts local services)")
    sys.path.insert(0, str(helper.parent))
    from localservices import LocalStack

    print("demo: starting local Kafka and Redis...", file=sys.stderr, flush=True)
    with LocalStack.start() as stack:
        yield stack.kafka.bootstrap, stack.redis.url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _events_in(port: int, topic: str) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(f'aegis_events_in_total{{topic="{topic}"}}'):
                    return float(line.rsplit(" ", 1)[1])
    except OSError:
        pass
    return 0.0


def run_through_kafka(a: argparse.Namespace) -> tuple[Any, list[Diagnosis], list[IsolationCommand]]:
    import redis
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient, NewTopic

    from processors.demo import sim_config
    from producers.sim.kafka_out import KafkaSimSink
    from producers.sim.simulation import Simulation
    from sinks.redis_queue import stream_key

    sim = Simulation(sim_config(a))
    uid = uuid.uuid4().hex[:8]
    prefix, cluster = f"demo{uid}-", f"demo{uid}"
    with services() as (bootstrap, redis_url), tempfile.TemporaryDirectory() as tmp:
        inv = Path(tmp) / "inventory.json"
        inv.write_bytes(Inventory().merge(sim.inventory).dumps())
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for f in admin.create_topics([NewTopic(prefix + t.name, 4, 1) for t in ALL]).values():
            f.result(timeout=30)
        port = _free_port()
        log = open(Path(tmp) / "worker.log", "wb")  # noqa: SIM115
        worker = subprocess.Popen(
            [sys.executable, "-m", "processors.cli", "worker", "--brokers", bootstrap, "--redis",
             redis_url, "--cluster", cluster, "--app-id", f"aegis-{uid}", "--topic-prefix", prefix,
             "--partitions", "4", "--metrics-port", str(port), "--policy", a.policy,
             "--inventory", str(inv)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            sink = KafkaSimSink(bootstrap, prefix)
            counts: dict[str, int] = {}
            for topic, key, ts, value in sim.iter_encoded():
                sink.emit_encoded(topic, key, ts, value)
                counts[topic] = counts.get(topic, 0) + 1
            sink.flush()
            print(f"demo: {sum(counts.values())} records published; waiting for the worker...",
                  file=sys.stderr, flush=True)
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline:
                if worker.poll() is not None:
                    raise RuntimeError(f"worker exited with {worker.returncode}; see its log")
                if all(_events_in(port, prefix + t) >= n for t, n in counts.items()):
                    break
                time.sleep(1)
            else:
                raise TimeoutError("the worker did not read every record within 15 minutes")
            time.sleep(15)  # guard agent and Redis catch up
            c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"demo-{uid}",
                          "auto.offset.reset": "earliest", "enable.auto.commit": False})
            c.subscribe([prefix + "aegis.diagnoses"])
            diagnoses: list[Diagnosis] = []
            idle = time.monotonic()
            while time.monotonic() - idle < 5:
                m = c.poll(0.5)
                if m is not None and not m.error():
                    d = decode(Diagnosis, m.value() or b"")
                    if isinstance(d, Diagnosis):
                        diagnoses.append(d)
                    idle = time.monotonic()
            c.close()
            r = redis.Redis.from_url(redis_url)
            entries: Any = r.xrange(stream_key(cluster))
            commands = [cmd for _, f in entries
                        if isinstance(cmd := decode(IsolationCommand, f[b"cmd"]), IsolationCommand)]
            return sim, diagnoses, commands
        finally:
            worker.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(timeout=30)
            if worker.poll() is None:
                worker.kill()
            log.close()
