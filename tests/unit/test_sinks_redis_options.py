"""Redis options and key layout (no server needed): secrets masked, TLS checked, keys tagged."""

from __future__ import annotations

import pytest
import redis

from schemas.errors import ConfigError, ServiceUnavailable
from schemas.records import IsolationCommand
from sinks.redis_queue import (
    RedisCommandQueue,
    RedisOptions,
    command_fields,
    dead_key,
    mask_url,
    seen_key,
    stream_key,
    unavailable_as,
)


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
    ("rediss://user:s3cret@h/1", "rediss://user:***@h/1"),
    ("redis://h:6379/0", "redis://h:6379/0"),
])
def test_mask_url(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_password_never_in_repr() -> None:
    o = RedisOptions("redis://:inurl@h:1/0", password="hunter2")
    for text in (repr(o), str(o), repr(RedisCommandQueue(o))):
        assert "hunter2" not in text and "inurl" not in text


def test_tls_options_need_rediss() -> None:
    with pytest.raises(ConfigError, match="rediss"):
        RedisOptions("redis://h:1/0", tls_ca="/ca.pem")
    with pytest.raises(ConfigError):
        RedisOptions("http://h:1/0")


def test_rediss_builds_an_ssl_client() -> None:
    c = RedisOptions("rediss://h:6380/0", tls_ca="/etc/ssl/ca.pem").connect()
    pool = c.connection_pool
    assert pool.connection_class is redis.SSLConnection
    assert pool.connection_kwargs["ssl_ca_certs"] == "/etc/ssl/ca.pem"


def test_keys_share_a_cluster_hash_tag() -> None:
    assert stream_key("prod") == "aegis:{prod}:commands"
    assert seen_key("prod", "d:isolate_host:h1") == "aegis:{prod}:seen:d:isolate_host:h1"
    assert dead_key("prod") == "aegis:{prod}:commands:dead"


@pytest.mark.parametrize("cluster", ["", "a{b", "a:b", "a b"])
def test_bad_cluster_names(cluster: str) -> None:
    with pytest.raises(ConfigError):
        RedisCommandQueue("redis://h:1/0", cluster=cluster)


def test_stream_fields() -> None:
    c = IsolationCommand(id="d:isolate_gpu:h1/gpu3", job="j", action="isolate_gpu",
                         target="h1/gpu3", reason="r", diagnosis_id="d", issued_at=1.0)
    f = command_fields(c)
    assert set(f) == {"cmd", "id", "action", "target", "job"} and f["target"] == b"h1/gpu3"


@pytest.mark.parametrize(("exc", "mapped"), [
    (redis.ConnectionError("refused"), ServiceUnavailable),
    (redis.TimeoutError("slow"), ServiceUnavailable),
    (redis.exceptions.BusyLoadingError("LOADING"), ServiceUnavailable),
    (redis.ResponseError("READONLY You can't write against a read only replica"),
     ServiceUnavailable),
    (redis.AuthenticationError("invalid password"), ConfigError),
    (redis.ResponseError("WRONGTYPE"), redis.ResponseError),
])
def test_error_mapping(exc: Exception, mapped: type) -> None:
    with pytest.raises(mapped), unavailable_as("redis://h", "step"):
        raise exc
