"""The ``aegis`` command: argument dispatch only. Each subcommand lives in its own module
and is imported when used, so ``aegis --help`` stays fast and a missing optional piece
names what to install.

Exit codes: 0 success; 1 the work failed (bad input file, diagnosis mismatch); 2 usage
error; 3 a service (Kafka, Redis, NVML) could not be reached; 130 interrupted.
"""

from __future__ import annotations

import importlib
import sys

# name -> (module, one-line help). Each module has ``main(argv: list[str]) -> int``.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("processors.demo", "simulate a mixed-fault cluster and diagnose it in-process"),
    "diagnose": ("processors.diagnose", "run the detectors over a recording file, write JSONL"),
    "simulate": ("producers.sim.cli", "simulate a cluster with labelled faults (file or Kafka)"),
    "classify-log": ("processors.classify_log", "classify log lines (stdin or files) as JSON"),
    "worker": ("processors.worker", "run the Faust stream worker with all agents and sinks"),
    "agent": ("producers.agent.main", "run the host agent: NVML, RDMA, logs, CCL -> Kafka"),
    "remediate": ("sinks.remediate", "reference remediation consumer of the Redis queue"),
    "replay": ("processors.replay", "replay a job's topics or a file through the detectors"),
    "dump": ("processors.dump", "save a job's topic range to a portable recording file"),
    "cbd": ("processors.cbd_cli", "Check Before Delivery (Aegis §6): test hosts before hand-over"),
}

USAGE = "usage: aegis [-h] [--version] COMMAND [ARGS...]"


def _help() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = [USAGE, "", "Streaming fault diagnosis for GPU training clusters (after Aegis, NSDI'25).",
             "", "commands:"]
    lines += [f"  {name.ljust(width)}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "Run 'aegis COMMAND --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_help())
        return 0 if args else 2
    if args[0] == "--version":
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"aegis-stream {version('aegis-stream')}")
        except PackageNotFoundError:
            print("aegis-stream (not installed)")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"aegis: unknown command {name!r}\n\n{_help()}", file=sys.stderr)
        return 2
    module_name = COMMANDS[name][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        print(f"aegis {name}: needs the Python module {e.name!r}, which is not installed "
              f"(pip install 'aegis-stream' installs every dependency)", file=sys.stderr)
        return 3
    try:
        return int(module.main(rest))
    except KeyboardInterrupt:
        print(f"aegis {name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
