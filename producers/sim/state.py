"""Mutable per-run and per-tick state shared by the workload, the faults and the renderer.

Arrays are indexed by host (H), local device (8), metric (catalogue order), CCL entry (E,
see topology) and op slot (K = 2 collective kinds per communicator).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from schemas.metrics import metrics_for

GPU_METRICS = tuple(m.name for m in metrics_for("gpu"))
NIC_METRICS = tuple(m.name for m in metrics_for("nic"))
HOST_METRICS = tuple(m.name for m in metrics_for("host"))
GI = {n: i for i, n in enumerate(GPU_METRICS)}
NI = {n: i for i, n in enumerate(NIC_METRICS)}
HI = {n: i for i, n in enumerate(HOST_METRICS)}

INIT, RUNNING, HUNG, DEAD = "init", "running", "hung", "dead"


def put(vec: np.ndarray, index: dict[str, int], name: str, value: float, add: bool = False) -> None:
    """Set (or add to) metric ``name`` in one device's vector; a metric the catalogue does
    not have is skipped, so the simulator follows catalogue changes."""
    i = index.get(name)
    if i is not None:
        vec[i] = vec[i] + value if add else value


@dataclass(slots=True)
class JobState:
    """Event-time state of one job's training loop."""

    iter_s: float  # healthy iteration time, seconds
    start_ts: float
    status: str = INIT
    progress: float = 0.0  # iterations completed (fractional)
    slow: float = 1.0  # iteration-time factor this tick, set by faults (1 = healthy)
    paused: bool = False  # no progress this tick (a link is down)
    init_fails: bool = False  # communicator init fails: never runs (config_error)
    hang_ts: float | None = None
    dead_ts: float | None = None
    next_log_iter: int = 10

    def hang(self, ts: float) -> None:
        if self.status in (INIT, RUNNING):
            self.status, self.hang_ts = HUNG, ts

    def kill(self, ts: float) -> None:
        if self.status != DEAD:
            self.status, self.dead_ts = DEAD, ts


@dataclass(slots=True)
class TickArrays:
    """Everything one tick emits, before rendering. Faults edit these in place."""

    t: float
    gpu: np.ndarray  # (H, 8, len(GPU_METRICS))
    nic: np.ndarray  # (H, 8, len(NIC_METRICS))
    host: np.ndarray  # (H, len(HOST_METRICS))
    cl: np.ndarray  # (H, E, K) int64
    wr: np.ndarray
    wc: np.ndarray
    seq: np.ndarray
    td: np.ndarray  # (H, E, K) float64, µs
    n: np.ndarray  # (H, E, K) float64, µs
    last: np.ndarray  # (H, E) float64, event time
    ccl_hosts: np.ndarray  # (H,) bool: emit a CCL record for this host
    pending: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)
    dropped: dict[int, set[int]] = field(default_factory=dict)  # host -> entries not reported
    dark: set[int] = field(default_factory=set)  # hosts powered off: no telemetry, no CCL

    def irregular(self) -> set[int]:
        """Hosts whose CCL record cannot use the fixed layout this tick."""
        return {h for h, _ in self.pending} | set(self.dropped)


class LogLine(NamedTuple):
    ts: float
    seq: int
    host: int
    source: str
    line: str


class LogQueue:
    """Log lines scheduled at any future event time, released in time order."""

    def __init__(self) -> None:
        self._heap: list[LogLine] = []
        self._seq = 0
        self.dark: dict[int, float] = {}  # host -> event time it lost power: no lines after

    def go_dark(self, host: int, ts: float) -> None:
        """``host`` writes no line (agent heartbeats included) from ``ts`` on."""
        self.dark[host] = min(ts, self.dark.get(host, ts))

    def add(self, ts: float, host: int, source: str, line: str) -> None:
        heapq.heappush(self._heap, LogLine(ts, self._seq, host, source, line))
        self._seq += 1

    def pop_before(self, ts: float) -> list[LogLine]:
        out = []
        heap = self._heap
        dark = self.dark
        while heap and heap[0][0] < ts:
            ll = heapq.heappop(heap)
            if not dark or ll.host not in dark or ll.ts < dark[ll.host]:
                out.append(ll)
        return out

    def __len__(self) -> int:
        return len(self._heap)
