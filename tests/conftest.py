"""Session fixtures: a live Kafka bootstrap address and a Redis URL, real services only.

If AEGIS_KAFKA_BOOTSTRAP / AEGIS_REDIS_URL are set (``scripts/services run -- pytest``),
those are used; otherwise the session starts its own broker and redis-server on free
loopback ports and stops them at the end. A service that cannot start is an ERROR for
every test that needs it, never a skip.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from localservices import KafkaBroker, RedisServer, free_port  # noqa: E402

_TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="session", autouse=True)
def faust_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Faust apps started by tests (workers, test apps) keep their local folder here,
    not in the repository root (Settings.data_dir; ``{conf.name}`` is the app id)."""
    base = tmp_path_factory.mktemp("faust")
    old = os.environ.get("AEGIS_DATA_DIR")
    os.environ["AEGIS_DATA_DIR"] = str(base / "{conf.name}-data")
    yield base
    if old is None:
        os.environ.pop("AEGIS_DATA_DIR", None)
    else:
        os.environ["AEGIS_DATA_DIR"] = old


@pytest.fixture(scope="session")
def service_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("services")


@pytest.fixture(scope="session")
def kafka_broker(service_tmp: Path) -> Iterator[KafkaBroker | None]:
    """The session's own broker (None when an external one is given by env)."""
    if os.environ.get("AEGIS_KAFKA_BOOTSTRAP"):
        yield None
        return
    broker = KafkaBroker(service_tmp / "kafka")
    broker.start()
    _TIMINGS["kafka_startup_s"] = broker.startup_s
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: KafkaBroker | None) -> str:
    return os.environ.get("AEGIS_KAFKA_BOOTSTRAP") or kafka_broker.bootstrap  # type: ignore[union-attr]


@pytest.fixture(scope="session")
def redis_server(service_tmp: Path) -> Iterator[RedisServer | None]:
    if os.environ.get("AEGIS_REDIS_URL"):
        yield None
        return
    server = RedisServer(service_tmp / "redis")
    server.start()
    _TIMINGS["redis_startup_s"] = server.startup_s
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer | None) -> str:
    return os.environ.get("AEGIS_REDIS_URL") or redis_server.url  # type: ignore[union-attr]


@pytest.fixture
def restartable_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server a test may stop and restart (same port, same data)."""
    server = RedisServer(tmp_path / "redis", port=free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def private_kafka(tmp_path: Path) -> Iterator[KafkaBroker]:
    """A private broker a test may stop and restart (same ports, same log dirs)."""
    broker = KafkaBroker(tmp_path / "kafka")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def uid() -> str:
    """A unique suffix for topic, group and stream names."""
    return uuid.uuid4().hex[:10]


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    if _TIMINGS:
        terminalreporter.write_line(
            "services: " + " ".join(f"{k}={v:.2f}" for k, v in sorted(_TIMINGS.items())))
