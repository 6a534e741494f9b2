"""What every collector returns, and the report-once notice board the collectors share.

A collector is anything with ``collect(now) -> Partial`` and ``close()``. Each one is
independent: a collector that cannot work (no NVML, no RDMA devices, no kernel log) says why
once and returns empty partials; it never raises into the agent loop.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

# kind ("gpu" | "nic" | "host") -> device id ("h0017/gpu3") -> metric -> value
DeviceValues = dict[str, dict[str, dict[str, float]]]


@dataclass(frozen=True, slots=True)
class LogLine:
    """One log line before the agent stamps host and job on it."""

    ts: float
    source: str  # kernel | training | nccl | agent
    line: str


@dataclass(slots=True)
class Partial:
    """Part of one host sample: some devices' metrics and some log lines."""

    devices: DeviceValues = field(default_factory=dict)
    logs: list[LogLine] = field(default_factory=list)

    def put(self, kind: str, device: str, metric: str, value: float) -> None:
        self.devices.setdefault(kind, {}).setdefault(device, {})[metric] = float(value)

    def merge(self, other: Partial) -> None:
        for kind, devs in other.devices.items():
            mine = self.devices.setdefault(kind, {})
            for dev, values in devs.items():
                mine.setdefault(dev, {}).update(values)
        self.logs.extend(other.logs)


class Collector(Protocol):
    name: str

    def collect(self, now: float) -> Partial: ...

    def close(self) -> None: ...


class Notices:
    """Say each problem once (per key) on stderr and keep it for the status output.

    ``clear(key)`` re-arms a key when the problem went away, so a second occurrence is
    reported again. ``pending()`` hands the new messages to the agent, which also publishes
    them as agent LogRecords.
    """

    def __init__(self, emit: Callable[[str], None] | None = None) -> None:
        self._emit = emit if emit is not None else _stderr
        self._active: dict[str, str] = {}
        self._new: list[str] = []
        self.history: list[str] = []

    def once(self, key: str, message: str) -> bool:
        if key in self._active:
            return False
        self._active[key] = message
        self._new.append(message)
        self.history.append(message)
        self._emit(message)
        return True

    def clear(self, key: str, message: str | None = None) -> None:
        if self._active.pop(key, None) is not None and message:
            self._new.append(message)
            self.history.append(message)
            self._emit(message)

    def active(self, key: str) -> bool:
        return key in self._active

    def pending(self) -> list[str]:
        out, self._new = self._new, []
        return out


def _stderr(message: str) -> None:
    print(f"aegis-agent: {message}", file=sys.stderr, flush=True)
