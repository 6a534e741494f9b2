"""Streaming cross-device Z-score (Aegis §5.1: a device beyond λ±2δ throughout T is an outlier).

The devices of a synchronous job move together. Per (job, metric, device kind) this detector
keeps each device's mean over tumbling event-time sub-windows of width w; when a sub-window
closes (watermark = newest event time − lateness) it takes the cross-device (n, mean, M2):
λ is that sub-window's mean (the job moves together, so a job-wide shift marks nobody) and δ
the cross-device std pooled over the sub-windows within T (Chan merge of M2). A device is
*beyond* when its sub-window value is past ``λ ± max(2δ, tol)``; abnormal-operation metrics
must also be above the catalogue floor. A device continuously beyond for T (not counting the sub-window
where the streak began) is flagged once per incident; :mod:`processors.core.correlate` turns
its flags into one Diagnosis. Layout, defaults and edge cases: docs/zscore.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from processors.core import zscore_state
from processors.core.base import Outputs, Rejection, local_id
from processors.core.correlate import DETECTOR, Correlator, MetricFlag
from processors.core.windows import closable_until_ms, starts_within, to_ms, window_start_ms
from processors.core.zscore_devices import DeviceKind, device_name
from schemas.errors import ConfigError
from schemas.inventory import Inventory
from schemas.metrics import DEVICE_KINDS
from schemas.records import DeviceGroup, TelemetryBatch

_MIN, _SUM = np.minimum.reduce, np.add.reduce  # = ndarray.min/.sum, minus their Python wrappers

DEFAULT_ABS_TOL: dict[str, float] = {
    "gpu_util_pct": 5.0, "gpu_sm_clock_mhz": 50.0, "gpu_power_w": 25.0, "gpu_temp_c": 5.0,
    "gpu_tensor_tflops": 5.0, "gpu_pcie_rx_bps": 1e8, "gpu_pcie_tx_bps": 1e8,
    "gpu_nvlink_rx_bps": 1e9, "gpu_nvlink_tx_bps": 1e9, "nic_tx_bps": 1e8, "nic_rx_bps": 1e8,
    "nic_link_up": 0.1, "host_cpu_util_pct": 5.0, "host_mem_used_pct": 5.0,
}  # abnormal metrics default to their catalogue floor; anything else to 1e-9


@dataclass(frozen=True, slots=True)
class ZScoreConfig:
    """Parameters of the §5.1 rule; seconds of event time unless named otherwise."""

    window_s: float = 600.0  # T: how long a device must stay beyond
    sub_window_s: float = 30.0  # w: statistics granularity
    lateness_s: float = 10.0  # allowed lateness / clock skew before a sample is late
    sigma: float = 2.0  # the 2 in λ±2δ
    min_devices: int = 4  # fewer devices in a sub-window: not scored (group_too_small)
    rel_tol: float = 0.05  # tolerance floor relative to |λ| (zero variance)
    abs_tol: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_ABS_TOL))
    gap_s: float = 60.0  # absence longer than this restarts a device's streak
    recover_s: float = 300.0  # not beyond for this long ends an incident
    correlate_wait_s: float = 60.0  # other metrics of a device may join the diagnosis
    dedup_horizon_s: float = 60.0  # how long (host, kind, ts) stay remembered past closing
    max_future_s: float = 300.0  # a lone host further ahead of the job clock is skewed
    max_abs: float = 1e15  # |value| above this is out_of_range (keeps float statistics sane)
    # "a few hosts differ" (§5.1's limit): past max(max_outlier_hosts, max_outlier_share of
    # the hosts) on one side of a performance metric, the job holds two populations
    max_outlier_hosts: int = 2
    max_outlier_share: float = 0.1
    # at least max(2, this share of a host's GPUs) slow together: the host (0: never)
    host_rollup_share: float = 0.5
    # NICs of at least this many hosts behind one ToR slow together, and at least
    # switch_min_share of the job's hosts behind it: the switch (0: never)
    switch_min_hosts: int = 3
    switch_min_share: float = 0.25

    def __post_init__(self) -> None:
        if not 0 < self.sub_window_s <= self.window_s or to_ms(self.sub_window_s) < 1:
            raise ConfigError(f"zscore: need 0 < sub_window_s ({self.sub_window_s}) <= "
                              f"window_s ({self.window_s})")
        if self.min_devices < 2 or self.sigma <= 0 or min(
                self.lateness_s, self.gap_s, self.recover_s, self.correlate_wait_s,
                self.dedup_horizon_s, self.max_future_s, self.rel_tol, self.max_abs,
                self.max_outlier_hosts, self.max_outlier_share, self.switch_min_hosts) < 0 \
                or not (0 <= self.host_rollup_share <= 1 and 0 <= self.switch_min_share <= 1):
            raise ConfigError("zscore: min_devices >= 2, sigma > 0, durations, "
                              "max_outlier_hosts, max_outlier_share and switch_min_hosts >= 0, "
                              "0 <= host_rollup_share, switch_min_share <= 1")


class ZScoreDetector:
    """Aegis §5.1 over one job's TelemetryBatches; contract in processors/core/base.py."""

    name = DETECTOR

    def __init__(self, job: str, config: ZScoreConfig | None = None,
                 inventory: Inventory | None = None) -> None:
        self.job = job
        self.cfg = cfg = config if config is not None else ZScoreConfig()
        self.w_ms = to_ms(cfg.sub_window_s)
        self.t_ms = to_ms(cfg.window_s)
        ranks = inventory.ranks.get(job) if inventory is not None else None
        ranked = frozenset(ranks.values()) if ranks else None  # (host, gpu) holding a rank
        self.ranked_hosts = frozenset(h for h, _ in ranked) if ranked else None
        self.kinds = {k: DeviceKind(k, cfg.abs_tol, inventory, ranked) for k in DEVICE_KINDS}
        self.hosts: set[str] = set()
        self.corr = Correlator(job, cfg.correlate_wait_s, inventory,
                               self.kinds["gpu"].per_host.__getitem__, cfg.host_rollup_share,
                               self._hosts_seen, cfg.switch_min_hosts, cfg.switch_min_share)
        self.max_ts: float | None = None
        self.closed_ms: int | None = None  # every sub-window ending at or before is closed
        self.open: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        self.seen: dict[int, dict[tuple[str, str], set[int]]] = {}  # start -> (host, kind) -> ts
        self.ahead: dict[str, float] = {}  # hosts reporting far ahead of the job clock
        self.unknown: set[str] = set()  # "kind/metric" already reported

    # ---- input -------------------------------------------------------------------------
    def _hosts_seen(self) -> set[str]:
        return self.hosts

    def observe(self, batch: TelemetryBatch) -> Outputs:
        out = Outputs()
        host, ts = batch.host, batch.ts
        if batch.job is not None and batch.job != self.job:
            return self._reject(out, host, "wrong_job", f"batch for job {batch.job}", ts)
        if not math.isfinite(ts):
            return self._reject(out, host, "not_finite", f"event time {ts!r}", 0.0)
        if self.ranked_hosts is not None and host not in self.ranked_hosts:
            self._once(out, host, f"{host}/*", "no_rank", ts, f"holds no rank of job {self.job} "
                       "in the inventory (a spare, a host leaving): not scored")
            return out  # idle beside the job, it is no peer of the ranks' hosts
        if self.max_ts is not None and ts > self.max_ts + self.cfg.max_future_s:
            self.ahead[host] = ts
            if len(self.ahead) < min(2, len(self.hosts | {host})):
                return self._reject(out, host, "clock_skew", f"ts {ts:.3f} is "
                                    f"{ts - self.max_ts:.0f}s ahead of the job clock", ts)
            self.ahead.clear()  # several hosts agree: the job clock really moved on
        else:
            self.ahead.pop(host, None)
        ts_ms = to_ms(ts)
        start = window_start_ms(ts_ms, self.w_ms)
        late = self.closed_ms is not None and start + self.w_ms <= self.closed_ms
        seen = self.seen.setdefault(start, {}) if not late else self.seen.get(start, {})
        offset = ts_ms - start
        dup: list[str] = []
        for kind, group in batch.devices.items():
            if offset in seen.get((host, kind), ()):
                dup.append(kind)
            elif late:
                self._reject(out, host, "late", f"{kind} sample for closed sub-window "
                             f"[{start / 1000:.3f}, {(start + self.w_ms) / 1000:.3f})", ts)
            elif kind not in self.kinds:
                self._once(out, host, f"{kind}/*", "unknown_kind", ts)
            else:
                seen.setdefault((host, kind), set()).add(offset)
                self._add(out, self.kinds[kind], start, host, ts, group)
        if dup:
            self._reject(out, host, "duplicate", f"{','.join(dup)} at ts {ts:.3f} already "
                         "counted", ts)
        if not late:
            self.hosts.add(host)
            self.max_ts = ts if self.max_ts is None else max(self.max_ts, ts)
            out.extend(self._close(self.max_ts - self.cfg.lateness_s))
        return out

    def advance(self, now: float) -> Outputs:
        """Move the job clock to ``now`` (newest event time on the job's inputs)."""
        if not math.isfinite(now):
            return Outputs()
        self.max_ts = now if self.max_ts is None else max(self.max_ts, now)
        return self._close(self.max_ts - self.cfg.lateness_s)

    def flush(self) -> Outputs:
        """End of input (a file, a test): close every open sub-window, emit what is pending.
        Moves the job clock past them, so later samples of those sub-windows are late."""
        if self.max_ts is None:
            return Outputs()
        c = self.cfg
        return self.advance(self.max_ts + c.lateness_s + c.sub_window_s + c.correlate_wait_s)

    def _add(self, out: Outputs, ks: DeviceKind, start: int, host: str, ts: float,
             group: DeviceGroup) -> None:
        found = ks.slots_for(host, tuple(group.ids))
        if found is None:
            self._reject(out, host, "duplicate_device", f"{ks.kind} ids {list(group.ids)}", ts)
            return
        slots, slot_sel, kept, unlisted = found
        rows, row_sel, counter, known, unknown = ks.rows_for(tuple(group.values))
        for m in unknown:
            self._once(out, host, f"{ks.kind}/{m}", "unknown_metric", ts)
        for i in unlisted:
            if ks.kind == "nic":
                self._once(out, host, f"{host}/{local_id(host, i)}", "unlisted_nic", ts,
                           "is not one of the host's rail NICs in the inventory: not scored")
            else:
                self._once(out, host, device_name(host, ks.kind, i, False), "no_rank", ts,
                           f"holds no rank of job {self.job} in the inventory: not scored")
        if not known or not len(slots):
            return
        try:
            vals = np.array([group.values[m] for m in known], dtype=np.float64)
        except ValueError:
            vals = np.empty((0, 0))
        if vals.shape != (len(known), len(slots) + len(unlisted)):
            self._reject(out, host, "bad_shape", f"{ks.kind} values do not match ids", ts)
            return
        if kept is not None:
            vals = vals[:, kept]
        ok: Any = 1.0
        if not (_MIN(vals, None) >= 0 and _SUM(vals, None) <= self.cfg.max_abs):  # else all clean
            with np.errstate(invalid="ignore"):
                bad = ~(np.abs(vals) <= self.cfg.max_abs) | (counter & (vals < 0))
            for r, d in zip(*np.nonzero(bad), strict=True):
                x, m = float(vals[r, d]), known[r]
                why = "not_finite" if not math.isfinite(x) else "out_of_range" \
                    if abs(x) > self.cfg.max_abs else "negative_counter"
                self._reject(out, host, why, f"telemetry from host {host} job {self.job}: "
                             f"metric {m}={x!r} on {ks.devices[slots[d]][0]} rejected", ts)
            vals[bad] = 0.0
            ok = ~bad
        win = self.open.setdefault(start, {})
        if ks.kind not in win or win[ks.kind][0].shape[1] < ks.cap:
            win[ks.kind] = self._widen(win.get(ks.kind), len(ks.metrics), ks.cap)
        total, count = win[ks.kind]
        ix = (row_sel, slot_sel) if isinstance(row_sel, slice) or isinstance(slot_sel, slice) \
            else (rows[:, None], slots[None, :])
        total[ix] += vals
        count[ix] += ok

    @staticmethod
    def _widen(arrays: tuple[np.ndarray, np.ndarray] | None, rows: int,
               cap: int) -> tuple[np.ndarray, np.ndarray]:
        total, count = np.zeros((rows, cap)), np.zeros((rows, cap))
        if arrays is not None:
            n = arrays[0].shape[1]
            total[:, :n], count[:, :n] = arrays
        return total, count

    # ---- windows -----------------------------------------------------------------------
    def _close(self, watermark: float) -> Outputs:
        out = Outputs()
        limit = closable_until_ms(watermark, self.w_ms)
        if self.closed_ms is not None and limit <= self.closed_ms:  # nothing new to close
            out.diagnoses.extend(self.corr.due(watermark))
            return out
        for start in sorted(s for s in self.open if s + self.w_ms <= limit):
            end = start + self.w_ms
            out.diagnoses.extend(self.corr.due(end / 1000, inclusive=False))
            arrays = self.open.pop(start)
            for kind in DEVICE_KINDS:
                if kind in arrays:
                    self._evaluate(out, self.kinds[kind], start, *arrays[kind])
        if self.closed_ms is None or limit > self.closed_ms:
            self.closed_ms = limit
            horizon = limit - to_ms(self.cfg.dedup_horizon_s) - self.w_ms
            for s in [s for s in self.seen if s < horizon]:
                del self.seen[s]
        out.diagnoses.extend(self.corr.due(watermark))
        return out

    def _evaluate(self, out: Outputs, ks: DeviceKind, start: int, total: np.ndarray,
                  count: np.ndarray) -> None:
        """Aegis §5.1 on one closed sub-window of one device kind, all metrics at once."""
        cfg, n, end = self.cfg, len(ks.devices), start + self.w_ms
        if total.shape[1] < n:
            total, count = self._widen((total, count), len(ks.metrics), n)
        present = count[:, :n] > 0
        x = np.divide(total[:, :n], count[:, :n], out=np.zeros((len(ks.metrics), n)),
                      where=present)
        n_s = present.sum(axis=1).astype(np.float64)
        safe = np.maximum(n_s, 1.0)
        mean_s = x.sum(axis=1) / safe  # λ: the devices move together, so λ is taken now
        m2_s = (((x - mean_s[:, None]) ** 2) * present).sum(axis=1)
        first = starts_within(end, self.t_ms, self.w_ms).start
        ks.history = [h for h in ks.history if h[0] >= first] + [(start, n_s, mean_s, m2_s)]
        n_t = np.sum([h[1] for h in ks.history], axis=0)
        m2_t = np.sum([h[3] for h in ks.history], axis=0)  # Chan merge, within-window part
        std = np.sqrt(np.maximum(m2_t / np.maximum(n_t, 1.0), m2_s / safe))  # δ over T
        half = np.maximum(cfg.sigma * std, np.maximum(ks.tol, cfg.rel_tol * np.abs(mean_s)))
        scored = ks.hi | ks.lo
        small = scored & (n_s > 0) & (n_s < cfg.min_devices)
        for r in np.nonzero(small & (ks.small == 0))[0]:
            self._reject(out, "", "group_too_small", f"{ks.kind} metric {ks.metrics[r].name}: "
                         f"{int(n_s[r])} devices < min_devices {cfg.min_devices}; not scored",
                         start / 1000)
        ks.small[small] = 1
        ok = scored & (n_s >= cfg.min_devices)
        ks.small[ok] = 0
        upper = np.maximum(mean_s + half, ks.floor)
        lower = mean_s - half
        high = ks.hi[:, None] & (x > upper[:, None])
        low = ks.lo[:, None] & (x < lower[:, None])
        evaluated = present & ok[:, None]
        beyond = (high | low) & evaluated
        s_arr, l_arr, f_arr = ks.start[:, :n], ks.last[:, :n], ks.flagged[:, :n]
        fresh = beyond & (np.isnan(s_arr) | (start - l_arr > to_ms(cfg.gap_s)))
        s_arr[fresh] = start
        s_arr[evaluated & ~beyond] = np.nan
        l_arr[beyond] = end
        due = beyond & (end - s_arr - self.w_ms >= self.t_ms)
        for side, name in ((due & high, "high"), (due & low, "low")):
            for r in ks.populations(side, present, cfg.max_outlier_hosts, cfg.max_outlier_share):
                due[r] &= ~side[r]  # none of them is an outlier: stays unflagged, streak kept
                self._once(out, "", f"{ks.kind}/{ks.metrics[r].name}/{name}", "two_populations",
                           start / 1000, f"past the bound for T on {int(side[r].sum())} devices"
                           " of many hosts: two populations, not a few hosts that differ")
        fire = due & ~f_arr
        f_arr |= fire
        for r, d in zip(*np.nonzero(fire), strict=True):
            name, host, local = ks.devices[d]
            hi_side = bool(high[r, d])
            self.corr.add(MetricFlag(
                device=name, device_kind=ks.kind, host=host, local=local,
                metric=ks.metrics[r].name, direction="high" if hi_side else "low",
                value=float(x[r, d]), mean=float(mean_s[r]), std=float(std[r]),
                bound=float(upper[r] if hi_side else lower[r]),
                window_s=cfg.window_s, sub_window_s=cfg.sub_window_s,
                streak_start=float(s_arr[r, d]) / 1000, flagged_at=end / 1000))
        had = f_arr.any(axis=0)
        f_arr &= ~(l_arr <= end - to_ms(cfg.recover_s))
        for d in np.nonzero(had & ~f_arr.any(axis=0))[0]:
            self.corr.release(ks.devices[d][0])

    # ---- rejections --------------------------------------------------------------------
    def _reject(self, out: Outputs, host: str, reason: str, detail: str, ts: float) -> Outputs:
        out.rejections.append(Rejection(DETECTOR, self.job, host, reason, detail, ts))
        return out

    def _once(self, out: Outputs, host: str, key: str, reason: str, ts: float,
              why: str = "is not in the metric catalogue") -> None:
        if key not in self.unknown:
            self.unknown.add(key)
            self._reject(out, host, reason, f"{key} {why}", ts)

    # ---- state (wire form: processors.core.zscore_state) ------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Plain msgpack/JSON-able state (ints, floats, strings, lists; no NaN, no numpy)."""
        return zscore_state.to_wire(self)

    @classmethod
    def restore(cls, state: Mapping[str, Any], job: str, config: ZScoreConfig | None = None,
                inventory: Inventory | None = None) -> ZScoreDetector:
        det = cls(job, config, inventory)
        zscore_state.load(det, state, job, inventory)
        return det
