"""Overhead of the host agent: CPU % and RSS at 1 Hz with 8 GPUs' and 8 NICs' worth of
data, next to an idle Python loop measured in the same run.

    .venv/bin/python bench/agent.py --quick      # ~25 s
    .venv/bin/python bench/agent.py --duration 120

The agent runs as ``aegis agent --sim-gpus 8 --sysfs-root tests/data/sysfs --sink null``
(simulated NVML values through the same collector interface, the 8-device mlx5 fixture
tree, the kernel log, a training log, the on-disk spool, a sink that discards). Both
processes start together; CPU is (utime + stime) from /proc/<pid>/stat over the measured
window after a warm-up, RSS is VmRSS/VmHWM from /proc/<pid>/status. The last line is one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)


def memory_mib(pid: int) -> dict[str, float]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(rest.split()[0]) / 1024
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="20 s measured window")
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--gpus", type=int, default=8)
    a = p.parse_args(argv)
    duration = 20.0 if a.quick else a.duration
    work = Path(tempfile.mkdtemp(prefix="aegis-bench-agent-"))
    train_log = work / "train.log"
    train_log.write_text("")
    agent_cmd = [sys.executable, "-m", "producers.agent.main", "--sim-gpus", str(a.gpus),
                 "--sysfs-root", str(ROOT / "tests" / "data" / "sysfs"), "--sink", "null",
                 "--interval", "1", "--host", "bench-h0001", "--job", "bench",
                 "--spool-dir", str(work / "spool"), "--log", str(train_log),
                 "--ccl-socket", str(work / "ccl.sock"), "--status-every", "3600",
                 "--duration", str(duration + a.warmup + 5)]
    idle_cmd = [sys.executable, "-c", "import time\nwhile True:\n    time.sleep(1)"]
    agent = subprocess.Popen(agent_cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
    idle = subprocess.Popen(idle_cmd, stdout=subprocess.DEVNULL)
    try:
        time.sleep(a.warmup)
        t0 = time.monotonic()
        c0 = {"agent": cpu_seconds(agent.pid), "idle": cpu_seconds(idle.pid)}
        with open(train_log, "a") as fh:  # some training output, one line in ten interesting
            for i in range(int(duration)):
                for j in range(10):
                    fh.write(f"[rank {j}] step {i} loss 2.{i % 10} NCCL WARN timeout\n" if j == 0
                             else f"[rank {j}] step {i} loss 2.{i % 10}\n")
                fh.flush()
                time.sleep(1.0)
        wall = time.monotonic() - t0
        c1 = {"agent": cpu_seconds(agent.pid), "idle": cpu_seconds(idle.pid)}
        mem = {"agent": memory_mib(agent.pid), "idle": memory_mib(idle.pid)}
    finally:
        for proc in (agent, idle):
            proc.send_signal(signal.SIGTERM)
        idle.wait(10)
        _, err = agent.communicate(timeout=30)
    status = {}
    for line in err.splitlines():
        if " status {" in line:
            status = json.loads(line.split(" status ", 1)[1])
    pct = {k: round(100.0 * (c1[k] - c0[k]) / wall, 3) for k in c0}
    result = {
        "bench": "agent", "gpus": a.gpus, "nics": 8, "interval_s": 1.0, "measured_s": round(wall, 1),
        "agent_cpu_pct": pct["agent"], "agent_rss_mib": round(mem["agent"]["VmRSS"], 1),
        "agent_peak_rss_mib": round(mem["agent"]["VmHWM"], 1),
        "idle_python_cpu_pct": pct["idle"], "idle_python_rss_mib": round(mem["idle"]["VmRSS"], 1),
        "agent_minus_idle_cpu_pct": round(pct["agent"] - pct["idle"], 3),
        "records_sent": status.get("sent"), "agent_exit": agent.returncode,
    }
    print(f"agent : CPU {pct['agent']:.2f} %  RSS {mem['agent']['VmRSS']:.1f} MiB "
          f"(peak {mem['agent']['VmHWM']:.1f})")
    print(f"idle  : CPU {pct['idle']:.2f} %  RSS {mem['idle']['VmRSS']:.1f} MiB")
    print(json.dumps(result))
    return 0 if agent.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
