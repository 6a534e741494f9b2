"""Start and stop a real ``aegis worker`` subprocess for integration and e2e tests."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

from schemas.topics import ALL
from tests.kafkautil import create_topics, kill, start_python
from tests.services_ports import free_port


class WorkerProc:
    def __init__(self, bootstrap: str, redis_url: str, uid: str, log: Path, *extra: str,
                 partitions: int = 2) -> None:
        self.bootstrap, self.redis_url, self.uid, self.log = bootstrap, redis_url, uid, log
        self.prefix = f"t{uid}-"
        self.cluster = f"c{uid}"
        self.partitions = partitions
        self.metrics_port = free_port()
        self.extra = extra
        self.proc = None
        create_topics(bootstrap, [self.topic(t.name) for t in ALL], partitions=partitions)

    def topic(self, name: str) -> str:
        return self.prefix + name

    def start(self) -> WorkerProc:
        self.proc = start_python(
            "processors.cli", "worker", "--brokers", self.bootstrap, "--redis", self.redis_url,
            "--cluster", self.cluster, "--app-id", f"aegis-{self.uid}", "--topic-prefix",
            self.prefix, "--partitions", str(self.partitions), "--metrics-port",
            str(self.metrics_port), *self.extra, log=self.log)
        return self

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def wait_metric(self, needle: str, timeout: float = 90.0) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.tail()
            try:
                text = self.metrics()
                if needle in text:
                    return text
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"{needle!r} not in metrics after {timeout}s:\n{text}\n{self.tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def stop(self, hard: bool = False) -> None:
        import signal

        if self.proc is not None:
            kill(self.proc, signal.SIGKILL if hard else signal.SIGTERM)
            self.proc = None
