"""AckHolder hands events back in offset order per partition; PendingWrites waits for every
delivery future added before the call."""

from __future__ import annotations

import asyncio

import pytest

from processors.checkpoints import AckHolder, PendingWrites


def test_released_events_wait_for_earlier_events_of_the_partition() -> None:
    h = AckHolder(every_s=10.0)
    h.hold("b", 0, "e0", 0.0)  # offset 0, job b
    h.hold("a", 0, "e1", 0.0)  # offset 1, job a
    h.hold("a", 0, "e2", 0.0)
    h.hold("c", 1, "f0", 0.0)  # another partition
    # a's state is written: its events must not be acked while b's offset 0 is held
    assert h.checkpointed("a", 5.0) == []
    assert h.held() == 4
    assert h.checkpointed("b", 5.0) == ["e0", "e1", "e2"]
    assert h.checkpointed("c", 5.0) == ["f0"]
    assert h.held() == 0


def test_dead_letters_are_released_in_their_turn() -> None:
    h = AckHolder(every_s=10.0)
    h.hold("a", 0, "e0", 0.0)
    assert h.release(0, "bad1") == []  # behind a held event
    assert h.checkpointed("a", 1.0) == ["e0", "bad1"]
    assert h.release(0, "bad2") == ["bad2"]


def test_due_and_quiet_jobs() -> None:
    h = AckHolder(every_s=10.0, quiet_wall_s=5.0)
    assert not h.due("a", 0.0)
    h.hold("a", 0, "e0", wall=100.0)
    assert h.due("a", 0.0)  # never checkpointed
    h.checkpointed("a", 0.0)
    h.hold("a", 0, "e1", wall=100.0)
    assert not h.due("a", 9.0) and h.due("a", 10.0) and h.due("a", 1.0, force=True)
    assert h.quiet_jobs(0, 104.0, None) == []
    assert h.quiet_jobs(0, 105.0, None) == ["a"]
    assert h.quiet_jobs(0, 105.0, "a") == [] and h.quiet_jobs(1, 105.0, None) == []


def test_a_job_that_moves_partition_does_not_block_the_old_one() -> None:
    h = AckHolder(every_s=10.0)
    h.hold("a", 0, "e0", 0.0)
    h.hold("b", 0, "e1", 0.0)
    h.hold("a", 1, "f0", 0.0)
    assert h.checkpointed("b", 1.0) == ["e0", "e1"]


def test_pending_writes_wait_for_all_deliveries() -> None:
    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        pending = PendingWrites()
        done: list[str] = []
        futs = [loop.create_future() for _ in range(3)]
        for f in futs:
            pending.add(f)
        for i, f in enumerate(futs):
            loop.call_later(0.01 * (3 - i), f.set_result, i)
        await pending.settled()
        done.append("settled")
        assert all(f.done() for f in futs) and len(pending) == 0
        await pending.settled()  # nothing pending: returns at once
        return done

    assert asyncio.run(scenario()) == ["settled"]


def test_failed_delivery_raises_so_nothing_is_acked() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        pending = PendingWrites()
        f = loop.create_future()
        pending.add(f)
        f.set_exception(RuntimeError("broker said no"))
        await pending.settled()

    with pytest.raises(RuntimeError, match="broker said no"):
        asyncio.run(scenario())
