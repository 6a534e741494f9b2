"""Simulator throughput: a healthy 1,250-host (10,000-GPU) job at 1 Hz, all topics, to a file.

    python bench/simulate.py            # 600 simulated seconds (goal: >= 20x real time)
    python bench/simulate.py --quick    # 60 simulated seconds, well within a minute
    python bench/simulate.py --hosts 200 --hosts-per-job 4 --scenario mixed --duration 400 \
        --mixed-faults 50 --mixed-spacing 4          # 50 overlapping faults on 50 jobs

Prints progress, then one JSON object as the last line:
{"hosts":1250,"sim_s":600,"wall_s":...,"x_realtime":...,"records":...,"bytes":...}
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from producers.sim.simulation import SimConfig, Simulation  # noqa: E402
from schemas.recording import RecordingWriter  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="60 simulated seconds instead of 600")
    p.add_argument("--hosts", type=int, default=1250)
    p.add_argument("--duration", type=float, default=None, help="simulated seconds")
    p.add_argument("--hosts-per-job", type=int, default=0, help="0 (default): one job")
    p.add_argument("--scenario", default="healthy")
    p.add_argument("--mixed-faults", type=int, default=None)
    p.add_argument("--mixed-spacing", type=float, default=90.0)
    p.add_argument("--out", help="recording path (default: a temporary file, deleted after)")
    args = p.parse_args(argv)
    duration = args.duration or (60.0 if args.quick else 600.0)
    cfg = SimConfig(hosts=args.hosts, hosts_per_job=args.hosts_per_job or None,
                    scenario=args.scenario, seed=1, duration_s=duration,
                    mixed_faults=args.mixed_faults, mixed_spacing_s=args.mixed_spacing)
    t0 = time.monotonic()
    sim = Simulation(cfg)
    setup_s = time.monotonic() - t0
    with tempfile.TemporaryDirectory(prefix="aegis-bench-") as tmp:
        path = args.out or os.path.join(tmp, "bench.aegis")
        with RecordingWriter(path, meta=sim.header_meta()) as writer:
            res = sim.run(writer)
        size = os.path.getsize(path)
    x = res.sim_s / res.wall_s if res.wall_s > 0 else float("inf")
    print(f"simulated {res.sim_s:.0f} s of {args.hosts} hosts ({args.hosts * 8} GPUs) in "
          f"{res.wall_s:.1f} s wall (+{setup_s:.1f} s setup): {x:.1f}x real time, "
          f"{res.records} records, {size / 1e6:.0f} MB file", file=sys.stderr)
    print(json.dumps({"hosts": args.hosts, "scenario": args.scenario, "faults": len(res.truth),
                      "sim_s": res.sim_s, "wall_s": round(res.wall_s, 3),
                      "x_realtime": round(x, 2), "records": res.records, "bytes": size,
                      "by_topic": res.by_topic, "setup_s": round(setup_s, 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
