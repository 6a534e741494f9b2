"""The decision tree's state in wire form (:mod:`processors.core.decision_tree`): plain
msgpack/JSON values, versioned; keys added since version 1 are read with defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import astuple
from typing import TYPE_CHECKING, Any

from processors.core.tree_clock import BurstClock
from processors.core.tree_events import TreeEvent
from processors.core.tree_liveness import Liveness
from schemas.errors import ConfigError

if TYPE_CHECKING:
    from processors.core.decision_tree import DecisionTree

STATE_VERSION = 1


def to_wire(t: DecisionTree) -> dict[str, Any]:
    """The tree's state: its burst, recent events, incident, hosts and heartbeats."""
    return {"v": STATE_VERSION, "watermark": t.watermark,
            "burst": [list(astuple(e)) for e in t.burst],
            "recent": [list(astuple(e)) for e in t.recent],
            "incident": dict(t.incident) if t.incident else None,
            "seen_hosts": sorted(t.seen_hosts), "terminated": t.terminated,
            "offline_at": t.offline_at,
            "watchdogs": {h: list(w) for h, w in t.watchdogs.items()},
            "liveness": t.liveness.snapshot(), "burst_clock": t.clock.snapshot()}


def load(t: DecisionTree, state: Mapping[str, Any], job: str) -> None:
    """Fill a fresh tree from :func:`to_wire`'s form."""
    if state.get("v") != STATE_VERSION:
        raise ConfigError(f"decision tree state for job {job}: version {state.get('v')!r} "
                          f"not readable (reads {STATE_VERSION})")
    t.watermark = float(state["watermark"])
    t.burst = [TreeEvent(*e) for e in state.get("burst", [])]
    t.recent = [TreeEvent(*e) for e in state.get("recent", [])]
    inc = state.get("incident")
    t.incident = ({"until": float(inc["until"]), "hosts": list(inc["hosts"]),
                   "attached": int(inc["attached"]),
                   "absorb_until": float(inc.get("absorb_until", 0.0)),
                   "culprits": list(inc.get("culprits", inc["hosts"]))} if inc else None)
    t.seen_hosts.update(state.get("seen_hosts", []))  # the set JobPeers shares
    off = state.get("offline_at")
    t.offline_at = float(off) if off is not None else None
    t.watchdogs = {str(h): [float(x) for x in w] for h, w in state.get("watchdogs", {}).items()}
    t.liveness = Liveness.restore(state.get("liveness"))
    t.clock = BurstClock.restore(state.get("burst_clock"))
    term = state.get("terminated")
    t.terminated = [float(term[0]), float(term[1])] if term else None
