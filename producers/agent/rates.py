"""Turn cumulative hardware counters into per-second rates, surviving wrap and reset.

Counter width is detected from the values: a counter that has ever read at or above 2**32
is 64-bit, otherwise it is treated as 32-bit. When a reading goes down:

* **wrap** if the wrapped distance ``2**width - prev + cur`` is at most a quarter of the
  range (the previous reading sat near the top and the new one near zero);
* **reset** otherwise (driver reload, ``perfquery -R``, device re-created): the counter
  restarted at zero, so the new reading itself is the count since the reset. Never a
  negative rate.

A rate needs two readings: the first reading of a key, and a reading whose timestamp does
not move forward, give no rate. Readings are stamped with wall time; when it steps back (an
NTP/PTP step), the new reading becomes the base, so rates resume at the next reading instead
of after the clock has caught up with the old base.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

U32 = 1 << 32
U64 = 1 << 64


def counter_delta(prev: int, cur: int, width: int | None = None) -> tuple[int, str]:
    """Increase from ``prev`` to ``cur``: (delta, "ok" | "wrap32" | "wrap64" | "reset")."""
    if cur >= prev:
        return cur - prev, "ok"
    bits = width if width is not None else (32 if prev < U32 else 64)
    span = 1 << bits
    if prev < span:
        wrapped = span - prev + cur
        if wrapped <= span // 4:
            return wrapped, f"wrap{bits}"
    return max(cur, 0), "reset"


@dataclass(frozen=True, slots=True)
class Rate:
    per_s: float
    how: str  # ok | wrap32 | wrap64 | reset


class RateTracker:
    """Last reading per key; ``update`` gives the rate since the previous reading."""

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[float, int]] = {}
        self._wide: set[Hashable] = set()

    def update(self, key: Hashable, ts: float, value: int) -> Rate | None:
        value = int(value)
        if value >= U32:
            self._wide.add(key)
        prev = self._last.get(key)
        if prev is not None and ts <= prev[0]:
            if ts < prev[0]:  # the clock stepped back: re-baseline
                self._last[key] = (ts, value)
            return None  # same instant: keep the older reading as the base
        self._last[key] = (ts, value)
        if prev is None:
            return None
        width = 64 if key in self._wide else None
        delta, how = counter_delta(prev[1], value, width)
        return Rate(delta / (ts - prev[0]), how)

    def wide(self, key: Hashable) -> bool:
        """Whether ``key`` has read at or above 2**32 (so it is a 64-bit counter)."""
        return key in self._wide

    def forget(self, match: Callable[[Hashable], bool]) -> None:
        """Drop the baselines of keys that ``match`` (a device that went away)."""
        for key in [k for k in self._last if match(k)]:
            del self._last[key]
            self._wide.discard(key)
