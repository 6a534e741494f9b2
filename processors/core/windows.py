"""Event-time window assignment over integer-millisecond epoch time.

Aegis §5.1 takes cross-device statistics over a window T; the Z-score detector builds T out
of tumbling sub-windows of width w. Every window boundary is an integer number of
milliseconds since the epoch and a multiple of the width, so the same timestamp lands in the
same window on every worker, after every restart and in every replay.

A window is half-open: ``[start_ms, start_ms + width_ms)``.
"""

from __future__ import annotations

import math


def to_ms(ts: float) -> int:
    """Epoch seconds → integer epoch milliseconds, rounding half up (``1.0005`` → ``1001``).

    Raises ``ValueError`` for NaN or infinite time.
    """
    if not math.isfinite(ts):
        raise ValueError(f"event time {ts!r} is not finite")
    return math.floor(ts * 1000.0 + 0.5)


def window_start_ms(ts_ms: int, width_ms: int) -> int:
    """Start of the tumbling window of width ``width_ms`` holding ``ts_ms`` (floor alignment;
    negative times align the same way)."""
    if width_ms <= 0:
        raise ValueError(f"window width {width_ms} ms is not positive")
    return ts_ms - ts_ms % width_ms


def window_of(ts: float, width_ms: int) -> tuple[int, int]:
    """``(start_ms, end_ms)`` of the window that event time ``ts`` (seconds) falls in."""
    start = window_start_ms(to_ms(ts), width_ms)
    return start, start + width_ms


def closable_until_ms(watermark: float, width_ms: int) -> int:
    """End of the newest window that a watermark (seconds) closes: every window whose end is
    at or before the watermark is complete."""
    return window_start_ms(to_ms(watermark), width_ms)


def starts_within(end_ms: int, span_ms: int, width_ms: int) -> range:
    """Starts of the sub-windows of width ``width_ms`` that make up the span
    ``[end_ms - span_ms, end_ms)``; ``end_ms`` must be window-aligned. A span that is not a
    multiple of the width is rounded up to whole sub-windows."""
    if end_ms % width_ms:
        raise ValueError(f"end {end_ms} ms is not aligned to width {width_ms} ms")
    count = max(1, -(-span_ms // width_ms))
    return range(end_ms - count * width_ms, end_ms, width_ms)
