"""The job clock every detector of one input topic shares, and its guard against skewed hosts.

Each input topic keeps one event-time watermark per job: the newest record ``ts`` seen. A
host whose clock is wrong (an RTC a year ahead, a bad NTP step) would drag that watermark
forward on its own, and every honest record after it would then be "late" to every
detector. So a record more than ``max_future_s`` ahead of the job clock is refused as
``clock_skew`` (counted, never silent) unless another host agrees on the jump, which is a
real gap in the job's data (a pause, a restart). A job with one host cannot tell the two
apart and follows its host. The same rule as the Z-score's own guard (docs/zscore.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from schemas.errors import ConfigError

HOSTS_KEPT = 4096  # hosts remembered per job (only their count matters, up to 2)


@dataclass(frozen=True, slots=True)
class InputConfig:
    """Policy table ``[input]``: what every input topic's job clock accepts."""

    max_future_s: float = 300.0  # a lone host further ahead of its job's clock is clock_skew

    def __post_init__(self) -> None:
        if not self.max_future_s > 0 or not math.isfinite(self.max_future_s):
            raise ConfigError(f"input: max_future_s must be > 0, not {self.max_future_s}")


class JobClock:
    """Which hosts of one job are far ahead of its watermark; serialisable."""

    def __init__(self, max_future_s: float) -> None:
        self.max_future_s = max_future_s
        self.hosts: set[str] = set()
        self.ahead: dict[str, float] = {}  # host -> its skewed ts

    def check(self, host: str, ts: float, watermark: float | None) -> str:
        """"" when the record may move the clock, else why it is clock_skew."""
        if len(self.hosts) < HOSTS_KEPT:
            self.hosts.add(host)
        if watermark is None or not ts > watermark + self.max_future_s:
            self.ahead.pop(host, None)
            return ""
        self.ahead[host] = ts
        if len(self.ahead) < min(2, len(self.hosts)):
            return (f"ts {ts:.3f} is {ts - watermark:.0f}s ahead of the job clock "
                    f"({watermark:.3f}) and no other host agrees")
        self.ahead.clear()  # several hosts agree: the job's clock really moved on
        return ""

    def snapshot(self) -> dict[str, Any]:
        return {"hosts": sorted(self.hosts), "ahead": dict(sorted(self.ahead.items()))}

    @classmethod
    def restore(cls, state: dict[str, Any], max_future_s: float) -> JobClock:
        c = cls(max_future_s)
        c.hosts = {str(h) for h in state.get("hosts", [])}
        c.ahead = {str(h): float(t) for h, t in dict(state.get("ahead", {})).items()}
        return c
