"""Small confluent-kafka helpers for integration tests (real broker only)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parent.parent


def create_topics(bootstrap: str, names: Iterable[str], partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futs = admin.create_topics([NewTopic(n, num_partitions=partitions, replication_factor=1)
                                for n in names])
    for _, f in futs.items():
        try:
            f.result(timeout=30)
        except Exception as e:  # already exists is fine
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise


def produce(bootstrap: str, topic: str, items: Iterable[tuple[bytes | None, bytes]]) -> int:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    n = 0
    for key, value in items:
        while True:
            try:
                p.produce(topic, key=key, value=value)
                break
            except BufferError:
                p.poll(0.1)
        n += 1
        p.poll(0)
    left = p.flush(30)
    assert left == 0, f"{left} messages not delivered to {topic}"
    return n


def consume(bootstrap: str, topic: str, *, until: Callable[[list], bool] | None = None,
            timeout: float = 30.0, group: str | None = None) -> list:
    """Read ``topic`` from the beginning until ``until(messages)`` or ``timeout``."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group or f"t-{time.time_ns()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    out: list = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None or m.error():
                if until is not None and until(out):
                    break
                continue
            out.append(m)
            if until is not None and until(out):
                break
    finally:
        c.close()
    return out


def start_python(module: str, *args: str, env: dict | None = None, log: Path | None = None
                 ) -> subprocess.Popen:
    """Start ``python -m module args`` from the repo root, in its own process group."""
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT,
                            env={**os.environ, **(env or {})}, stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)


def kill(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=30)
