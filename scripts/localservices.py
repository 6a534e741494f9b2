"""Real Apache Kafka (KRaft, from Maven Central jars) and Debian's redis-server on loopback,
for tests, benchmarks and `aegis demo --kafka`. No Docker.

    with LocalStack.start() as stack:
        stack.kafka.bootstrap   # "127.0.0.1:39092"
        stack.redis.url         # "redis://127.0.0.1:36379/0"

Kafka 3.9.1 jars are fetched once with Maven into ``.cache/kafka-3.9.1`` (see
docs/services.md). Ports are free non-default loopback ports; data goes under a temporary
folder that is removed on stop. Each service records how long it took to answer.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KAFKA_VERSION = "3.9.1"
JARS = ROOT / ".cache" / f"kafka-{KAFKA_VERSION}"
POM = ROOT / "scripts" / "kafka" / "pom.xml"


class ServiceError(RuntimeError):
    """A service could not be installed, started or reached."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log(msg: str) -> None:
    print(f"[services] {msg}", file=sys.stderr, flush=True)


def ensure_kafka_jars() -> Path:
    """Fetch the broker's jars from Maven Central unless the cache is complete."""
    marker = JARS / ".complete"
    if marker.exists():
        return JARS
    if not shutil.which("mvn"):
        raise ServiceError("Maven (mvn) is needed to fetch the Kafka jars: apt-get install maven")
    if not shutil.which("java"):
        raise ServiceError("Java 11+ is needed to run Kafka: apt-get install openjdk-17-jre-headless")
    log(f"fetching Kafka {KAFKA_VERSION} jars from Maven Central into {JARS}")
    t0 = time.monotonic()
    JARS.mkdir(parents=True, exist_ok=True)
    cmd = ["mvn", "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
           "-DincludeScope=runtime", f"-DoutputDirectory={JARS}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise ServiceError(f"mvn failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    if not any(JARS.glob("kafka_2.13-*.jar")):
        raise ServiceError(f"mvn ran but no kafka_2.13 jar is in {JARS}")
    marker.write_text(KAFKA_VERSION)
    log(f"jars fetched in {time.monotonic() - t0:.1f}s")
    return JARS


def ensure_redis_server() -> str:
    """Path of redis-server, installing Debian's package when it is missing (needs root)."""
    path = shutil.which("redis-server")
    if path:
        return path
    if os.geteuid() != 0:
        raise ServiceError("redis-server is missing; install it: sudo apt-get install redis-server")
    log("installing redis-server with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "redis-server"]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise ServiceError(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    path = shutil.which("redis-server")
    if not path:
        raise ServiceError("apt-get installed redis-server but it is not on PATH")
    # Debian starts a system instance on 6379; ours never uses that port.
    return path


def _wait(what: str, ok, timeout: float, proc: subprocess.Popen | None, logfile: Path | None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = logfile.read_text(errors="replace")[-4000:] if logfile else ""
            raise ServiceError(f"{what} exited with {proc.returncode} while starting:\n{tail}")
        with contextlib.suppress(Exception):
            if ok():
                return
        time.sleep(0.1)
    tail = logfile.read_text(errors="replace")[-4000:] if logfile else ""
    raise ServiceError(f"{what} did not answer within {timeout:.0f}s:\n{tail}")


@dataclass
class KafkaBroker:
    """One combined broker+controller in KRaft mode on 127.0.0.1."""

    workdir: Path
    port: int = field(default_factory=free_port)
    controller_port: int = field(default_factory=free_port)
    heap_mb: int = 512
    proc: subprocess.Popen | None = None
    startup_s: float = 0.0
    _formatted: bool = False

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _write_config(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "log4j.properties").write_text(
            "log4j.rootLogger=WARN, stdout\n"
            "log4j.appender.stdout=org.apache.log4j.ConsoleAppender\n"
            "log4j.appender.stdout.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
            "log4j.logger.kafka.server.KafkaRaftServer=INFO\n"
            "log4j.logger.kafka.server.BrokerServer=INFO\n")
        props = self.workdir / "server.properties"
        props.write_text("\n".join([
            "process.roles=broker,controller", "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER", "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "offsets.topic.replication.factor=1", "offsets.topic.num.partitions=4",
            "transaction.state.log.replication.factor=1", "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=4",
            "group.initial.rebalance.delay.ms=0", "num.partitions=1",
            "auto.create.topics.enable=true",
            "log.cleaner.dedupe.buffer.size=8388608", "log.cleaner.threads=1",
            f"log.dirs={self.workdir / 'data'}", "num.network.threads=2", "num.io.threads=4",
            "log.segment.bytes=67108864",
            # Our records carry event time as their Kafka timestamp, and simulated runs are
            # dated in the past: time-based retention would delete them at once.
            "log.retention.ms=-1", "log.retention.bytes=-1", "",
        ]))
        return props

    def start(self, timeout: float = 90.0) -> KafkaBroker:
        jars = ensure_kafka_jars()
        props = self._write_config()
        cp = f"{jars}/*"
        java = shutil.which("java") or "java"
        if not self._formatted:
            cluster_id = "a" + uuid.uuid4().hex[:21]
            r = subprocess.run([java, "-cp", cp, "kafka.tools.StorageTool", "format", "-t",
                                cluster_id, "-c", str(props), "--ignore-formatted"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise ServiceError(f"kafka storage format failed:\n{r.stdout}\n{r.stderr}")
            self._formatted = True
        logfile = self.workdir / "broker.log"
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [java, f"-Xms{self.heap_mb // 2}m", f"-Xmx{self.heap_mb}m", "-XX:+UseSerialGC",
             "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
             f"-Dlog4j.configuration=file:{self.workdir / 'log4j.properties'}",
             "-cp", cp, "kafka.Kafka", str(props)],
            stdout=logfile.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)

        def ready() -> bool:
            text = logfile.read_text(errors="replace")
            return "Kafka Server started" in text and self._metadata_ok()

        _wait(f"Kafka broker on {self.bootstrap}", ready, timeout, self.proc, logfile)
        self.startup_s = time.monotonic() - t0
        return self

    def _metadata_ok(self) -> bool:
        from confluent_kafka.admin import AdminClient

        md = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
        return bool(md.brokers)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None


@dataclass
class RedisServer:
    workdir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    startup_s: float = 0.0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 20.0) -> RedisServer:
        binary = ensure_redis_server()
        self.workdir.mkdir(parents=True, exist_ok=True)
        logfile = self.workdir / "redis.log"
        t0 = time.monotonic()
        # appendonly so a restart keeps the stream, as a production Redis would.
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
             "--save", "", "--appendonly", "yes", "--appendfsync", "always",
             "--daemonize", "no", "--protected-mode", "yes"],
            stdout=logfile.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)

        def ready() -> bool:
            import redis

            return bool(redis.Redis.from_url(self.url, socket_timeout=1).ping())

        _wait(f"redis-server on 127.0.0.1:{self.port}", ready, timeout, self.proc, logfile)
        self.startup_s = time.monotonic() - t0
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@dataclass
class LocalStack:
    kafka: KafkaBroker
    redis: RedisServer
    tmp: Path

    @classmethod
    def start(cls, kafka: bool = True, redis: bool = True) -> LocalStack:
        tmp = Path(tempfile.mkdtemp(prefix="aegis-services-"))
        stack = cls(KafkaBroker(tmp / "kafka"), RedisServer(tmp / "redis"), tmp)
        try:
            if redis:
                stack.redis.start()
                log(f"redis {stack.redis.url} answered in {stack.redis.startup_s:.2f}s")
            if kafka:
                stack.kafka.start()
                log(f"kafka {stack.kafka.bootstrap} answered in {stack.kafka.startup_s:.2f}s")
        except BaseException:
            stack.stop()
            raise
        return stack

    def stop(self) -> None:
        self.kafka.stop()
        self.redis.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> LocalStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
