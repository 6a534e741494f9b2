"""Decode speed per input record kind: bare msgpack, our decode, and the checked path, side by side.

    python bench/decode.py            # 64 simulated hosts, 5 repeats
    python bench/decode.py --quick    # 32 hosts, 3 repeats, a few seconds

For each input topic (telemetry, logs, ccl) it times, over the same simulated records:
``unpack_us`` (``msgpack.unpackb`` alone: the floor), ``decode_us`` (``schemas.codec.decode``,
what the pipeline runs: fast path, checked path on anything unusual) and ``checked_us``
(unpack + ``from_wire``, every field through ``schemas/_fields.py``). Each figure is the best
of the repeats, in microseconds per record. Prints a table on stderr, then one JSON object as
the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import msgpack  # noqa: E402

from processors.pipeline import RECORD_TYPES, input_kind  # noqa: E402
from producers.sim.simulation import SimConfig, Simulation  # noqa: E402
from schemas.codec import decode  # noqa: E402


def sample(hosts: int, duration: float) -> dict[str, list[bytes]]:
    """Encoded records per input kind from one simulated job, after its CCL start-up."""
    cfg = SimConfig(hosts=hosts, hosts_per_job=None, scenario="healthy", seed=7,
                    duration_s=duration)
    steady = cfg.start_ts + cfg.init_s + 2 * cfg.interval_s
    out: dict[str, list[bytes]] = {}
    for topic, _key, ts, value in Simulation(cfg).iter_encoded():
        kind = input_kind(topic)
        if kind is not None and ts >= steady:
            out.setdefault(kind, []).append(value)
    return out


def best_us(fn: Callable[[bytes], object], values: list[bytes], repeats: int) -> float:
    """Best time over ``repeats`` passes, in microseconds per record."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for v in values:
            fn(v)
        best = min(best, time.perf_counter() - t0)
    return best / len(values) * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="32 hosts, 3 repeats")
    p.add_argument("--hosts", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    a = p.parse_args(argv)
    hosts = a.hosts or (32 if a.quick else 64)
    repeats = a.repeats or (3 if a.quick else 5)
    records = sample(hosts, 20.0 if a.quick else 30.0)
    result: dict[str, object] = {"hosts": hosts, "repeats": repeats, "quick": a.quick}
    print(f"{'kind':10} {'records':>8} {'bytes':>6} {'unpack_us':>10} {'decode_us':>10} "
          f"{'checked_us':>11} {'decode/unpack':>14} {'checked/decode':>15}", file=sys.stderr)
    for kind in ("telemetry", "logs", "ccl"):
        values = records.get(kind, [])
        if not values:
            continue
        rtype: Any = RECORD_TYPES[kind]
        bad = [v for v in values if not isinstance(decode(rtype, v), rtype)]
        if bad:
            raise SystemExit(f"{kind}: {len(bad)} simulated records did not decode")

        def unpack(v: bytes) -> object:
            return msgpack.unpackb(v, raw=False, strict_map_key=True)

        def ours(v: bytes, rtype: Any = rtype) -> object:
            return decode(rtype, v)

        def checked(v: bytes, rtype: Any = rtype) -> object:
            return rtype.from_wire(msgpack.unpackb(v, raw=False, strict_map_key=True))

        u = best_us(unpack, values, repeats)
        d = best_us(ours, values, repeats)
        c = best_us(checked, values, repeats)
        size = sum(map(len, values)) / len(values)
        result[kind] = {"records": len(values), "mean_bytes": round(size),
                        "unpack_us": round(u, 2), "decode_us": round(d, 2),
                        "checked_us": round(c, 2), "decode_over_unpack": round(d / u, 2),
                        "checked_over_decode": round(c / d, 2)}
        print(f"{kind:10} {len(values):8d} {size:6.0f} {u:10.2f} {d:10.2f} {c:11.2f} "
              f"{d / u:14.2f} {c / d:15.2f}", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
