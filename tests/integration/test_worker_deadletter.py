"""Garbage bytes on an input topic land on the dead-letter topic with the reason; the
worker keeps running, and the count is exposed on /metrics."""

from __future__ import annotations

import base64

import orjson
import pytest

from schemas import LogRecord, encode
from tests.kafkautil import consume, produce
from tests.workerutil import WorkerProc

pytestmark = pytest.mark.integration


def test_garbage_goes_to_dead_letter_and_worker_survives(kafka_bootstrap, redis_url, uid, tmp_path):
    w = WorkerProc(kafka_bootstrap, redis_url, uid, tmp_path / "worker.log").start()
    try:
        garbage = [b"\x00\xffnot msgpack", b"\x93\x01\x02\x03", encode(LogRecord("h1", 5.0, "kernel", "x"))[:-3]]
        good = encode(LogRecord("h0001", 1700000000.0, "training", "step 1 loss 2.0", "job-a"))
        produce(kafka_bootstrap, w.topic("aegis.logs"),
                [(b"job-a", g) for g in garbage] + [(b"job-a", good)])
        msgs = consume(kafka_bootstrap, w.topic("aegis.deadletter"), timeout=90,
                       until=lambda ms: len(ms) >= len(garbage))
        assert len(msgs) == len(garbage), w.tail()
        letters = [orjson.loads(m.value()) for m in msgs]
        assert sorted(base64.b64decode(d["raw_b64"]) for d in letters) == sorted(garbage)
        for d in letters:
            assert d["topic"] == w.topic("aegis.logs") and d["offset"] >= 0
            assert d["error"] and "LogRecord" in d["error"]
        logs = w.topic("aegis.logs")
        text = w.wait_metric(f'aegis_events_in_total{{topic="{logs}"}} 4.0')
        assert f'aegis_dead_letters_total{{reason="decode",topic="{logs}"}} 3.0' in text
        assert w.alive(), w.tail()
    finally:
        w.stop()
