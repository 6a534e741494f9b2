"""The nccl-tests driver of the collective test: build the ``mpirun ... all_reduce_perf``
command line and parse its table.

Aegis §6 (CBD) multi-host stage. Used where every host has ``all_reduce_perf`` and
``mpirun`` on PATH (facts ``tools``); otherwise the socket ring of :mod:`producers.cbd.ring`
runs instead, and the check's evidence says which driver ran and why.

Table rows (nccl-tests >= 2.x; older builds have no ``root`` column and an ``error``
column instead of ``#wrong``; mpirun may prefix ``[1,0]<stdout>:``)::

    size count type redop [root] time algbw busbw #wrong time algbw busbw #wrong
                                 `----- out-of-place ----'  `----- in-place -----'
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_PREFIX = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_AVG = re.compile(r"Avg bus bandwidth\s*:\s*([\d.eE+-]+)")


def _num(tok: str) -> float | None:
    try:
        return float(tok)
    except ValueError:
        return None


def parse_output(text: str) -> dict[str, Any]:
    """``{"rows": [{size, time_us, algbw, busbw, wrong, ip_busbw}], "avg_busbw", "max_busbw"}``;
    busbw and algbw in GB/s as nccl-tests prints them."""
    rows, avg = [], None
    for raw in text.splitlines():
        line = _PREFIX.sub("", raw).strip()
        m = _AVG.search(line)
        if m:
            avg = float(m.group(1))
            continue
        if not line or line.startswith("#"):
            continue
        tok = line.split()
        if len(tok) < 12 or not tok[0].isdigit() or not tok[1].isdigit():
            continue
        oop, ip = tok[-8:-4], tok[-4:]
        t, alg, bus = (_num(x) for x in oop[:3])
        if t is None or alg is None or bus is None:
            continue
        rows.append({"size": int(tok[0]), "count": int(tok[1]), "time_us": t, "algbw": alg,
                     "busbw": bus, "wrong": _num(oop[3]), "ip_busbw": _num(ip[2])})
    busbws = [float(r["busbw"] or 0.0) for r in rows]
    return {"rows": rows, "avg_busbw": avg, "max_busbw": max(busbws) if busbws else None,
            "wrong": sum(1 for r in rows if r["wrong"] not in (None, 0.0))}


def mpirun_argv(mpirun: str, extra: Sequence[str], hosts: Sequence[tuple[str, int]],
                binary: str, env: Mapping[str, str], min_bytes: str = "8M",
                max_bytes: str = "256M", iters: int = 20) -> list[str]:
    """One process per GPU (``-g 1``), ``hosts`` = [(address, gpus)], NCCL env forwarded."""
    n = sum(g for _, g in hosts)
    argv = [mpirun, *extra, "-np", str(n), "-H", ",".join(f"{a}:{g}" for a, g in hosts)]
    for k in sorted(env):
        argv += ["-x", f"{k}={env[k]}"]
    return argv + [binary, "-b", min_bytes, "-e", max_bytes, "-f", "2", "-g", "1",
                   "-n", str(iters)]


def usable(facts: Mapping[str, Mapping[str, Any]], hosts: Sequence[str]) -> tuple[bool, str]:
    """Whether every host has all_reduce_perf, mpirun and GPUs; the reason if not."""
    missing = []
    for h in hosts:
        f = facts.get(h, {})
        tools = f.get("tools") or {}
        nv = f.get("nvml") or {}
        lacks = [t for t in ("all_reduce_perf", "mpirun") if not tools.get(t)]
        if not nv.get("available") or not nv.get("count"):
            lacks.append("GPUs (NVML)")
        if lacks:
            missing.append(f"{h}: no {', '.join(lacks)}")
    if missing:
        return False, "; ".join(missing[:4]) + (f" (+{len(missing) - 4} more)"
                                                if len(missing) > 4 else "")
    return True, "all_reduce_perf, mpirun and GPUs on every host"
