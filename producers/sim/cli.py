"""``aegis simulate``: run the cluster simulator into a recording file or Kafka.

    aegis simulate --hosts 64 --scenario xid79 --seed 1 --duration 600 --out run.aegis
    aegis simulate --list

Writes ``<out>`` (recording), ``<out>.truth.json`` (ground truth) and ``<out>.inventory.json``.
Exit codes: 0 ok, 1 the output file cannot be written, 2 usage error (an unknown scenario
lists the valid ones).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import orjson

from producers.sim.scenarios import SCENARIOS, describe
from producers.sim.simulation import DEFAULT_EPOCH, SimConfig, Simulation
from schemas.errors import AegisError
from schemas.recording import RecordingWriter


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aegis simulate", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list", action="store_true", help="list scenarios and exit")
    p.add_argument("--hosts", type=int, default=16, help="hosts (8 GPUs each); default 16")
    p.add_argument("--hosts-per-job", type=int, default=None,
                   help="hosts per job; default min(hosts, 8); 0 = one job over all hosts")
    p.add_argument("--scenario", default="healthy", help="see --list; default healthy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--duration", type=float, default=900.0, help="simulated seconds; default 900")
    p.add_argument("--fault-at", type=float, default=120.0,
                   help="seconds after start when the (first) fault begins; default 120")
    p.add_argument("--speed", type=float, default=0.0,
                   help="1.0 = real time, 0 = as fast as possible (default)")
    p.add_argument("--start-ts", type=float, default=DEFAULT_EPOCH,
                   help=f"event time of the first tick, epoch seconds; default {DEFAULT_EPOCH:.0f}")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel stages per job")
    p.add_argument("--hosts-per-pod", type=int, default=32,
                   help="hosts behind each rail's ToR switch (a pod); default 32")
    p.add_argument("--mixed-faults", type=int, default=None, help="faults in mixed mode")
    p.add_argument("--mixed-spacing", type=float, default=90.0,
                   help="seconds between mixed-mode fault starts; default 90")
    p.add_argument("--mixed-scenarios", default=None,
                   help="comma-separated scenarios mixed mode draws from; default all")
    p.add_argument("--mixed-cover-all", action="store_true",
                   help="mixed mode: the first faults cover every allowed scenario once")
    p.add_argument("--name-prefix", default="",
                   help="prefix for every host, job and switch name (e.g. 'run1-')")
    p.add_argument("--ip-site", type=int, default=None,
                   help="address block 0..2047; default derived from --name-prefix")
    p.add_argument("--heartbeat", type=float, default=5.0,
                   help="agent heartbeat period per host, seconds; 0 = none; default 5")
    p.add_argument("--out", help="recording file, or 'kafka' (with --bootstrap)")
    p.add_argument("--bootstrap", default=os.environ.get("AEGIS_KAFKA_BOOTSTRAP", "localhost:9092"),
                   help="Kafka bootstrap servers for --out kafka")
    p.add_argument("--truth", help="ground-truth path; default <out>.truth.json")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


class Progress:
    """A one-line progress bar on stderr, redrawn at most 4 times a second."""

    def __init__(self, stream: Any = sys.stderr, width: int = 30) -> None:
        self.stream, self.width = stream, width
        self.t0 = self.last = time.monotonic()

    def __call__(self, done: float, total: float) -> None:
        now = time.monotonic()
        if now - self.last < 0.25 and done < total:
            return
        self.last = now
        frac = min(1.0, done / total) if total else 1.0
        fill = int(frac * self.width)
        rate = done / max(now - self.t0, 1e-9)
        self.stream.write(f"\r[{'#' * fill}{'.' * (self.width - fill)}] {frac:6.1%} "
                          f"{done:7.0f}/{total:.0f} sim s  {rate:6.1f}x real time")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(describe()))
        return 0
    if args.scenario not in SCENARIOS:
        print(f"aegis simulate: unknown scenario {args.scenario!r}; valid scenarios:\n  "
              + "\n  ".join(SCENARIOS), file=sys.stderr)
        return 2
    if not args.out:
        parser.print_usage(sys.stderr)
        print("aegis simulate: --out FILE (or --out kafka) is required", file=sys.stderr)
        return 2
    per_job = args.hosts_per_job
    per_job = min(args.hosts, 8) if per_job is None else (None if per_job == 0 else per_job)
    cfg = SimConfig(hosts=args.hosts, hosts_per_job=per_job, scenario=args.scenario,
                    seed=args.seed, duration_s=args.duration, start_ts=args.start_ts,
                    speed=args.speed, fault_at_s=args.fault_at, pp=args.pp,
                    hosts_per_pod=args.hosts_per_pod,
                    mixed_faults=args.mixed_faults, mixed_spacing_s=args.mixed_spacing,
                    mixed_scenarios=(tuple(x.strip() for x in args.mixed_scenarios.split(",")
                                           if x.strip()) if args.mixed_scenarios else None),
                    mixed_cover_all=args.mixed_cover_all, name_prefix=args.name_prefix,
                    ip_site=args.ip_site, heartbeat_s=args.heartbeat)
    try:
        sim = Simulation(cfg)
    except (AegisError, ValueError) as e:
        print(f"aegis simulate: {e}", file=sys.stderr)
        return 2
    progress = None if args.quiet else Progress()
    truth_path = args.truth or (None if args.out == "kafka" else f"{args.out}.truth.json")
    if args.out == "kafka":
        from producers.sim.kafka_out import make_kafka_sink  # lazy: needs confluent-kafka

        sink = make_kafka_sink(args.bootstrap)
        result = sim.run(sink, progress)
        close = getattr(sink, "close", None)
        if callable(close):
            close()
    else:
        try:
            with RecordingWriter(args.out, meta=sim.header_meta()) as writer:
                result = sim.run(writer, progress)
            with open(f"{args.out}.inventory.json", "wb") as fh:
                fh.write(orjson.dumps(sim.inventory.to_wire(), option=orjson.OPT_INDENT_2))
        except OSError as e:  # a missing folder, a full disk: the file cannot be written
            print(f"aegis simulate: cannot write {args.out}: {e.strerror or e}", file=sys.stderr)
            return 1
    if truth_path:
        try:
            with open(truth_path, "wb") as fh:
                fh.write(orjson.dumps(sim.truth_doc(), option=orjson.OPT_INDENT_2))
        except OSError as e:
            print(f"aegis simulate: cannot write {truth_path}: {e.strerror or e}", file=sys.stderr)
            return 1
    if not args.quiet:
        print(f"aegis simulate: {result.records} records ({result.bytes} bytes) for "
              f"{result.sim_s:.0f} sim s in {result.wall_s:.1f} s; "
              f"{len(result.truth)} fault(s) -> {truth_path or '(no truth file)'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
