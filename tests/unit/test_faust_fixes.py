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
