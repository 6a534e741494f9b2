"""Table tests for the pure event-time window assignment (integer-millisecond epoch)."""

from __future__ import annotations

import math

import pytest

from processors.core.windows import (
    closable_until_ms,
    starts_within,
    to_ms,
    window_of,
    window_start_ms,
)


@pytest.mark.parametrize(("ts", "ms"), [
    (0.0, 0), (1.0, 1000), (1.0004, 1000), (1.0005, 1001), (1.2345, 1235),
    (1_700_000_000.123, 1_700_000_000_123), (-0.0015, -1),
])
def test_to_ms(ts: float, ms: int) -> None:
    assert to_ms(ts) == ms


@pytest.mark.parametrize("ts", [math.nan, math.inf, -math.inf])
def test_to_ms_refuses_non_finite(ts: float) -> None:
    with pytest.raises(ValueError):
        to_ms(ts)


@pytest.mark.parametrize(("ts_ms", "width", "start"), [
    (0, 30_000, 0), (29_999, 30_000, 0), (30_000, 30_000, 30_000), (30_001, 30_000, 30_000),
    (1_700_000_012_345, 30_000, 1_700_000_010_000), (-1, 30_000, -30_000),
    (999, 1, 999), (1_234, 1_000, 1_000),
])
def test_window_start(ts_ms: int, width: int, start: int) -> None:
    assert window_start_ms(ts_ms, width) == start


def test_window_width_must_be_positive() -> None:
    with pytest.raises(ValueError):
        window_start_ms(5, 0)


@pytest.mark.parametrize(("ts", "width", "window"), [
    (1_700_000_000.0, 30_000, (1_700_000_000_000 - 20_000, 1_700_000_000_000 + 10_000)),
    (59.9994, 30_000, (30_000, 60_000)),
    (59.9996, 30_000, (60_000, 90_000)),  # rounds to 60.000 s: the next window
    (10.0, 10_000, (10_000, 20_000)),
])
def test_window_of(ts: float, width: int, window: tuple[int, int]) -> None:
    assert window_of(ts, width) == window


@pytest.mark.parametrize(("watermark", "width", "until"), [
    (59.999, 30_000, 30_000), (60.0, 30_000, 60_000), (95.0, 30_000, 90_000),
])
def test_closable_until(watermark: float, width: int, until: int) -> None:
    assert closable_until_ms(watermark, width) == until


@pytest.mark.parametrize(("end", "span", "width", "starts"), [
    (600_000, 600_000, 30_000, list(range(0, 600_000, 30_000))),
    (90_000, 60_000, 30_000, [30_000, 60_000]),
    (90_000, 45_000, 30_000, [30_000, 60_000]),  # rounded up to whole sub-windows
    (90_000, 1, 30_000, [60_000]),
])
def test_starts_within(end: int, span: int, width: int, starts: list[int]) -> None:
    assert list(starts_within(end, span, width)) == starts


def test_starts_within_needs_aligned_end() -> None:
    with pytest.raises(ValueError):
        starts_within(90_001, 60_000, 30_000)
