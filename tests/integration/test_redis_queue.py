"""The isolation queue on a real redis-server: idempotency, reclaim, guard, restarts, CLI."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from schemas.codec import decode_or_raise
from schemas.records import Culprits, Diagnosis, IsolationCommand
from sinks.delivery import RetryingSink, RetryPolicy
from sinks.guard import Guard
from sinks.redis_consumer import CommandConsumer
from sinks.redis_queue import RedisCommandQueue, dead_key, seen_key, stream_key
from sinks.remediate import main as remediate

pytestmark = pytest.mark.integration


def cmd(i: int, action: str = "isolate_host", job: str = "j1") -> IsolationCommand:
    target = f"h{i:04d}" if action.startswith("isolate") else job
    did = f"diag{i:04d}"
    return IsolationCommand(id=IsolationCommand.make_id(did, action, target), job=job,
                            action=action, target=target, reason="critical_error: test",
                            diagnosis_id=did, issued_at=1000.0 + i)


def entries(url: str, cluster: str) -> list[IsolationCommand]:
    r: Any = redis.Redis.from_url(url)
    return [decode_or_raise(IsolationCommand, f[b"cmd"]) for _, f in r.xrange(stream_key(cluster))]


def queue(url: str, cluster: str) -> RedisCommandQueue:
    q = RedisCommandQueue(url, cluster=cluster)
    q.setup()
    return q


def test_entry_layout_and_group(redis_url: str, uid: str) -> None:
    q = queue(redis_url, uid)
    c = cmd(1)
    q.add(c)
    q.flush()
    r: Any = redis.Redis.from_url(redis_url)
    ((entry_id, fields),) = r.xrange(stream_key(uid))
    assert fields[b"id"] == c.id.encode() and fields[b"action"] == b"isolate_host"
    assert fields[b"target"] == b"h0001" and fields[b"job"] == b"j1"
    assert decode_or_raise(IsolationCommand, fields[b"cmd"]) == c
    assert r.get(seen_key(uid, c.id)) == entry_id
    assert 0 < r.ttl(seen_key(uid, c.id)) <= q.seen_ttl_s
    assert [g["name"] for g in r.xinfo_groups(stream_key(uid))] == [b"remediation"]


def test_duplicates_enqueue_once_even_across_sink_instances(redis_url: str, uid: str) -> None:
    first = queue(redis_url, uid)
    for c in [cmd(1), cmd(2), cmd(1)]:
        first.add(c)
    first.flush()
    first.add(cmd(2))  # a replay in the same process
    first.flush()
    restarted = queue(redis_url, uid)  # the worker after a crash replays its input
    for c in [cmd(1), cmd(2), cmd(3)]:
        restarted.add(c)
    restarted.flush()
    assert [c.id for c in entries(redis_url, uid)] == [cmd(1).id, cmd(2).id, cmd(3).id]
    assert (first.enqueued, first.duplicates) == (2, 2)
    assert (restarted.enqueued, restarted.duplicates) == (1, 2)
    assert restarted.last_entry_ids[:2] == [None, None]


def test_dead_consumer_entry_is_reclaimed_by_another(redis_url: str, uid: str) -> None:
    q = queue(redis_url, uid)
    q.add(cmd(7))
    q.flush()
    dying = CommandConsumer(redis_url, cluster=uid, consumer="dying")
    dying.setup()
    (got,) = dying.claim()
    assert got.command == cmd(7)
    del dying  # dies without acking

    survivor = CommandConsumer(redis_url, cluster=uid, consumer="survivor", min_idle_ms=60_000)
    survivor.setup()
    assert survivor.claim() == []  # already delivered to the dead consumer
    assert survivor.reclaim() == []  # not idle long enough yet
    (taken,) = survivor.reclaim(min_idle_ms=0)
    assert taken.reclaimed and taken.entry_id == got.entry_id and taken.command == cmd(7)
    assert survivor.deliveries(taken.entry_id) == 2
    assert survivor.ack(taken.entry_id) == 1
    assert survivor.pending_count() == 0


def test_consumer_finishes_its_own_history_after_restart(redis_url: str, uid: str) -> None:
    q = queue(redis_url, uid)
    for i in range(3):
        q.add(cmd(i))
    q.flush()
    before = CommandConsumer(redis_url, cluster=uid, consumer="same-name", count=2)
    before.setup()
    assert len(before.claim()) == 2
    after = CommandConsumer(redis_url, cluster=uid, consumer="same-name", count=2)
    assert [d.command for d in after.history()] == [cmd(0), cmd(1)]
    assert [d.command for d in after.claim()] == [cmd(2)]


def _mass(job: str, n: int, ts: float = 5000.0) -> list[Diagnosis]:
    return [Diagnosis(id=f"{job}-d{i}", job=job, kind="critical_error",
                      culprits=Culprits((f"h{i:04d}",)),
                      evidence={"rule": "xid79", "actions": [["isolate_host", f"h{i:04d}"],
                                                             ["restart_job", job]]},
                      confidence=0.95, event_ts=ts + i, detected_ts=ts + i + 1,
                      detector="logs") for i in range(n)]


def test_guard_refuses_mass_isolation_and_queues_one_rollback(redis_url: str, uid: str) -> None:
    job = f"job-{uid}"
    guard = Guard(job_hosts=lambda j: 16)  # cap = max(2, 10% of 16) = 2
    q = queue(redis_url, uid)
    raised: list[Diagnosis] = []
    refused = 0
    for d in _mass(job, 8):
        out = guard.decide(d)
        raised += out.diagnoses
        refused += len(out.refusals)
        for c in out.commands:
            q.add(c)
    q.flush()
    queued = entries(redis_url, uid)
    assert sorted(c.action for c in queued) == ["isolate_host", "isolate_host",
                                                 "restart_job", "restart_job", "rollback_update"]
    (systemic,) = raised
    assert systemic.kind == "systemic" and systemic.job == job
    rollback = next(c for c in queued if c.action == "rollback_update")
    assert rollback.target == job and rollback.diagnosis_id == systemic.id
    assert refused == 12  # 6 diagnoses x (isolate_host + restart_job)


def test_redis_restart_mid_stream_delays_but_loses_and_duplicates_nothing(
        restartable_redis, uid: str) -> None:
    url = restartable_redis.url
    inner = RedisCommandQueue(url, cluster=uid)
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # Redis comes back after the third failed attempt
        slept.append(seconds)
        if len(slept) == 3:
            restartable_redis.start()

    sink = RetryingSink(inner, RetryPolicy(base_s=0.05, cap_s=0.2), sleep=sleep,
                        rng=random.Random(7))
    sink.setup()
    for i in range(5):
        sink.add(cmd(i))
    sink.flush()
    for i in range(5, 12):
        sink.add(cmd(i))
    restartable_redis.stop()
    sink.add(cmd(3))  # a duplicate queued while Redis is down
    sink.flush()
    assert len(slept) == 3 and sink.retries == 3 and inner.pending == 0
    assert all(0 < s <= 0.2 for s in slept)
    assert [c.id for c in entries(url, uid)] == [cmd(i).id for i in range(12)]

    restartable_redis.restart()  # the data survives (AOF); a replaying worker adds nothing
    again = RedisCommandQueue(url, cluster=uid)
    again.setup()
    for i in range(12):
        again.add(cmd(i))
    again.flush()
    assert again.enqueued == 0 and len(entries(url, uid)) == 12


HOOK = """import json, os, sys
cmd = json.load(sys.stdin)
with open(sys.argv[1], "a") as fh:
    fh.write(f"{cmd['id']} {sys.argv[2]} {sys.argv[3]} {os.environ['AEGIS_CMD_JOB']}\\n")
sys.exit(1 if sys.argv[3] == "h0002" else 0)
"""


def test_remediate_once_acts_acks_and_leaves_failures(redis_url: str, uid: str,
                                                      tmp_path: Path, capsys) -> None:
    hook, log = tmp_path / "hook.py", tmp_path / "acted.log"
    hook.write_text(HOOK)
    q = queue(redis_url, uid)
    for i in range(4):
        q.add(cmd(i))
    q.add(cmd(9, action="restart_job"))
    q.flush()
    r: Any = redis.Redis.from_url(redis_url)
    r.xadd(stream_key(uid), {"cmd": b"not json", "id": b"junk"})
    base = ["--redis", redis_url, "--cluster", uid, "--consumer", "c1", "--once"]

    assert remediate([*base, "--dry-run"]) == 0
    assert "would" in capsys.readouterr().out
    assert not log.exists()  # the dry run claimed nothing

    rc = remediate([*base, "--hook-cmd", f"{sys.executable} {hook} {log} {{action}} {{target}}"])
    assert rc == 1  # h0002's hook failed
    lines = log.read_text().splitlines()
    assert len(lines) == 5 and f"{cmd(9, 'restart_job').id} restart_job j1 j1" in lines
    out = capsys.readouterr().out
    assert "FAIL" in out and "dead" in out
    consumer = CommandConsumer(redis_url, cluster=uid, consumer="probe")
    assert consumer.pending_count() == 1  # only h0002, left for retry
    (dead_id, dead) = r.xrange(dead_key(uid))[0]
    assert dead[b"id"] == b"junk" and b"undecodable" in dead[b"reason"]


def test_remediate_gives_up_after_max_deliveries(redis_url: str, uid: str, tmp_path: Path
                                                 ) -> None:
    q = queue(redis_url, uid)
    q.add(cmd(1))
    q.flush()
    base = ["--redis", redis_url, "--cluster", uid, "--once", "--min-idle-ms", "0",
            "--max-deliveries", "2", "--hook-cmd", "false"]
    assert remediate([*base, "--consumer", "a"]) == 1
    assert remediate([*base, "--consumer", "b"]) == 1  # reclaimed, fails again
    assert remediate([*base, "--consumer", "c"]) == 0  # third delivery: buried
    r: Any = redis.Redis.from_url(redis_url)
    assert r.xlen(dead_key(uid)) == 1
    assert CommandConsumer(redis_url, cluster=uid).pending_count() == 0


def test_remediate_unreachable_redis_exits_3(capsys) -> None:
    from localservices import free_port  # scripts/, put on sys.path by conftest

    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    assert remediate(["--redis", url, "--once", "--dry-run"]) == 3
    err = capsys.readouterr().err
    assert "unreachable" in err and "hunter2" not in err and "***" in err


def test_password_auth_works_and_is_never_printed(restartable_redis, uid: str, capsys) -> None:
    from sinks.redis_queue import RedisOptions

    url = restartable_redis.url
    redis.Redis.from_url(url).config_set("requirepass", "s3cret-pw")
    q = RedisCommandQueue(RedisOptions(url, password="s3cret-pw"), cluster=uid)
    q.setup()
    q.add(cmd(1))
    q.flush()
    assert q.enqueued == 1 and "s3cret" not in repr(q)
    wrong = url.replace("redis://", "redis://:wrong-pw@")
    assert remediate(["--redis", wrong, "--cluster", uid, "--once", "--hook-cmd", "true"]) == 2
    err = capsys.readouterr().err
    assert "authentication" in err.lower() and "wrong-pw" not in err
    ok = url.replace("redis://", "redis://:s3cret-pw@")
    assert remediate(["--redis", ok, "--cluster", uid, "--once", "--hook-cmd", "true"]) == 0
    assert "s3cret" not in capsys.readouterr().out
