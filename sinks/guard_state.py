"""What the guard remembers (sinks/guard.py), and its snapshot form: plain msgpack/JSON,
sorted, so equal states give equal snapshots."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from schemas.records import Diagnosis


@dataclass
class GuardState:
    seen: dict[str, float] = field(default_factory=dict)  # diagnosis id -> detected_ts
    isolations: list[tuple[float, str, str]] = field(default_factory=list)  # sorted (ts,job,host)
    issued: dict[tuple[str, str, str], float] = field(default_factory=dict)  # (job,act,tgt)->ts
    systemic: dict[str, float] = field(default_factory=dict)  # job -> ts of the last trip
    named: dict[str, float] = field(default_factory=dict)  # job -> ts its culprit's isolation hit a cap
    explained: dict[tuple[str, str], float] = field(default_factory=dict)  # (job,host) -> config ev ts
    down: dict[tuple[str, str], float] = field(default_factory=dict)  # (job,host) isolated while dark -> ts
    dark: dict[tuple[str, str], float] = field(default_factory=dict)  # (job,host) shown down -> onset
    watermark: float = 0.0
    pruned_at: float = 0.0  # watermark at the last prune (pruning is amortised)

    def prune(self, horizon: float) -> None:
        """Forget every entry older than ``horizon``."""
        self.pruned_at = self.watermark
        self.seen = {k: v for k, v in self.seen.items() if v >= horizon}
        self.isolations = [x for x in self.isolations if x[0] >= horizon]
        self.issued = {k: v for k, v in self.issued.items() if v >= horizon}
        self.systemic = {k: v for k, v in self.systemic.items() if v >= horizon}
        self.named = {k: v for k, v in self.named.items() if v >= horizon}
        self.explained = {k: v for k, v in self.explained.items() if v >= horizon}
        self.down = {k: v for k, v in self.down.items() if v >= horizon}
        self.dark = {k: v for k, v in self.dark.items() if v >= horizon}

    def note_dark(self, d: Diagnosis) -> None:
        """Remember the hosts a diagnosis shows down (evidence ``hosts_down``: no telemetry,
        no line, no heartbeat) from its evidence's start; a newer onset replaces an older."""
        v = d.evidence.get("hosts_down") if isinstance(d.evidence, Mapping) else None
        if isinstance(v, list | tuple):
            for h in v:
                if isinstance(h, str) and d.event_ts >= self.dark.get((d.job, h), -math.inf):
                    self.dark[(d.job, h)] = float(d.event_ts)

    def dark_near(self, job: str, t: float, window: float) -> set[str]:
        """Hosts of ``job`` shown down with an onset within ``window`` of event time ``t``."""
        return {h for (j, h), ts in self.dark.items() if j == job and abs(ts - t) <= window}

    def to_wire(self) -> dict[str, Any]:
        return {"watermark": self.watermark, "pruned_at": self.pruned_at,
                "seen": sorted([k, v] for k, v in self.seen.items()),
                "isolations": sorted([ts, job, h] for ts, job, h in self.isolations),
                "issued": sorted([*k, v] for k, v in self.issued.items()),
                "systemic": sorted([k, v] for k, v in self.systemic.items()),
                "named": sorted([k, v] for k, v in self.named.items()),
                "explained": sorted([*k, v] for k, v in self.explained.items()),
                "down": sorted([*k, v] for k, v in self.down.items()),
                "dark": sorted([*k, v] for k, v in self.dark.items())}

    @classmethod
    def from_wire(cls, state: Mapping[str, Any]) -> GuardState:
        return cls(
            seen={str(k): float(v) for k, v in state["seen"]},
            isolations=sorted((float(ts), str(j), str(h)) for ts, j, h in state["isolations"]),
            issued={(str(j), str(a), str(tg)): float(v) for j, a, tg, v in state["issued"]},
            systemic={str(k): float(v) for k, v in state["systemic"]},
            named={str(k): float(v) for k, v in state.get("named", [])},
            explained={(str(j), str(h)): float(v) for j, h, v in state.get("explained", [])},
            down={(str(j), str(h)): float(v) for j, h, v in state.get("down", [])},
            dark={(str(j), str(h)): float(v) for j, h, v in state.get("dark", [])},
            watermark=float(state["watermark"]), pruned_at=float(state.get("pruned_at", 0.0)))
