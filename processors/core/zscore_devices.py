"""The device side of the Z-score detector (Aegis §5.1): per device kind, which slot each
reported device has, which row each catalogue metric has, and the per-device streak
arrays that grow as devices join the job. Split from :mod:`processors.core.zscore`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from processors.core.base import beyond_few, gpu_id, local_id, nic_listed, nic_named
from schemas.inventory import Inventory
from schemas.metrics import Direction, metrics_for


def device_name(host: str, kind: str, local: str, alone: bool,
                inventory: Inventory | None = None) -> str:
    """Culprit name of a reported device: ``h/gpu3`` (for ``3``, ``gpu3`` or ``h/gpu3``),
    ``h``, and for a NIC ``nic_named``."""
    local = local_id(host, local)
    if kind == "gpu":
        digits = local[3:] if local.startswith("gpu") else local
        return gpu_id(host, int(digits)) if digits.isdigit() else f"{host}/{local}"
    if kind == "nic":
        return nic_named(inventory, host, local)
    return host if alone or local in ("", "host", host) else f"{host}/{local}"


class DeviceKind:
    """Per device kind: the slot map, the metric rows and the per-device streak state."""

    def __init__(self, kind: str, abs_tol: Mapping[str, float],
                 inventory: Inventory | None = None,
                 ranked: frozenset[tuple[str, int]] | None = None) -> None:
        self.kind = kind
        self.inventory = inventory  # names NICs by their index in the host's ``nics``
        self.ranked = ranked  # the job's (host, gpu) holding a rank; None: not known
        self.metrics = metrics_for(kind)
        self.row = {m.name: i for i, m in enumerate(self.metrics)}
        d = [m.direction for m in self.metrics]
        self.hi = np.array([x in (Direction.HIGH_BAD, Direction.BOTH) for x in d])
        self.lo = np.array([x in (Direction.LOW_BAD, Direction.BOTH) for x in d])
        self.counter = np.array([m.counter for m in self.metrics])
        self.floor = np.array([m.floor if m.abnormal else -np.inf for m in self.metrics])
        self.abnormal = np.array([m.abnormal for m in self.metrics], dtype=bool)
        self.tol = np.array([abs_tol.get(m.name, m.floor if m.abnormal else 1e-9)
                             for m in self.metrics])
        self.devices: list[tuple[str, str, str]] = []  # slot -> (name, host, local)
        self.slot: dict[str, int] = {}
        self.per_host: dict[str, int] = {}  # host -> how many of its devices are scored
        self.cap = 0
        rows = len(self.metrics)
        self.start = np.empty((rows, 0))  # streak start (ms), NaN when none
        self.last = np.empty((rows, 0))  # end of the last beyond sub-window (ms)
        self.flagged = np.empty((rows, 0), dtype=bool)  # an incident is open
        self.small = np.zeros(rows, dtype=np.int8)  # 1 while the group is too small
        self.history: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
        self._slots_cache: dict[tuple[str, tuple[str, ...]], tuple[Any, ...] | None] = {}
        self._rows_cache: dict[tuple[str, ...], tuple[Any, ...]] = {}

    def add_device(self, host: str, local: str, alone: bool = False, name: str = "") -> int:
        name = name or device_name(host, self.kind, local, alone, self.inventory)
        if name not in self.slot:
            self.slot[name] = len(self.devices)
            self.devices.append((name, host, local))
            self.per_host[host] = self.per_host.get(host, 0) + 1
            if len(self.devices) > self.cap:
                self.grow(max(8, 2 * self.cap))
        return self.slot[name]

    def grow(self, cap: int) -> None:
        pad = cap - self.cap
        self.start = np.pad(self.start, ((0, 0), (0, pad)), constant_values=np.nan)
        self.last = np.pad(self.last, ((0, 0), (0, pad)), constant_values=np.nan)
        self.flagged = np.pad(self.flagged, ((0, 0), (0, pad)))
        self.cap = cap

    def slots_for(self, host: str, ids: tuple[str, ...]) -> tuple[Any, ...] | None:
        """``(slots, selector, kept, unlisted)`` of a host's reported ids; None when an id
        repeats. ``kept`` (the columns scored) is None when all are; ``unlisted`` names the
        NICs the inventory does not list among the host's rails, which are not scored."""
        key = (host, ids)
        if key not in self._slots_cache:
            unique = len(set(ids)) == len(ids)
            kept = [c for c, i in enumerate(ids) if self._scored(host, i)]
            slots = np.array([self.add_device(host, ids[c], len(ids) == 1) for c in kept],
                             dtype=np.intp) if unique else None
            self._slots_cache[key] = None if slots is None else (
                slots, _selector(slots),
                None if len(kept) == len(ids) else np.array(kept, dtype=np.intp),
                [i for c, i in enumerate(ids) if c not in kept])
        return self._slots_cache[key]

    def _scored(self, host: str, local: str) -> bool:
        """A NIC the inventory lists among the host's rails; a GPU holding one of the job's
        ranks (a job using 4 of 8 GPUs leaves 4 idle: no peers of the busy ones)."""
        if self.kind == "nic":
            return nic_listed(self.inventory, host, local)
        if self.kind != "gpu" or self.ranked is None:
            return True
        name = device_name(host, "gpu", local, False)
        digits = name.rpartition("/gpu")[2]
        return not digits.isdigit() or (host, int(digits)) in self.ranked

    def rows_for(self, names: tuple[str, ...]) -> tuple[Any, ...]:
        """``(rows, selector, counter column, known names, unknown names)`` of metric names."""
        if names not in self._rows_cache:
            known = [n for n in names if n in self.row]
            rows = np.array([self.row[n] for n in known], dtype=np.intp)
            self._rows_cache[names] = (rows, _selector(rows), self.counter[rows][:, None],
                                       known, [n for n in names if n not in self.row])
        return self._rows_cache[names]

    def populations(self, side: np.ndarray, present: np.ndarray, max_hosts: int,
                    max_share: float) -> np.ndarray:
        """Metric rows whose devices past one side of the bound for T (``side``: rows x
        devices) span more than ``max(max_hosts, max_share x the hosts reporting)`` hosts: the job
        holds two populations (a pipeline stage, uneven experts, a hardware mix), not a few
        hosts that differ (Aegis §5.1's limit), so none of them is an outlier. Performance
        metrics only: an abnormal-operation metric should be 0 on every healthy device."""
        rows = np.nonzero(side.any(axis=1) & ~self.abnormal)[0]
        if not len(rows):
            return rows
        host_of = np.array([d[1] for d in self.devices[:side.shape[1]]], dtype=object)
        split = [r for r in rows if beyond_few(len(set(host_of[side[r]])),
                                               len(set(host_of[present[r]])), max_hosts, max_share)]
        return np.array(split, dtype=np.intp)


def _selector(idx: np.ndarray) -> Any:
    """A slice when the indices are one ascending run (fast basic indexing), else the array."""
    if len(idx) and (np.diff(idx) == 1).all():
        return slice(int(idx[0]), int(idx[-1]) + 1)
    return idx
