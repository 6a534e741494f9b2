"""Which of a job's hosts went dark, from its telemetry (Aegis §3: hosts that died together).

Every host agent sends a TelemetryBatch each sample interval (1 s by default), whatever the
job does, so a host whose batches stop while the rest of its job keeps sending has lost its
agent: powered off, panicked, or cut off the network. A training process that crashes does
not stop them. That is the difference the CCL records alone cannot see: when every process of
a host dies, its agent sends no CCL record either, so Phase 2's ``rank_silent`` names a dead
host and a crashed one alike, and the guard caps a rack's four silent hosts as a bad update.

This detector says only that: hosts that stopped sending for ``max(dark_s, 3 intervals)``
(sending: a batch with a newer ``ts``, or any batch while the job clock is past the host's
newest ``ts``, so a host whose clock stepped back or lags stays alive),
fewer than half of the job's reporting hosts (more, and the telemetry is late, not the hosts),
in one ``host_dark`` diagnosis per group that went dark together, with ``hosts_down``
evidence and no action of its own. The guard remembers them: another detector's isolation
of a dark host may pass the job's blast radius (it does no work, isolated or not), and a
NetDiag of a link to one is refused (the host, not the link, broke the connections).
Pure, in event time; contract in processors/core/base.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from processors.core.base import Outputs, check_snapshot_v1, make_diagnosis
from schemas.errors import ConfigError
from schemas.inventory import Inventory
from schemas.records import TelemetryBatch

DETECTOR = "telemetry_liveness"
MAX_HOSTS = 65536  # per job: a flood of made-up host names must not grow the state


@dataclass(frozen=True, slots=True)
class LivenessConfig:
    """Seconds of event time."""

    dark_s: float = 15.0  # silent for max(dark_s, 3 intervals): dark (0 turns this off)
    dark_recent_s: float = 300.0  # last heard within this: a host of this incident
    check_s: float = 1.0  # how often the job's hosts are checked
    min_hosts: int = 3  # fewer hosts heard: no verdict (nobody to compare with)

    def __post_init__(self) -> None:
        for name in ("dark_s", "dark_recent_s", "check_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"liveness: {name}={v!r} must be a finite number >= 0")
        if self.check_s <= 0 or self.dark_recent_s < self.dark_s:
            raise ConfigError(f"liveness: need check_s > 0 ({self.check_s}) and "
                              f"dark_recent_s ({self.dark_recent_s}) >= dark_s ({self.dark_s})")
        if not isinstance(self.min_hosts, int) or self.min_hosts < 2:
            raise ConfigError(f"liveness: min_hosts={self.min_hosts!r} must be an integer >= 2")


class TelemetryLiveness:
    """Per host of one job: the newest batch heard and the interval between batches."""

    name = DETECTOR

    def __init__(self, job: str, config: LivenessConfig | None = None,
                 inventory: Inventory | None = None) -> None:
        self.job = job
        self.cfg = config if config is not None else LivenessConfig()
        ranks = inventory.ranks.get(job) if inventory is not None else None
        self.ranked = frozenset(h for h, _ in ranks.values()) if ranks else None
        self.last: dict[str, float] = {}  # host -> newest batch ts
        self.period: dict[str, float] = {}  # host -> seconds between its last two batches
        self.heard: dict[str, float] = {}  # host -> job clock at its latest batch, if past its ts
        self.reported: set[str] = set()  # dark hosts already in a diagnosis (until heard again)
        self.watermark = 0.0
        self.next_check = 0.0

    def observe(self, batch: TelemetryBatch) -> Outputs:
        host, ts = batch.host, batch.ts
        if (batch.job is not None and batch.job != self.job) or not math.isfinite(ts) or (
                self.ranked is not None and host not in self.ranked):
            return Outputs()  # the Z-score detector beside it reports these
        last = self.last.get(host)
        if last is None:
            if len(self.last) >= MAX_HOSTS:
                return Outputs()
            self.last[host] = ts
        elif ts > last:
            self.period[host] = ts - last
            self.last[host] = ts
            self.reported.discard(host)
        # Heard while the job clock stood at the watermark: an agent whose clock stepped back,
        # or that lags its job, is alive. A repeat of an old batch does not end its report.
        if self.watermark > self.last[host]:
            self.heard[host] = self.watermark
        else:
            self.heard.pop(host, None)
        return Outputs()

    def _seen(self, host: str) -> float:
        return self.heard.get(host, self.last[host])

    def advance(self, now: float) -> Outputs:
        out = Outputs()
        if now > self.watermark:
            self.watermark = now
        if self.watermark < self.next_check or self.cfg.dark_s <= 0:
            return out
        self.next_check = self.watermark + self.cfg.check_s
        now = self.watermark
        pool = [h for h in self.last if now - self._seen(h) <= self.cfg.dark_recent_s]
        if len(pool) < self.cfg.min_hosts:
            return out
        dark = [h for h in pool if now - self._seen(h) > self._limit(h)]
        if not dark or 2 * len(dark) >= len(pool):
            return out  # nobody, or half the job or more: the telemetry is late, not the hosts
        new = sorted(h for h in dark if h not in self.reported)
        if new:
            self.reported.update(new)
            out.diagnoses.append(self._diagnosis(new, len(pool) - len(dark)))
        return out

    def _limit(self, host: str) -> float:
        return max(self.cfg.dark_s, 3 * self.period.get(host, 0.0))

    def _diagnosis(self, hosts: list[str], live: int) -> Any:
        since = min(self.last[h] for h in hosts)
        last_seen = {h: self.last[h] for h in hosts}
        names = ", ".join(hosts[:8]) + (f" and {len(hosts) - 8} more" if len(hosts) > 8 else "")
        return make_diagnosis(
            job=self.job, kind="host_dark", detector=DETECTOR, rule="telemetry_dark",
            event_ts=since, detected_ts=self.watermark, hosts=hosts,
            evidence={"hosts_down": hosts, "last_seen": last_seen,
                      "silent_s": round(self.watermark - since, 3), "live_hosts": live,
                      "dark_s": max(self._limit(h) for h in hosts), "actions": []},
            confidence=0.7,
            summary=(f"{names} stopped sending telemetry at {since:.3f} while {live} other "
                     f"host(s) of job {self.job} kept sending: dark (powered off, panicked or "
                     "cut off), not a crashed process"))

    # ---- state -------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Plain msgpack/JSON-able state (sorted, so equal states give equal snapshots)."""
        return {"v": 1, "job": self.job, "watermark": self.watermark,
                "next_check": self.next_check,
                "hosts": [[h, t, self.period.get(h, 0.0)] for h, t in sorted(self.last.items())],
                "heard": [[h, w] for h, w in sorted(self.heard.items())],
                "reported": sorted(self.reported)}

    @classmethod
    def restore(cls, state: Mapping[str, Any], job: str, config: LivenessConfig | None = None,
                inventory: Inventory | None = None) -> TelemetryLiveness:
        check_snapshot_v1(state, "liveness")
        det = cls(job, config, inventory)
        det.watermark, det.next_check = float(state["watermark"]), float(state["next_check"])
        for h, t, p in state.get("hosts", []):
            det.last[str(h)] = float(t)
            if p:
                det.period[str(h)] = float(p)
        det.heard = {str(h): float(w) for h, w in state.get("heard", []) if str(h) in det.last}
        det.reported = {str(h) for h in state.get("reported", [])}
        return det
