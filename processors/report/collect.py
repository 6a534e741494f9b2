"""The report's second pass over a recording: the telemetry of flagged devices' metrics and
every communicator's CL / WR−WC / TD / seq, bucketed in event time.

Reads the recorded bytes with plain msgpack (no validation: records the engine rejected
are skipped here too when malformed). Pure given the entries.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from processors.core.zscore import ZScoreConfig
from processors.core.zscore_devices import device_name
from processors.pipeline import input_kind
from schemas.inventory import Inventory
from schemas.metrics import metrics_for
from schemas.recording import RecordingEntry


def _unpack(value: bytes) -> dict[str, Any] | None:
    try:
        obj = msgpack.unpackb(value, raw=False, strict_map_key=False)
    except Exception:  # malformed bytes were dead-lettered by the engine
        return None
    return obj if isinstance(obj, dict) else None


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    f = float(x)
    return f if math.isfinite(f) else None


# ---- telemetry -----------------------------------------------------------------------
@dataclass
class MetricSeries:
    """One device's metric against the job's λ and λ±σδ per sub-window (Aegis §5.1)."""

    job: str
    device_kind: str
    metric: str
    device: str
    t: list[float] = field(default_factory=list)  # sub-window starts
    value: list[float] = field(default_factory=list)  # the device's mean (nan: absent)
    mean: list[float] = field(default_factory=list)  # λ across the job's devices
    std: list[float] = field(default_factory=list)  # δ pooled over the trailing T
    upper: list[float] = field(default_factory=list)  # detector's upper bound (with floors)
    lower: list[float] = field(default_factory=list)
    sigma: float = 2.0
    sub_window_s: float = 30.0


class _Grid:
    """Per sub-window sums and counts of one (job, kind, metric) over the job's devices."""

    def __init__(self, inventory: Inventory | None = None) -> None:
        self.inventory = inventory  # names NICs as the detector does (zscore_devices)
        self.slot: dict[str, int] = {}
        self.sums: dict[int, np.ndarray] = {}
        self.counts: dict[int, np.ndarray] = {}
        self._slots: dict[tuple[str, tuple[str, ...]], np.ndarray] = {}

    def slots(self, kind: str, host: str, ids: tuple[str, ...]) -> np.ndarray:
        key = (host, ids)
        got = self._slots.get(key)
        if got is None:
            alone = len(ids) == 1
            got = np.array([self.slot.setdefault(device_name(host, kind, i, alone, self.inventory),
                                                 len(self.slot)) for i in ids], dtype=np.intp)
            self._slots[key] = got
        return got

    def add(self, start: int, idx: np.ndarray, vals: np.ndarray) -> None:
        n = len(self.slot)
        s, c = self.sums.get(start), self.counts.get(start)
        if s is None or c is None or len(s) < n:
            grown_s, grown_c = np.zeros(max(n, 8)), np.zeros(max(n, 8))
            if s is not None and c is not None:
                grown_s[:len(s)], grown_c[:len(c)] = s, c
            s, c = self.sums[start], self.counts[start] = grown_s, grown_c
        ok = np.isfinite(vals)
        np.add.at(s, idx[ok], vals[ok])
        np.add.at(c, idx[ok], 1.0)


class TelemetryCollector:
    """Collects the metrics named in ``targets``: {(job, device kind): {metric, ...}}."""

    def __init__(self, targets: Mapping[tuple[str, str], set[str]], sub_window_s: float,
                 inventory: Inventory | None = None) -> None:
        self.inventory = inventory
        self.targets = {k: set(v) for k, v in targets.items()}
        self.jobs = {j for j, _ in self.targets}
        self.w_ms = max(1, int(round(sub_window_s * 1000)))
        self.sub_window_s = sub_window_s
        self.grids: dict[tuple[str, str, str], _Grid] = {}

    def add(self, rec: Mapping[str, Any]) -> None:
        job, host, ts = rec.get("job"), rec.get("host"), _num(rec.get("ts"))
        devices = rec.get("devices")
        if job not in self.jobs or not isinstance(host, str) or ts is None \
                or not isinstance(devices, dict):
            return
        ts_ms = math.floor(ts * 1000.0 + 0.5)
        start = ts_ms - ts_ms % self.w_ms
        for kind, group in devices.items():
            wanted = self.targets.get((job, kind))
            if not wanted or not isinstance(group, dict):
                continue
            ids, values = group.get("ids"), group.get("values")
            if not isinstance(ids, list) or not isinstance(values, dict):
                continue
            for metric in wanted:
                vals = values.get(metric)
                if not isinstance(vals, list) or len(vals) != len(ids):
                    continue
                try:
                    arr = np.asarray(vals, dtype=np.float64)
                except (TypeError, ValueError):
                    continue
                grid = self.grids.get((job, kind, metric))
                if grid is None:
                    grid = self.grids[(job, kind, metric)] = _Grid(self.inventory)
                grid.add(start, grid.slots(kind, host, tuple(map(str, ids))), arr)

    def series(self, job: str, kind: str, metric: str, device: str,
               cfg: ZScoreConfig) -> MetricSeries | None:
        """The device's series and the job's λ, δ and bounds, as the detector computes them
        (processors.core.zscore: λ per sub-window, δ pooled over T, tolerance floors)."""
        grid = self.grids.get((job, kind, metric))
        if grid is None or device not in grid.slot:
            return None
        spec = {m.name: m for m in metrics_for(kind)}.get(metric)
        abnormal = spec is not None and spec.abnormal
        tol = cfg.abs_tol.get(metric, spec.floor if spec is not None and abnormal else 1e-9)
        floor = spec.floor if spec is not None and abnormal else -math.inf
        out = MetricSeries(job, kind, metric, device, sigma=cfg.sigma,
                           sub_window_s=self.sub_window_s)
        slot, t_ms = grid.slot[device], int(round(cfg.window_s * 1000))
        history: list[tuple[int, float, float]] = []
        for start in sorted(grid.sums):
            s, c = grid.sums[start], grid.counts[start]
            present = c > 0
            x = np.divide(s, c, out=np.zeros_like(s), where=present)
            n = float(present.sum())
            if n == 0:
                continue
            mean = float(x[present].sum() / n)
            m2 = float((((x - mean) ** 2) * present).sum())
            history = [h for h in history if h[0] > start - t_ms] + [(start, n, m2)]
            pooled = sum(h[2] for h in history) / max(1.0, sum(h[1] for h in history))
            std = math.sqrt(max(pooled, m2 / n))
            half = max(cfg.sigma * std, tol, cfg.rel_tol * abs(mean))
            out.t.append(start / 1000)
            out.value.append(float(x[slot]) if slot < len(c) and c[slot] > 0 else math.nan)
            out.mean.append(mean)
            out.std.append(std)
            out.upper.append(max(mean + half, floor))
            out.lower.append(mean - half)
        return out


# ---- CCL -----------------------------------------------------------------------------
@dataclass
class CommData:
    """One communicator's per-rank CL, WR−WC, TD and seq of its pacing op, per bucket."""

    job: str
    comm: str
    size: int
    op: str  # pacing op: AllReduce when present, else the first op reported
    members: dict[int, tuple[str, int]] = field(default_factory=dict)  # rank -> (host, gpu)
    cl: np.ndarray = field(default_factory=lambda: np.empty((0, 0)))
    outstanding: np.ndarray = field(default_factory=lambda: np.empty((0, 0)))
    td: np.ndarray = field(default_factory=lambda: np.empty((0, 0)))
    seq: np.ndarray = field(default_factory=lambda: np.empty((0, 0)))
    ops: set[str] = field(default_factory=set)

    @property
    def hosts(self) -> set[str]:
        return {h for h, _ in self.members.values()}


class CCLCollector:
    """Buckets of ``bucket_s`` from ``t0``; the newest sample in a bucket wins."""

    def __init__(self, t0: float, bucket_s: float, n_buckets: int,
                 jobs: set[str] | None = None) -> None:
        self.t0, self.bucket_s, self.n = t0, bucket_s, max(1, n_buckets)
        self.jobs = jobs
        self.comms: dict[tuple[str, str], CommData] = {}

    def _comm(self, job: str, comm: str, size: int, ops: list[Any]) -> CommData:
        cd = self.comms.get((job, comm))
        if cd is None:
            names = [o[0] for o in ops if isinstance(o, list | tuple) and o]
            op = "AllReduce" if "AllReduce" in names else (names[0] if names else "")
            shape = (size, self.n)
            cd = CommData(job, comm, size, op, cl=np.full(shape, np.nan),
                          outstanding=np.full(shape, np.nan), td=np.full(shape, np.nan),
                          seq=np.full(shape, np.nan))
            self.comms[(job, comm)] = cd
        return cd

    def add(self, rec: Mapping[str, Any]) -> None:
        job, host, ts = rec.get("job") or rec.get("host"), rec.get("host"), _num(rec.get("ts"))
        ranks = rec.get("ranks")
        if not isinstance(job, str) or (self.jobs is not None and job not in self.jobs) \
                or ts is None or not isinstance(ranks, list) or not isinstance(host, str):
            return
        col = int((ts - self.t0) // self.bucket_s)
        if not 0 <= col < self.n:
            return
        for r in ranks:
            if not isinstance(r, dict):
                continue
            comm, size, rank, ops = r.get("comm"), r.get("size"), r.get("rank"), r.get("ops")
            if not isinstance(comm, str) or not isinstance(size, int) or not isinstance(rank, int) \
                    or not 0 <= rank < size or size > 65536 or not isinstance(ops, list):
                continue
            cd = self._comm(job, comm, size, ops)
            if rank >= cd.size:
                continue
            gpu = r.get("gpu")
            cd.members[rank] = (host, gpu if isinstance(gpu, int) else -1)
            cl = wr = wc = 0.0
            for o in ops:
                if not isinstance(o, list | tuple) or len(o) != 7:
                    continue
                cd.ops.add(str(o[0]))
                cl, wr, wc = cl + (_num(o[1]) or 0.0), wr + (_num(o[2]) or 0.0), wc + (_num(o[3]) or 0.0)
                if o[0] == cd.op:
                    cd.seq[rank, col] = _num(o[4]) or 0.0
                    td = _num(o[5])
                    cd.td[rank, col] = td if td else np.nan
            cd.cl[rank, col] = cl
            cd.outstanding[rank, col] = wr - wc


# ---- the pass ------------------------------------------------------------------------
def collect(entries: Iterable[RecordingEntry], telemetry: TelemetryCollector | None,
            ccl: CCLCollector | None, jobs: set[str] | None = None) -> int:
    """Feed the telemetry and CCL entries (of ``jobs``, when given) to the collectors."""
    n = 0
    tel_jobs = telemetry.jobs if telemetry is not None else set()
    for e in entries:
        if jobs is not None and e.key not in jobs:
            continue
        kind = input_kind(e.topic)
        if kind == "telemetry" and telemetry is not None and e.key in tel_jobs:
            rec = _unpack(e.value)
            if rec is not None:
                telemetry.add(rec)
                n += 1
        elif kind == "ccl" and ccl is not None:
            rec = _unpack(e.value)
            if rec is not None:
                ccl.add(rec)
                n += 1
    return n
