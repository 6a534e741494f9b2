"""The job clock every detector of one input topic shares, and its guard against skewed hosts.

Each input topic keeps one event-time watermark per job: the newest record ``ts`` seen. A
host whose clock is wrong (an RTC a year ahead, a bad NTP step) would drag that watermark
forward on its own, and every honest record after it would then be "late" to every
detector. So a record more than ``max_future_s`` ahead of the job clock does not move it:
``clock_skew`` (counted, never silent; the pipeline then takes a CCL record at the job
clock and refuses a log line or telemetry batch) unless another host agrees on the jump, which is a
real gap in the job's data (a pause, a restart), or unless that host keeps reporting ahead
over ``lone_after_s`` of its own time while no other host reports at the old time (the job
came back on fewer hosts; a burst of lines from a skewed host spans no time). A job with
one host cannot tell the two apart and follows its host. The same rule as the Z-score's own
guard (docs/zscore.md).

The first host to report sets the clock before anyone can disagree. Until another host has
been accepted, a record from another host more than ``max_future_s`` *behind* it means that
first host was the skewed one (``restarts``): the job starts over from that record, and the
first host's records are refused like any skewed host's. Once the first host has reported
alone for ``lone_after_s`` of its own time, its clock is the job's.

Behind: a host whose clock stepped back (or whose agent sends a backlog) does not move the
clock. Its CCL records are taken at the job clock once they are more than ``ccl_behind_s``
behind it (``clock_skew``, counted): else each rank's reports are ``late`` against its own
last one, and the live host looks silent to the hang detector while its peers report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from schemas.errors import ConfigError

HOSTS_KEPT = 2  # hosts remembered per job: only "one, or more than one" matters


@dataclass(frozen=True, slots=True)
class InputConfig:
    """Policy table ``[input]``: what every input topic's job clock accepts."""

    max_future_s: float = 300.0  # a lone host further ahead of its job's clock is clock_skew
    lone_after_s: float = 60.0  # ...until its records span this long with no other host present
    ccl_behind_s: float = 10.0  # a CCL record further behind the job clock is taken at it

    def __post_init__(self) -> None:
        if not self.max_future_s > 0 or not math.isfinite(self.max_future_s):
            raise ConfigError(f"input: max_future_s must be > 0, not {self.max_future_s}")
        if not self.lone_after_s > 0:
            raise ConfigError(f"input: lone_after_s must be > 0, not {self.lone_after_s}")
        if not self.ccl_behind_s > 0 or not math.isfinite(self.ccl_behind_s):
            raise ConfigError(f"input: ccl_behind_s must be > 0, not {self.ccl_behind_s}")


class JobClock:
    """Which hosts of one job are far ahead of its watermark; serialisable."""

    def __init__(self, max_future_s: float, lone_after_s: float = 60.0) -> None:
        self.max_future_s = max_future_s
        self.lone_after_s = lone_after_s
        self.hosts: set[str] = set()
        self.ahead: dict[str, float] = {}  # host -> its skewed ts
        self.streak: dict[str, float] = {}  # host -> its first ts ahead since another was present
        self.leader: str | None = None  # the first host, until another host is accepted
        self.lead_from = 0.0  # its first ts
        self.confirmed = False  # another host agreed with the clock the first one set

    def check(self, host: str, ts: float, watermark: float | None) -> str:
        """"" when the record may move the clock, else why it is clock_skew."""
        if len(self.hosts) < HOSTS_KEPT:
            self.hosts.add(host)
        if self.leader is None and not self.confirmed:
            self.leader, self.lead_from = host, ts
        if watermark is None or not ts > watermark + self.max_future_s:
            if (not self.confirmed and host != self.leader
                    and (watermark is None or not ts < watermark - self.max_future_s)):
                self.confirmed, self.leader = True, None  # a second host agrees with the first
            self.ahead.pop(host, None)
            self.streak.clear()  # a host is present at the job's time: the others are skewed
            return ""
        self.ahead[host] = ts
        since = self.streak.setdefault(host, ts)
        if len(self.ahead) < min(2, len(self.hosts)) and ts - since < self.lone_after_s:
            return (f"ts {ts:.3f} is {ts - watermark:.0f}s ahead of the job clock "
                    f"({watermark:.3f}) and no other host agrees")
        # several hosts agree, or the others are gone: the job's clock really moved on
        if host != self.leader:
            self.confirmed, self.leader = True, None
        self.ahead.clear()
        self.streak.clear()
        return ""

    def restarts(self, host: str, ts: float, watermark: float | None) -> str | None:
        """The first host, when only the first host has set the clock, for less than ``lone_after_s``
        of its own time, and this other host is more than ``max_future_s`` behind it: the
        first host was the skewed one; the clock then starts over at this record. Else None."""
        if (self.confirmed or self.leader is None or host == self.leader or watermark is None
                or not ts < watermark - self.max_future_s
                or watermark - self.lead_from >= self.lone_after_s):
            return None
        skewed = self.leader
        self.hosts = {skewed, host}
        self.ahead, self.streak = {}, {}
        self.leader, self.lead_from = host, ts
        return skewed

    def snapshot(self) -> dict[str, Any]:
        return {"hosts": sorted(self.hosts), "ahead": dict(sorted(self.ahead.items())),
                "streak": dict(sorted(self.streak.items())), "leader": self.leader,
                "lead_from": self.lead_from, "confirmed": self.confirmed}

    @classmethod
    def restore(cls, state: dict[str, Any], max_future_s: float,
                lone_after_s: float = 60.0) -> JobClock:
        c = cls(max_future_s, lone_after_s)
        c.hosts = {str(h) for h in state.get("hosts", [])}
        c.ahead = {str(h): float(t) for h, t in dict(state.get("ahead", {})).items()}
        c.streak = {str(h): float(t) for h, t in dict(state.get("streak", {})).items()}
        leader = state.get("leader")
        c.leader = str(leader) if leader is not None else None
        c.lead_from = float(state.get("lead_from", 0.0))
        c.confirmed = bool(state.get("confirmed", "leader" not in state))  # older state: settled
        return c
