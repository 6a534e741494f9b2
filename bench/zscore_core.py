"""Cost of the pure §5.1 Z-score core on a 10,000-GPU job at 1 Hz (no Kafka, no Faust).

Each of 1,250 hosts sends one TelemetryBatch per second: 8 GPUs, 8 NICs and the host, each
with every catalogue metric of its kind (``values_per_batch`` device-metric values). The
target is 1,250 batches/s on one core. Batches are built before timing; only ``observe`` is
timed (it closes sub-windows as the clock passes them: ``window_close_ms``).

    python bench/zscore_core.py --quick     # 70 s of event time, two sub-window closes
    python bench/zscore_core.py             # 330 s of event time

The last line printed is a JSON object with the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import msgpack
import numpy as np
import orjson

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from processors.core.zscore import ZScoreDetector  # noqa: E402
from schemas.metrics import metrics_for  # noqa: E402
from schemas.records import DeviceGroup, TelemetryBatch  # noqa: E402

IDS = {"gpu": tuple(str(i) for i in range(8)), "nic": tuple(f"mlx5_{i}" for i in range(8)),
       "host": ("host",)}


def device_groups(rng: np.random.Generator, variants: int) -> list[dict[str, DeviceGroup]]:
    """A pool of realistic per-host groups (values around 100 with 2 % noise)."""
    pool = []
    for _ in range(variants):
        groups = {}
        for kind, ids in IDS.items():
            names = [m.name for m in metrics_for(kind)]
            mat = 100.0 * (1 + 0.02 * rng.standard_normal((len(names), len(ids))))
            groups[kind] = DeviceGroup(ids, {m: tuple(r.tolist()) for m, r in
                                             zip(names, mat, strict=True)})
        pool.append(groups)
    return pool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="70 s of event time instead of 330 s")
    ap.add_argument("--hosts", type=int, default=1250)
    args = ap.parse_args()
    seconds = 70 if args.quick else 330
    rng = np.random.default_rng(0)
    pool = device_groups(rng, 16)
    t0 = 1_700_000_010.0  # 30-s aligned
    hosts = [f"h{i:05d}" for i in range(args.hosts)]
    values = sum(len(g.ids) * len(g.values) for g in pool[0].values())
    det = ZScoreDetector("bench")
    per_call = np.empty(seconds * len(hosts))
    close_at: list[int] = []
    k = 0
    for s in range(seconds):
        batches = [TelemetryBatch(h, t0 + s + 0.001 * (i % 7), pool[(i + s) % len(pool)], "bench")
                   for i, h in enumerate(hosts)]
        for b in batches:
            before = det.closed_ms
            t = time.perf_counter_ns()
            out = det.observe(b)
            per_call[k] = time.perf_counter_ns() - t
            if det.closed_ms != before and before is not None:
                close_at.append(k)
            if out.rejections:
                raise SystemExit(f"unexpected rejection: {out.rejections[0]}")
            k += 1
    steady = np.delete(per_call, close_at)
    close_ns = per_call[close_at]
    mean_us = float(per_call.mean()) / 1e3
    t_snap = time.perf_counter()
    snap = det.snapshot()
    snap_s = time.perf_counter() - t_snap
    packed = msgpack.packb(snap)
    t_snap = time.perf_counter()
    ZScoreDetector.restore(msgpack.unpackb(packed, strict_map_key=False), "bench")
    restore_s = time.perf_counter() - t_snap
    result = {
        "bench": "zscore_core", "quick": args.quick, "hosts": len(hosts),
        "gpus": 8 * len(hosts), "batches": int(k), "event_seconds": seconds,
        "values_per_batch": values,
        "batch_us_mean": round(mean_us, 2),
        "batch_us_p50": round(float(np.percentile(steady, 50)) / 1e3, 2),
        "batch_us_p99": round(float(np.percentile(steady, 99)) / 1e3, 2),
        "device_metric_update_ns": round(mean_us * 1e3 / values, 1),
        "batches_per_s_one_core": round(1e6 / mean_us),
        "target_batches_per_s": len(hosts),
        "headroom_x": round(1e6 / mean_us / len(hosts), 2),
        "window_closes": len(close_at),
        "window_close_ms": round(float(np.mean(close_ns)) / 1e6, 2) if close_at else None,
        "snapshot_ms": round(snap_s * 1e3, 1), "snapshot_msgpack_mib": round(len(packed) / 2**20, 2),
        "restore_ms": round(restore_s * 1e3, 1),
    }
    print(orjson.dumps(result).decode())


if __name__ == "__main__":
    main()
