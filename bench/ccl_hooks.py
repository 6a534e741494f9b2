"""Per-event cost of the ccl_hooks NCCL profiler plugin (Aegis §4.2 counters on the hot path).

Builds the plugin and its harness if needed, then runs the harness benchmark: Coll
start+stop pairs on one thread and on four threads sharing one communicator, a ProxyStep
lifecycle (start, SendWait, stop), and side by side an empty call pair through a function
pointer as the baseline. Prints the figures; the LAST line is one JSON object.

    python bench/ccl_hooks.py --quick
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HOOKS = Path(__file__).resolve().parents[1] / "ccl_hooks"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1M pairs instead of 5M (well under 60 s)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    build = subprocess.run(["make", "-C", str(HOOKS), "all", "build/ccl_harness"],
                           capture_output=True, text=True, check=False)
    if build.returncode != 0:
        print(build.stdout + build.stderr, file=sys.stderr)
        return build.returncode
    cmd = [str(HOOKS / "build" / "ccl_harness"), "--bench",
           "--lib", str(HOOKS / "build" / "libaegis_ccl_profiler.so")]
    if args.quick:
        cmd.insert(2, "--quick")
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=55, check=False)
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines:
        print(run.stdout + run.stderr, file=sys.stderr)
        return run.returncode or 1
    for line in lines[:-1]:
        print(line)
    result = json.loads(lines[-1])
    result["quick"] = args.quick
    result["wall_s"] = round(time.monotonic() - t0, 2)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
