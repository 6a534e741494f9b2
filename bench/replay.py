"""Replay speed: serial and parallel replay of a recording of one 1,000-host job (all topics).

    python bench/replay.py            # one hour of event time (goal: >= 60x real time, i.e.
                                      # the hour replayed in <= 60 s); the recording (~19 GB)
                                      # is simulated once and cached under .cache/
    python bench/replay.py --quick    # 30 s of event time, well within a minute; the hour is
                                      # EXTRAPOLATED from the steady-state rate (labelled)

Side by side in one run: the serial replay (one process, ``replay_entries``) and the parallel
one (``aegis replay``'s default: one process per detector, at most one per CPU), whose
outputs must be the same. x-realtime = event seconds replayed / wall seconds. The first
``init_s`` (10 s) of a simulated job has telemetry but no CCL traffic, so the serial
steady-state figure (after it), times the parallel/serial ratio, is the one that
extrapolates.

A third pass, the *parse floor*, measures in the same run what the recording format alone
costs: it reads every entry and msgpack-unpacks its value, with no record objects and no
detectors. Any replay of this format is slower than that floor per process, so
``floor_x * cpus`` bounds what any split of the work could reach on this machine; the JSON
says whether the goal is within that bound. Prints progress on stderr, then one JSON
object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import msgpack  # noqa: E402

from processors.diagnose import load_inventory  # noqa: E402
from processors.replay import replay_entries, replay_file  # noqa: E402
from processors.replay_parallel import default_workers  # noqa: E402
from processors.settings import PipelineConfig  # noqa: E402
from producers.sim.simulation import SimConfig, Simulation  # noqa: E402
from schemas.recording import (  # noqa: E402
    RecordingEntry,
    RecordingWriter,
    read_header,
    read_recording,
)

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
    p.add_argument("--workers", type=int, default=0,
                   help="processes of the parallel replay (default: one per CPU, at most 4)")
    p.add_argument("--parallel-only", action="store_true",
                   help="skip the serial run (the full hour: ~20 min serial on 2 cores)")
    a = p.parse_args(argv)
    duration = a.duration or (30.0 if a.quick else 3600.0)
    path, cfg, gen_s = recording(a.hosts, duration, a.scenario)
    header = read_header(path)
    inventory = load_inventory(None, header)
    workers = a.workers or default_workers(1)
    serial: dict[str, Any] | None = None
    if not a.parallel_only:
        serial = run_serial(path, cfg, inventory)
    t0 = time.perf_counter()
    run = replay_file(path, [PipelineConfig()], inventory, workers=workers)
    wall = time.perf_counter() - t0
    event_s = (run.last_ts or 0.0) - cfg.start_ts + cfg.interval_s
    par_x = event_s / wall if wall > 0 else float("inf")
    outputs = [x.to_wire() for x in run.outputs[0]]
    kind = "measured" if duration >= 3600 else "EXTRAPOLATED from the steady-state rate"
    doc: dict[str, Any] = {
        "hosts": a.hosts, "event_s": round(event_s, 1), "records": run.records,
        "bytes": os.path.getsize(path), "cpus": default_workers(1), "workers": workers,
        "parallel_wall_s": round(wall, 3), "parallel_x_realtime": round(par_x, 3),
        "outputs": len(outputs), "goal_x": GOAL_X, "quick": a.quick,
        "generate_s": round(gen_s, 1)}
    best = par_x
    if serial is not None:
        speedup = serial["wall_s"] / wall if wall > 0 else None
        doc.update({f"serial_{k}": v for k, v in serial.items() if k != "outputs"})
        doc["parallel_over_serial"] = round(speedup, 3) if speedup else None
        doc["same_outputs"] = serial["outputs"] == outputs
        if serial["steady_x"] and speedup:  # the init seconds carry no CCL traffic
            best = serial["steady_x"] * speedup
            doc["parallel_steady_x_estimate"] = round(best, 3)
    floor = parse_floor(path, cfg)
    doc.update(floor)
    if floor["floor_steady_x"]:
        bound = floor["floor_steady_x"] * doc["cpus"]
        doc["format_bound_x"] = round(bound, 1)
        doc["goal_within_format_bound"] = bool(bound >= GOAL_X)
        if serial is not None and serial["steady_x"]:
            doc["serial_over_floor"] = round(floor["floor_steady_x"] / serial["steady_x"], 2)
    hour = 3600.0 / best if best else None
    doc.update({"hour_wall_s": round(hour, 1) if hour else None, "hour_wall_kind": kind,
                "goal_met": bool(best >= GOAL_X)})
    print(f"replayed {event_s:.0f} s of {a.hosts} hosts ({run.records} records, "
          f"{os.path.getsize(path) / 1e6:.0f} MB) with {workers} processes in {wall:.1f} s: "
          f"{par_x:.2f}x real time" + (
              f"; serial {serial['wall_s']:.1f} s, {serial['x_realtime']:.2f}x (steady "
              f"{serial['steady_x'] or 0:.2f}x), parallel/serial {doc['parallel_over_serial']}x, "
              f"same outputs: {doc['same_outputs']}" if serial else "") +
          f"; one hour would take {hour or float('nan'):.0f} s ({kind}); goal {GOAL_X:.0f}x: "
          f"{'met' if doc['goal_met'] else 'NOT met'}; parse floor (read + msgpack only, one "
          f"process) {doc['floor_steady_x'] or 0:.1f}x, so at most ~{doc.get('format_bound_x', 0)}x "
          f"on {doc['cpus']} CPUs", file=sys.stderr)
    print(json.dumps(doc))
    return 0


def run_serial(path: str, cfg: SimConfig, inventory: Any) -> dict[str, Any]:
    """The in-process replay, with the wall time of the steady state (after init)."""
    _header, entries = read_recording(path)
    clock = Clock(cfg.start_ts + cfg.init_s + 2 * cfg.interval_s)
    t0 = time.perf_counter()
    run = replay_entries(clock.watch(entries), [PipelineConfig()], inventory)
    wall = time.perf_counter() - t0
    event_s = (run.last_ts or 0.0) - cfg.start_ts + cfg.interval_s
    steady_event = clock.last_ts + cfg.interval_s - clock.steady_from
    steady_wall = time.perf_counter() - clock.t_steady if clock.t_steady else 0.0
    steady_x = steady_event / steady_wall if steady_wall > 0 else None
    return {"wall_s": round(wall, 3), "x_realtime": round(event_s / wall, 3) if wall else None,
            "steady_x": round(steady_x, 3) if steady_x else None,
            "outputs": [x.to_wire() for x in run.outputs[0]]}


def parse_floor(path: str, cfg: SimConfig) -> dict[str, Any]:
    """The recording format's own cost: read every entry and unpack its msgpack value (what
    any decoder must do first), with no records built and no detectors; steady state only
    counts entries after the init seconds, as ``run_serial`` does."""
    unpackb = msgpack.unpackb
    steady_from = cfg.start_ts + cfg.init_s + 2 * cfg.interval_s
    _header, entries = read_recording(path)
    t0 = time.perf_counter()
    t_steady = None
    last = 0.0
    for e in entries:
        if t_steady is None and e.ts >= steady_from:
            t_steady = time.perf_counter()
        last = max(last, e.ts)
        unpackb(e.value, raw=False, strict_map_key=True)
    t1 = time.perf_counter()
    steady_event = last + cfg.interval_s - steady_from
    steady_wall = t1 - t_steady if t_steady is not None else 0.0
    return {"floor_wall_s": round(t1 - t0, 3),
            "floor_steady_x": round(steady_event / steady_wall, 2) if steady_wall > 0 else None}


if __name__ == "__main__":
    raise SystemExit(main())
