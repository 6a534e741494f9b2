"""Which of a job's hosts went dark: the decision tree's view of its agents' heartbeats.

Every host agent writes ``aegis-agent heartbeat seq=<n>`` to the logs topic every few seconds
(producers/agent), so a host whose agent was heard beating and then wrote nothing at all for
several beats is *dark*: powered off, panicked, or cut off the network. Aegis §3 RootDiag
centres failed connections on one endpoint; hosts that died together (a rack's power) are
named by their live neighbours only, so the connections of a rack of four name two of them.
A dark host explains the failed connections that touch it, and the other dark hosts of the
same moment are down with it. Pure, in event time: ``at`` is the tree's verdict time.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from processors.core.root_diag import Edge

HEARTBEAT_SOURCE = "agent"
HEARTBEAT_PREFIX = "aegis-agent heartbeat"
MAX_HOSTS = 65536


class Liveness:
    """Per host: the newest line heard, the newest heartbeat and the period between beats."""

    def __init__(self) -> None:
        self.heard: dict[str, float] = {}
        self.beat: dict[str, tuple[float, float]] = {}  # host -> (last beat ts, period s)

    def note(self, host: str, ts: float, source: str, line: str) -> None:
        if host not in self.heard and len(self.heard) >= MAX_HOSTS:
            return
        if ts > self.heard.get(host, -1.0):
            self.heard[host] = ts
        if source == HEARTBEAT_SOURCE and line.startswith(HEARTBEAT_PREFIX):
            last, period = self.beat.get(host, (ts, 0.0))
            if ts > last:
                period = ts - last
            self.beat[host] = (max(ts, last), period)

    def dark(self, at: float, pool: Collection[str], dark_s: float, recent_s: float) -> list[str]:
        """Hosts of ``pool`` heard beating whose last line is more than ``max(dark_s, 3
        periods)`` before ``at`` but at most ``recent_s`` old (dark for this incident, not
        for hours). None when fewer than 3 hosts beat, or when half of them or more are dark
        (then the logs are late, not the hosts)."""
        if dark_s <= 0:
            return []
        beating = [h for h in pool if h in self.beat]
        if len(beating) < 3:
            return []
        dark = sorted(h for h in beating if self._limit(h, dark_s) < at - self.heard[h] <= recent_s)
        return dark if 2 * len(dark) < len(beating) else []

    def due(self, at: float, hosts: Collection[str], dark_s: float) -> float | None:
        """When the latest of ``hosts`` that missed a beat at ``at`` (silent for more than
        1.5 periods) but is not dark yet would be: a verdict on connections to a host that
        lost power seconds ago waits for it. None when none is late (or ``dark_s`` is 0)."""
        if dark_s <= 0:
            return None
        due = [self.heard[h] + self._limit(h, dark_s) for h in hosts if h in self.beat
               and 1.5 * self.beat[h][1] < at - self.heard[h] <= self._limit(h, dark_s)]
        return max(due) + 1e-3 if due else None

    def _limit(self, host: str, dark_s: float) -> float:
        """How long a beating host may be silent before it is dark: max(dark_s, 3 beats)."""
        return max(dark_s, 3 * self.beat[host][1])

    def snapshot(self) -> dict[str, Any]:
        return {"heard": dict(sorted(self.heard.items())),
                "beat": {h: list(b) for h, b in sorted(self.beat.items())}}

    @classmethod
    def restore(cls, state: Mapping[str, Any] | None) -> Liveness:
        lv = cls()
        if state:
            lv.heard = {str(h): float(t) for h, t in state.get("heard", {}).items()}
            lv.beat = {str(h): (float(b[0]), float(b[1])) for h, b in state.get("beat", {}).items()}
        return lv


def explained_by_dark(edges: Sequence[Edge], dark: Collection[str]) -> bool:
    """Every failed connection has a dark end (and there is at least one)."""
    return bool(edges) and bool(dark) and all(a[0] in dark or b[0] in dark for _, a, b in edges)
