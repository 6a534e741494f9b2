"""The Z-score detector's state in wire form (:mod:`processors.core.zscore`): plain
msgpack/JSON values, no NaN, no numpy; a snapshot taken under another metric catalogue is
remapped row by row."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from processors.core.correlate import Correlator
from schemas.errors import ConfigError
from schemas.inventory import Inventory

if TYPE_CHECKING:
    from processors.core.zscore import ZScoreDetector


def to_wire(det: ZScoreDetector) -> dict[str, Any]:
    """The detector's state: ints, floats, strings and lists."""
    kinds: dict[str, Any] = {}
    for k, ks in det.kinds.items():
        n = len(ks.devices)
        kinds[k] = {"metrics": [m.name for m in ks.metrics]}
        cells = np.nonzero(~np.isnan(ks.last[:, :n]) | ~np.isnan(ks.start[:, :n]))
        kinds[k] |= {
            "devices": [list(dev) for dev in ks.devices],
            "streak": [[int(r), int(d), _num(ks.start[r, d]), _num(ks.last[r, d]),
                        bool(ks.flagged[r, d])] for r, d in zip(*cells, strict=True)],
            "small": ks.small.tolist(),
            "history": [[s, a.tolist(), b.tolist(), c.tolist()] for s, a, b, c in ks.history],
        }
    return {"v": 1, "job": det.job, "sub_window_ms": det.w_ms, "max_ts": det.max_ts,
            "closed_ms": det.closed_ms, "hosts": sorted(det.hosts),
            "ahead": dict(det.ahead), "unknown": sorted(det.unknown), "kinds": kinds,
            "open": [[s, k, t[:, :len(det.kinds[k].devices)].tolist(),
                      c[:, :len(det.kinds[k].devices)].astype(np.int64).tolist()]
                     for s, win in sorted(det.open.items()) for k, (t, c) in win.items()],
            "seen": [[s, [[h, k, sorted(ts)] for (h, k), ts in sorted(keys.items())]]
                     for s, keys in sorted(det.seen.items())],
            "corr": det.corr.snapshot()}


def load(det: ZScoreDetector, state: Mapping[str, Any], job: str,
         inventory: Inventory | None) -> None:
    """Fill a fresh detector from :func:`to_wire`'s form."""
    if state.get("v") != 1 or state.get("sub_window_ms") != det.w_ms:
        raise ConfigError(f"zscore snapshot v{state.get('v')} with sub-window "
                          f"{state.get('sub_window_ms')} ms does not fit {det.w_ms} ms")
    det.max_ts, det.closed_ms = state["max_ts"], state["closed_ms"]
    det.hosts, det.ahead = set(state["hosts"]), dict(state["ahead"])
    det.unknown = set(state["unknown"])
    remaps = {}
    for k, ks_state in state["kinds"].items():
        ks = det.kinds[k]
        remaps[k] = remap = _Remap(ks_state["metrics"], ks.row)  # catalogue may differ
        for name, host, local in ks_state["devices"]:
            ks.add_device(host, local, name=name)
        for r, d, s, last, flag in ks_state["streak"]:
            if remap.new[r] is not None:
                r = remap.new[r]
                ks.start[r, d] = np.nan if s is None else s
                ks.last[r, d] = np.nan if last is None else last
                ks.flagged[r, d] = flag
        ks.small = remap(ks_state["small"]).astype(np.int8)
        ks.history = [(s, remap(a), remap(b), remap(c)) for s, a, b, c in ks_state["history"]]
    for s, k, t, c in state["open"]:
        ks = det.kinds[k]
        arrays = (remaps[k](t), remaps[k](c))
        det.open.setdefault(s, {})[k] = det._widen(arrays, len(ks.metrics), ks.cap)
    det.seen = {s: {(h, k): set(ts) for h, k, ts in keys} for s, keys in state["seen"]}
    det.corr = Correlator.restore(state["corr"], job, det.cfg.correlate_wait_s, inventory,
                                  det.corr.host_gpus, det.cfg.host_rollup_share,
                                  det._hosts_seen, det.cfg.switch_min_hosts,
                                  det.cfg.switch_min_share)


class _Remap:
    """Rows of a snapshot taken under another metric catalogue → this catalogue's rows."""

    def __init__(self, names: list[str], row: Mapping[str, int]) -> None:
        self.new = [row.get(n) for n in names]
        self.keep = [i for i, r in enumerate(self.new) if r is not None]
        self.dest = [r for r in self.new if r is not None]
        self.rows = len(row)

    def __call__(self, values: Any) -> np.ndarray:
        old = np.asarray(values, dtype=np.float64)
        out = np.zeros((self.rows, *old.shape[1:]))
        out[self.dest] = old[self.keep]
        return out


def _num(x: float) -> float | None:
    return None if math.isnan(x) else float(x)
