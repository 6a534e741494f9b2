"""processors.faust_fixes: partitions with no committed offset are rewound to 0 after the
seek to committed offsets (a worker killed before its first commit loses nothing)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from types import SimpleNamespace

from faust.transport.consumer import Consumer
from faust.types import TP

from processors import faust_fixes


class FakeConsumer:
    def __init__(self, committed: dict[TP, int], assigned: list[TP]) -> None:
        self.app = SimpleNamespace(conf=SimpleNamespace(consumer_auto_offset_reset="earliest"),
                                   consumer_generation_id=3)
        self._committed = committed
        self._assigned = assigned
        self._read_offset: dict = defaultdict(lambda: None)
        self._committed_offset: dict = defaultdict(lambda: None)
        self.seeks: list[tuple[TP, int]] = []

    async def seek_to_committed(self) -> dict[TP, int]:
        return dict(self._committed)

    async def seek(self, tp: TP, offset: int) -> None:
        self.seeks.append((tp, offset))

    def assignment(self) -> set[TP]:
        return set(self._assigned)

    def _is_changelog_tp(self, tp: TP) -> bool:
        return tp.topic.endswith("-changelog")


def test_uncommitted_input_partitions_are_rewound_to_zero() -> None:
    faust_fixes.apply()
    faust_fixes.apply()  # idempotent
    done, fresh, zero = TP("in", 0), TP("in", 1), TP("in", 2)
    changelog, leader = TP("app-t-changelog", 0), TP("app-__assignor-__leader", 0)
    c = FakeConsumer({done: 41, zero: 0}, [done, fresh, zero, changelog, leader])
    asyncio.run(Consumer.perform_seek(c))  # type: ignore[arg-type]
    assert sorted(c.seeks) == [(fresh, 0), (zero, 0)]
    assert c._committed_offset[done] == 41


def test_latest_reset_policy_is_left_alone() -> None:
    faust_fixes.apply()
    c = FakeConsumer({}, [TP("in", 0)])
    c.app.conf.consumer_auto_offset_reset = "latest"
    asyncio.run(Consumer.perform_seek(c))  # type: ignore[arg-type]
    assert c.seeks == []


def test_fetch_gets_a_frozen_copy_and_an_empty_one_fetches_nothing() -> None:
    """aiokafka reads an empty partition set as "all partitions", and Faust's set is live:
    emptied while a fetch waits (changelogs paused, streams not yet resumed), it drained
    every partition and Faust dropped the records. The fetch now gets a frozen copy."""
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    faust_fixes.apply()
    calls: list[object] = []

    class Thread:
        def _ensure_consumer(self) -> object:
            return SimpleNamespace(_max_poll_records=None)

        async def call_thread(self, fn, consumer, active, timeout, max_records):
            calls.append(active)
            return {"fetched": sorted(active) if active is not None else "all"}

        _fetch_records = None

    live = {TP("t", 0), TP("t", 1)}
    got = asyncio.run(AIOKafkaConsumerThread.getmany(Thread(), live, 1.0))  # type: ignore[arg-type]
    assert got == {"fetched": sorted(live)}
    assert isinstance(calls[-1], frozenset) and calls[-1] == live
    live.clear()  # what later pauses do to Faust's set: the copy already sent is unchanged
    assert calls[-1] == {TP("t", 0), TP("t", 1)}
    assert asyncio.run(AIOKafkaConsumerThread.getmany(Thread(), set(), 1.0)) == {}  # type: ignore[arg-type]
    assert len(calls) == 1  # the empty set never reached aiokafka
    assert asyncio.run(AIOKafkaConsumerThread.getmany(Thread(), None, 1.0)) == {"fetched": "all"}  # type: ignore[arg-type]
    assert faust_fixes.fetch_partitions(None) is None
