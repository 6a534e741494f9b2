"""Replay speed: the in-process engine over a recording of one 1,000-host job (all topics).

    python bench/replay.py            # one hour of event time (goal: >= 60x real time, i.e.
                                      # the hour replayed in <= 60 s); the recording (~19 GB)
                                      # is simulated once and cached under .cache/
    python bench/replay.py --quick    # 30 s of event time, well within a minute; the hour is
                                      # EXTRAPOLATED from the steady-state rate (labelled)

x-realtime = event seconds replayed / wall seconds. The first ``init_s`` (10 s) of a simulated
job has telemetry but no CCL traffic, so the steady-state figure (after it) is the one that
extrapolates. Prints progress on stderr, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from processors.diagnose import load_inventory  # noqa: E402
from processors.replay import replay_entries  # noqa: E402
from processors.settings import PipelineConfig  # noqa: E402
from producers.sim.simulation import SimConfig, Simulation  # noqa: E402
from schemas.recording import RecordingEntry, RecordingWriter, read_recording  # noqa: E402

GOAL_X = 60.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def recording(hosts: int, duration: float, scenario: str) -> tuple[str, SimConfig, float]:
    """The cached recording (simulated on first use): path, config, generation seconds."""
    cfg = SimConfig(hosts=hosts, hosts_per_job=None, scenario=scenario, seed=7,
                    duration_s=duration, fault_at_s=min(120.0, duration / 2))
    cache = os.path.join(ROOT, ".cache")
    os.makedirs(cache, exist_ok=True)
    path = os.path.join(cache, f"bench-replay-{scenario}-{hosts}h-{duration:.0f}s-s7.aegis")
    if os.path.exists(path):
        return path, cfg, 0.0
    print(f"simulating {duration:.0f} s of {hosts} hosts into {path} (once; ~{hosts * duration * 5200 / 1e9:.1f} GB)",
          file=sys.stderr, flush=True)
    t0 = time.monotonic()
    sim = Simulation(cfg)
    tmp = path + ".part"
    with RecordingWriter(tmp, meta=sim.header_meta()) as w:
        sim.run(w)
    os.replace(tmp, path)
    return path, cfg, time.monotonic() - t0


class Clock:
    """Passes entries through, noting the wall time at the first steady-state entry."""

    def __init__(self, steady_from: float) -> None:
        self.steady_from = steady_from
        self.t_steady: float | None = None
        self.steady_records = 0
        self.last_ts = 0.0

    def watch(self, entries: Iterator[RecordingEntry]) -> Iterator[RecordingEntry]:
        for e in entries:
            if e.ts >= self.steady_from:
                if self.t_steady is None:
                    self.t_steady = time.perf_counter()
                self.steady_records += 1
            self.last_ts = max(self.last_ts, e.ts)
            yield e


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="30 simulated seconds; extrapolate")
    p.add_argument("--hosts", type=int, default=1000)
    p.add_argument("--duration", type=float, default=None, help="event seconds (default 3600)")
    p.add_argument("--scenario", default="nic_ecn")
    a = p.parse_args(argv)
    duration = a.duration or (30.0 if a.quick else 3600.0)
    path, cfg, gen_s = recording(a.hosts, duration, a.scenario)
    header, entries = read_recording(path)
    clock = Clock(cfg.start_ts + cfg.init_s + 2 * cfg.interval_s)
    t0 = time.perf_counter()
    run = replay_entries(clock.watch(entries), [PipelineConfig()], load_inventory(None, header))
    wall = time.perf_counter() - t0
    event_s = (run.last_ts or 0.0) - cfg.start_ts + cfg.interval_s
    x = event_s / wall if wall > 0 else float("inf")
    steady_event = clock.last_ts + cfg.interval_s - clock.steady_from
    steady_wall = time.perf_counter() - clock.t_steady if clock.t_steady else 0.0
    steady_x = steady_event / steady_wall if steady_wall > 0 else None
    hour_wall = 3600.0 / steady_x if steady_x else None
    kind = "measured" if duration >= 3600 else "EXTRAPOLATED from the steady-state rate"
    outs = run.outputs[0]
    print(f"replayed {event_s:.0f} s of {a.hosts} hosts ({run.records} records, "
          f"{os.path.getsize(path) / 1e6:.0f} MB) in {wall:.1f} s wall: {x:.2f}x real time "
          f"(steady state {steady_x or 0:.2f}x); one hour would take "
          f"{hour_wall or float('nan'):.0f} s ({kind}); goal {GOAL_X:.0f}x: "
          f"{'met' if steady_x and steady_x >= GOAL_X else 'NOT met'}; "
          f"{len(outs)} outputs", file=sys.stderr)
    print(json.dumps({
        "hosts": a.hosts, "event_s": round(event_s, 1), "records": run.records,
        "bytes": os.path.getsize(path), "wall_s": round(wall, 3), "x_realtime": round(x, 3),
        "steady_x_realtime": round(steady_x, 3) if steady_x else None,
        "hour_wall_s": round(hour_wall, 1) if hour_wall else None, "hour_wall_kind": kind,
        "goal_x": GOAL_X, "goal_met": bool(steady_x and steady_x >= GOAL_X),
        "quick": a.quick, "generate_s": round(gen_s, 1), "outputs": len(outs)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
