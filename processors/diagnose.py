"""``aegis diagnose FILE``: the in-process engine over a recording (simulator output or a
topic dump). Runs the same detectors and guard as the worker with no services, and writes
diagnoses, commands, refusals and dead letters as JSONL.

Exit codes: 0 done; 1 the file is missing, not a recording or corrupt; 2 usage or
policy/inventory errors.
"""

from __future__ import annotations

import argparse
import os
import sys

from processors.engine import Engine
from processors.progress import Progress
from processors.settings import PipelineConfig
from schemas.errors import AegisError, ConfigError, DecodeError, WireError
from schemas.inventory import Inventory
from schemas.recording import read_header, read_recording


def build_parser(prog: str = "aegis diagnose") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="recording file (aegis simulate --out FILE, or aegis dump)")
    p.add_argument("-o", "--out", default="-", help="JSONL output, replaced if it exists (default: stdout)")
    p.add_argument("--inventory", help="inventory JSON (default: the recording header's)")
    p.add_argument("--policy", help="TOML policy file: thresholds, XID policy")
    p.add_argument("--no-refusals", action="store_true", help="leave guard refusals out")
    p.add_argument("--progress", action="store_true", help="show progress even when not a TTY")
    p.add_argument("--no-finish", action="store_true",
                   help="do not close open windows at the end of the file (what the live "
                        "worker would have emitted by then, exactly)")
    p.add_argument("--workers", type=int, default=0,
                   help="processes: one per input topic, or per detector with 4+ (default 0: "
                        "one per CPU, at most one per task; 1: this process only); the "
                        "outputs are the same (docs/replay.md)")
    return p


def load_inventory(path: str | None, header: dict) -> Inventory | None:
    if path:
        return Inventory.load(path)
    meta = header.get("meta", {})
    if isinstance(meta, dict) and isinstance(meta.get("inventory"), dict):
        try:
            return Inventory.from_wire(meta["inventory"])
        except WireError as e:  # the recording is corrupt, not the command line
            raise DecodeError(f"the recording's header inventory: {e}") from e
    return None


def run_file(path: str, sink: object, inventory_path: str | None = None,
             config: PipelineConfig | None = None, progress: Progress | None = None,
             finish: bool = True, workers: int = 1) -> Engine:
    """Feed a recording through a fresh engine into ``sink``; returns the engine. With
    ``workers`` other than 1 the detectors run in processes (``replay.replay_file``; 0: one
    per CPU), with the same outputs."""
    if workers != 1:
        from processors.replay import replay_file

        inventory = load_inventory(inventory_path, read_header(path))
        run = replay_file(path, [config or PipelineConfig()], inventory, [sink], finish=finish,
                          workers=workers, progress=progress)
        return run.engines[0]
    header, entries = read_recording(path)
    engine = Engine(config, load_inventory(inventory_path, header), sink)  # type: ignore[arg-type]
    engine.run(entries, progress=progress.update if progress else None, finish=finish)
    return engine


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if not os.path.exists(a.file):
        print(f"aegis diagnose: {a.file}: no such file", file=sys.stderr)
        return 1
    if os.path.isdir(a.file):
        print(f"aegis diagnose: {a.file}: is a directory, not a recording", file=sys.stderr)
        return 1
    from sinks.jsonl import JsonlSink

    try:
        config = PipelineConfig.from_toml(a.policy)
    except ConfigError as e:
        print(f"aegis diagnose: {e}", file=sys.stderr)
        return 2
    progress = Progress("diagnose", enabled=True if a.progress else None)
    try:
        with JsonlSink(a.out, include_refusals=not a.no_refusals, append=False) as sink:
            engine = run_file(a.file, sink, a.inventory, config, progress,
                              finish=not a.no_finish, workers=a.workers)
    except WireError as e:
        print(f"aegis diagnose: {e}", file=sys.stderr)
        return 1
    except (ConfigError, OSError) as e:
        print(f"aegis diagnose: {e}", file=sys.stderr)
        return 2
    except AegisError as e:
        print(f"aegis diagnose: {e}", file=sys.stderr)
        return 1
    s = engine.stats
    progress.done()
    rej = ", ".join(f"{k}={v}" for k, v in sorted(s.rejections.items())) or "none"
    print(f"aegis diagnose: {s.messages} messages, {s.diagnoses} diagnoses, {s.commands} commands, "
          f"{s.refusals} refusals, {s.dead_letters} dead letters, rejected samples: {rej}"
          + s.ignored_note(),
          file=sys.stderr)
    return 0
