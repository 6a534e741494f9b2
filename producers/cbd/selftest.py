"""On-host micro-benchmarks: ``python -m producers.cbd.selftest KIND ...`` prints JSON.

Aegis §6 (CBD) single-host stage, "3 min: GPU kernels, NVLink, HBM, PCIe, CPU, loading
dataset, model and checkpoint":

- ``cpu``: numpy float32 matmul, GFLOP/s (2·n³ per product);
- ``mem``: numpy copy of a 256 MiB array, GB/s counting read + write;
- ``read PATH...``: sequential read of checkpoint/dataset files, MB/s, after asking the
  kernel to drop those files' cached pages (posix_fadvise DONTNEED) so the disk is read;
- ``gpu``: with torch and CUDA only (never installed by CBD): per GPU bf16 matmul TFLOP/s,
  device-to-device copy (HBM) GB/s, pinned host-to-device copy (PCIe) GB/s, and
  GPU0 -> GPUi peer copy (NVLink) GB/s. Without them: ``{"available": false, "reason"}``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any


def _repeat(fn: Callable[[], Any], seconds: float, min_reps: int = 3) -> tuple[int, float]:
    fn()  # warm-up
    reps, t0 = 0, time.perf_counter()
    while reps < min_reps or time.perf_counter() - t0 < seconds:
        fn()
        reps += 1
    return reps, time.perf_counter() - t0


def cpu_gflops(seconds: float = 1.0, n: int = 1024) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.random((n, n), dtype=np.float32)
    b = rng.random((n, n), dtype=np.float32)
    c = np.empty_like(a)
    reps, dt = _repeat(lambda: np.matmul(a, b, out=c), seconds)
    return {"gflops": round(2 * n**3 * reps / dt / 1e9, 2), "n": n, "reps": reps}


def mem_copy_gbps(seconds: float = 1.0, mib: int = 256) -> dict[str, Any]:
    import numpy as np

    src = np.ones(mib * (1 << 20) // 8, dtype=np.float64)
    dst = np.empty_like(src)
    reps, dt = _repeat(lambda: np.copyto(dst, src), seconds)
    return {"copy_gbps": round(2 * src.nbytes * reps / dt / 1e9, 2), "mib": mib, "reps": reps}


def _files(paths: Iterable[str]) -> list[str]:
    out = []
    for p in paths:
        if os.path.isfile(p):
            out.append(p)
        elif os.path.isdir(p):
            for root, _, names in sorted(os.walk(p)):
                out += [os.path.join(root, n) for n in sorted(names)]
    return [f for f in out if os.path.isfile(f)]


def read_mbps(paths: Iterable[str], max_mb: int = 256, chunk: int = 4 << 20) -> dict[str, Any]:
    files = _files(paths)
    if not files:
        return {"available": False, "reason": "no readable file under the given paths"}
    limit, total, t0 = max_mb << 20, 0, time.perf_counter()
    for f in files:
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            while total < limit and (buf := os.read(fd, chunk)):
                total += len(buf)
        finally:
            os.close(fd)
        if total >= limit:
            break
    dt = time.perf_counter() - t0
    return {"mbps": round(total / max(dt, 1e-9) / 1e6, 1), "bytes": total, "files": len(files)}


def gpu_bench(seconds: float = 1.0) -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"available": False, "reason": "torch not installed"}
    if not torch.cuda.is_available():
        return {"available": False, "reason": "torch reports no usable CUDA device"}
    per = max(0.05, seconds / 4)
    gpus = []
    for i in range(torch.cuda.device_count()):
        dev = torch.device("cuda", i)

        def timed(fn: Callable[[], Any], dev: Any = dev) -> tuple[int, float]:
            def step() -> None:
                fn()
                torch.cuda.synchronize(dev)
            return _repeat(step, per)

        n = 8192
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        c = torch.empty_like(a)
        reps, dt = timed(functools.partial(torch.matmul, a, a, out=c))
        tflops = 2 * n**3 * reps / dt / 1e12
        x = torch.empty(1 << 28, dtype=torch.uint8, device=dev)
        y = torch.empty_like(x)
        reps, dt = timed(functools.partial(y.copy_, x))
        hbm = 2 * x.numel() * reps / dt / 1e9
        h = torch.empty(1 << 28, dtype=torch.uint8).pin_memory()
        reps, dt = timed(functools.partial(x.copy_, h, non_blocking=True))
        pcie = h.numel() * reps / dt / 1e9
        g: dict[str, Any] = {"index": i, "tflops": round(tflops, 1), "hbm_gbps": round(hbm, 1),
                             "pcie_gbps": round(pcie, 1)}
        if i > 0 and torch.cuda.can_device_access_peer(0, i):
            src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda:0")
            reps, dt = timed(functools.partial(x.copy_, src))
            g["nvlink_gbps"] = round(src.numel() * reps / dt / 1e9, 1)
        gpus.append(g)
        del a, c, x, y, h
        torch.cuda.empty_cache()
    return {"available": True, "gpus": gpus}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m producers.cbd.selftest")
    p.add_argument("kind", choices=("cpu", "mem", "read", "gpu"))
    p.add_argument("paths", nargs="*")
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--mb", type=int, default=256)
    a = p.parse_args(argv)
    if a.kind == "cpu":
        out = cpu_gflops(a.seconds)
    elif a.kind == "mem":
        out = mem_copy_gbps(a.seconds)
    elif a.kind == "read":
        out = read_mbps(a.paths, a.mb)
    else:
        out = gpu_bench(a.seconds)
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
