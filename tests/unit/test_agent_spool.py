"""The on-disk spool (order, bounds, counted drops, crash-safe reopen) and the publisher's
use of it (window, acknowledgement, failures going back to the spool, in order)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from producers.agent.publisher import NullProducer, SpoolingPublisher
from producers.agent.spool import Spool


def values(entries: list[Any]) -> list[bytes]:
    return [e.value for e in entries]


def fill(s: Spool, n: int, start: int = 0, size: int = 0) -> None:
    for i in range(start, start + n):
        s.append("t", b"k", str(i).encode().ljust(size, b"."))


def test_fifo_order_and_ack(tmp_path: Path) -> None:
    s = Spool(tmp_path, segment_bytes=4096)
    fill(s, 1000)
    got = s.read(300) + s.read(10_000)
    assert [int(v) for v in values(got)] == list(range(1000))
    assert [e.seq for e in got] == list(range(1000))
    assert got[0].topic == "t" and got[0].key == b"k"
    assert len(s.segments) >= 5
    s.ack_until(990)
    assert s.pending() == 10 and len(s.segments) <= 2  # acknowledged segments are deleted
    s.rewind(0)  # never before the acknowledged floor
    assert [int(v) for v in values(s.read(100))] == list(range(990, 1000))


def test_reopen_keeps_unacknowledged_records(tmp_path: Path) -> None:
    s = Spool(tmp_path, segment_bytes=4096)
    fill(s, 500)
    s.read(500)
    s.ack_until(120)
    s.close()
    s2 = Spool(tmp_path, segment_bytes=4096)
    assert s2.pending() == 380
    assert [int(v) for v in values(s2.read(1000))] == list(range(120, 500))
    fill(s2, 5, start=500)
    assert [e.seq for e in s2.read(10)] == list(range(500, 505))


def test_crash_with_torn_tail(tmp_path: Path) -> None:
    s = Spool(tmp_path, segment_bytes=1 << 20)
    fill(s, 50)
    s.tick()  # cursor written as a running agent would, then "kill -9": no close()
    last = s.segments[-1].path
    with open(last, "ab") as fh:
        fh.write(b"\x40\x00\x00\x00\x12\x34")  # half a header of a record being written
    s2 = Spool(tmp_path)
    assert s2.corrupt_bytes == 6
    assert [int(v) for v in values(s2.read(100))] == list(range(50))
    fill(s2, 1, start=50)
    assert [int(v) for v in values(s2.read(10))] == [50]


def test_crash_with_corrupt_record(tmp_path: Path) -> None:
    s = Spool(tmp_path, segment_bytes=1 << 20)
    fill(s, 10, size=20)
    path = s.segments[-1].path
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # flip a byte inside the last record: crc mismatch
    path.write_bytes(bytes(data))
    s2 = Spool(tmp_path)
    assert [int(v.rstrip(b".")) for v in values(s2.read(100))] == list(range(9))


def test_bound_drops_oldest_and_counts(tmp_path: Path) -> None:
    s = Spool(tmp_path, max_bytes=64 * 1024, segment_bytes=8 * 1024)
    fill(s, 2000, size=100)
    assert s.total_bytes <= 64 * 1024
    assert s.dropped > 0 and s.dropped + s.pending() == 2000
    got = [int(v.rstrip(b".")) for v in values(s.read(10_000))]
    assert got == list(range(s.dropped, 2000))  # the newest survive, in order


def test_bound_drops_newest_and_counts(tmp_path: Path) -> None:
    s = Spool(tmp_path, max_bytes=64 * 1024, segment_bytes=8 * 1024, policy="newest")
    fill(s, 2000, size=100)
    assert s.dropped > 0 and s.dropped + s.pending() == 2000
    got = [int(v.rstrip(b".")) for v in values(s.read(10_000))]
    assert got == list(range(s.pending()))  # the oldest survive, in order


def test_fsync_only_when_records_wait(tmp_path: Path) -> None:
    clock = [0.0]
    s = Spool(tmp_path, fsync_after_s=1.0, clock=lambda: clock[0])
    fill(s, 3)
    s.read(3)
    s.ack_until(3)  # delivered at once: nothing to make durable
    clock[0] = 5.0
    assert s.tick() is False
    fill(s, 2)
    clock[0] = 5.5
    assert s.tick() is False
    clock[0] = 6.5
    assert s.tick() is True


class FlakyProducer:
    """Accepts records, delivers or fails them when told; records what was delivered."""

    def __init__(self) -> None:
        self.queue: list[tuple[bytes, Any]] = []
        self.log: list[bytes] = []
        self.fail_next = 0

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                on_delivery: Any = None) -> None:
        self.queue.append((value or b"", on_delivery))

    def poll(self, timeout: float = 0.0) -> int:
        done, self.queue = self.queue, []
        for value, cb in done:
            if self.fail_next:
                self.fail_next -= 1
                cb(TimedOut(), None)
            else:
                self.log.append(value)
                cb(None, None)
        return len(done)

    def flush(self, timeout: float = 0.0) -> int:
        return 0

    def __len__(self) -> int:
        return len(self.queue)


class TimedOut:
    def code(self) -> int:
        return -192  # KafkaError._MSG_TIMED_OUT

    def retriable(self) -> bool:
        return False

    def __str__(self) -> str:
        return "Local: Message timed out"


def test_failed_deliveries_go_back_to_the_spool_in_order(tmp_path: Path) -> None:
    clock = [0.0]
    prod = FlakyProducer()
    pub = SpoolingPublisher(prod, Spool(tmp_path), window=50, retry_backoff_s=1.0,
                            clock=lambda: clock[0])
    for i in range(200):
        pub.publish("t", "job", str(i).encode())
    pub.pump()  # 50 in flight
    prod.fail_next = 50  # the broker is gone: the whole window times out
    pub.pump()
    assert pub.failures == 50 and pub.spool.pending() == 200
    pub.pump()  # rewound, waiting out the backoff
    assert prod.queue == []
    clock[0] = 2.0
    for _ in range(10):
        pub.pump()
    assert [int(v) for v in prod.log] == list(range(200))
    assert pub.spool.pending() == 0 and pub.delivered == 200 and pub.dropped == 0


def test_partial_failure_skips_what_was_delivered(tmp_path: Path) -> None:
    prod = FlakyProducer()
    pub = SpoolingPublisher(prod, Spool(tmp_path), window=10, retry_backoff_s=0.0)
    for i in range(10):
        pub.publish("t", None, str(i).encode())
    pub.pump()
    prod.fail_next = 3  # the first three fail, the other seven get through
    pub.pump()
    for _ in range(3):
        pub.pump()
    assert sorted(int(v) for v in prod.log) == list(range(10))  # none lost, none twice
    assert pub.spool.pending() == 0


def test_null_producer_sink(tmp_path: Path) -> None:
    pub = SpoolingPublisher(NullProducer(), Spool(tmp_path))
    for _i in range(5):
        pub.publish("t", "k", b"x")
    pub.pump()
    pub.pump()
    assert pub.delivered == 5 and pub.spool.pending() == 0
    assert pub.close(1.0) is True


def test_spool_policy_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Spool(tmp_path, policy="random")
