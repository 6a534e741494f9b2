"""Counter deltas and rates: 32/64-bit wrap, reset, first reading, stalled clock."""

from __future__ import annotations

import pytest

from producers.agent.rates import U32, U64, RateTracker, counter_delta


@pytest.mark.parametrize(("prev", "cur", "width", "expected"), [
    (100, 250, None, (150, "ok")),
    (5, 5, None, (0, "ok")),
    (U32 - 10, 5, None, (15, "wrap32")),
    (U32 - 1, 0, None, (1, "wrap32")),
    (U64 - 100, 50, None, (150, "wrap64")),
    (U32 + 7, 3, None, (3, "reset")),  # a 64-bit counter going down from near 2**32: reset
    (1_000_000, 10, None, (10, "reset")),  # down a lot, far from the top: reset
    (3_000_000_000, 1_000, None, (1_000, "reset")),  # not in the top quarter: reset
    (U32 - 10, 5, 64, (5, "reset")),  # known 64-bit: a small value after 2**32-10 is a reset
])
def test_counter_delta(prev: int, cur: int, width: int | None, expected: tuple[int, str]) -> None:
    assert counter_delta(prev, cur, width) == expected


def test_rate_needs_two_readings_and_forward_time() -> None:
    t = RateTracker()
    assert t.update("k", 10.0, 100) is None
    assert t.update("k", 10.0, 200) is None  # same instant: no rate, base kept
    r = t.update("k", 12.0, 300)
    assert r is not None and r.per_s == pytest.approx(100.0) and r.how == "ok"


def test_width_is_learnt_from_values() -> None:
    t = RateTracker()
    t.update("k", 0.0, U32 + 100)  # once above 2**32 the counter is 64-bit
    t.update("k", 1.0, U32 + 200)
    r = t.update("k", 2.0, 50)
    assert r is not None and r.how == "reset" and r.per_s == 50.0


def test_forget_drops_baselines() -> None:
    t = RateTracker()
    t.update(("a", "x"), 0.0, 1)
    t.update(("b", "x"), 0.0, 1)
    t.forget(lambda k: k[0] == "a")  # type: ignore[index]
    assert t.update(("a", "x"), 1.0, 5) is None
    assert t.update(("b", "x"), 1.0, 5) is not None


def test_clock_stepping_back_rebaselines_instead_of_stalling() -> None:
    t = RateTracker()
    t.update("k", 1_000.0, 100)
    assert t.update("k", 400.0, 200) is None  # wall clock stepped back 600 s (NTP step)
    r = t.update("k", 401.0, 260)  # rates resume at once, measured from the new base
    assert r is not None and r.per_s == pytest.approx(60.0)
