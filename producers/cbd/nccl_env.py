"""Sanity rules for NCCL and IB environment variables (Aegis Alg. 1 ConfigCheck: "a
checklist, each item with a script"). Ranges follow NCCL's documented environment variables.

Interface and HCA lists use NCCL's syntax: a comma-separated list of prefixes, ``^`` in
front excludes, ``=`` in front means exact names; an HCA entry may end in ``:port``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# variable -> (min, max) for integers
INT_RANGES: dict[str, tuple[int, int]] = {
    "NCCL_IB_DISABLE": (0, 1), "NCCL_P2P_DISABLE": (0, 1), "NCCL_SHM_DISABLE": (0, 1),
    "NCCL_NET_GDR_READ": (0, 1), "NCCL_IB_CUDA_SUPPORT": (0, 1),
    "NCCL_IB_PCI_RELAXED_ORDERING": (0, 2), "NCCL_IB_GID_INDEX": (-1, 255),
    "NCCL_IB_TIMEOUT": (1, 31), "NCCL_IB_RETRY_CNT": (0, 7), "NCCL_IB_SL": (0, 15),
    "NCCL_IB_TC": (0, 255), "NCCL_IB_QPS_PER_CONNECTION": (1, 128),
    "NCCL_MIN_NCHANNELS": (1, 64), "NCCL_MAX_NCHANNELS": (1, 64),
    "NCCL_BUFFSIZE": (1, 1 << 31), "NCCL_SOCKET_NTHREADS": (1, 16),
    "NCCL_NSOCKS_PERTHREAD": (1, 64), "NCCL_CROSS_NIC": (0, 2),
}
CHOICES: dict[str, tuple[str, ...]] = {
    "NCCL_DEBUG": ("VERSION", "WARN", "INFO", "TRACE", "ABORT"),
    "NCCL_NTHREADS": ("64", "128", "256", "512"),
}


def parse_list(value: str) -> tuple[bool, bool, list[str]]:
    """NCCL list syntax -> (exclude, exact, names)."""
    v = value.strip()
    exclude = v.startswith("^")
    v = v.lstrip("^")
    exact = v.startswith("=")
    v = v.lstrip("=")
    return exclude, exact, [x.strip() for x in v.split(",") if x.strip()]


def matches(value: str, names: Iterable[str], strip_port: bool = False) -> list[str]:
    """The names NCCL would select with ``value``."""
    exclude, exact, items = parse_list(value)
    if strip_port:
        items = [i.split(":", 1)[0] for i in items]

    def hit(n: str) -> bool:
        return any(n == i if exact else n.startswith(i) for i in items)

    return [n for n in names if hit(n) != exclude]


def env_problems(env: Mapping[str, str], facts: Mapping[str, Any]) -> list[str]:
    out = []
    for k, (lo, hi) in INT_RANGES.items():
        if k in env:
            try:
                v = int(env[k])
            except ValueError:
                out.append(f"{k}={env[k]} is not an integer")
                continue
            if not lo <= v <= hi:
                out.append(f"{k}={v} outside [{lo}, {hi}]")
    for k, allowed in CHOICES.items():
        if k in env and env[k].upper() not in allowed:
            out.append(f"{k}={env[k]} not one of {', '.join(allowed)}")
    ifaces = [n.get("name") for n in facts.get("net") or () if n.get("name")]
    if "NCCL_SOCKET_IFNAME" in env and not matches(env["NCCL_SOCKET_IFNAME"], ifaces):
        out.append(f"NCCL_SOCKET_IFNAME={env['NCCL_SOCKET_IFNAME']} matches no interface "
                   f"here ({', '.join(ifaces) or 'none'})")
    hcas = sorted({str(p.get("dev")) for p in facts.get("ib") or ()})
    if "NCCL_IB_HCA" in env and env.get("NCCL_IB_DISABLE") != "1":
        if not hcas:
            out.append(f"NCCL_IB_HCA={env['NCCL_IB_HCA']} but no RDMA device here")
        elif not matches(env["NCCL_IB_HCA"], hcas, strip_port=True):
            out.append(f"NCCL_IB_HCA={env['NCCL_IB_HCA']} matches no RDMA device "
                       f"({', '.join(hcas)})")
    return out
