"""The session's real redis-server answers and keeps a stream."""

from __future__ import annotations

import pytest
import redis

pytestmark = pytest.mark.integration


def test_real_redis_stream(redis_url: str, uid: str) -> None:
    r = redis.Redis.from_url(redis_url)
    assert r.ping()
    key = f"smoke:{uid}"
    r.xadd(key, {"a": "1"})
    assert r.xlen(key) == 1
    assert r.info("server")["redis_version"]
