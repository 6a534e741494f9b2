"""Pure helpers over collected facts: batch majorities, route lookup, data interfaces.

CBD compares a host with its batch (identical servers, one job): the batch majority (the
mode) is the reference, and a host that differs from it is the odd one out.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

Facts = Mapping[str, Any]


def mode(values: Iterable[Hashable | None]) -> tuple[Any, int, int]:
    """(most common non-None value, its count, number of non-None values); ties go to the
    smallest value by ``str`` so every run agrees."""
    c = Counter(v for v in values if v is not None)
    if not c:
        return None, 0, 0
    best = max(c.items(), key=lambda kv: (kv[1], _neg_str(kv[0])))
    return best[0], best[1], sum(c.values())


def _neg_str(v: Any) -> tuple[int, ...]:
    return tuple(-ord(ch) for ch in str(v))


def route_for(routes: Iterable[Mapping[str, Any]], addr: str) -> Mapping[str, Any] | None:
    """Longest-prefix match of ``addr`` in a route list [{dst, dev, gw}]."""
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return None
    best: tuple[int, Mapping[str, Any]] | None = None
    for r in routes:
        dst = r.get("dst")
        if not dst:
            continue
        try:
            net = (ipaddress.ip_network("0.0.0.0/0") if dst == "default"
                   else ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False))
        except ValueError:
            continue
        if ip.version == net.version and ip in net and (best is None or
                                                        net.prefixlen > best[0]):
            best = (net.prefixlen, r)
    return best[1] if best else None


def iface(facts: Facts, name: str | None) -> Mapping[str, Any] | None:
    for n in facts.get("net") or ():
        if n.get("name") == name:
            return n
    return None


def iface_of_addr(facts: Facts, addr: str) -> str | None:
    for name, cidrs in (facts.get("addrs") or {}).items():
        if any(c.split("/")[0] == addr for c in cidrs):
            return str(name)
    return None


def first_global_ipv4(facts: Facts) -> str | None:
    """The first IPv4 of an up, non-loopback interface (the default data-plane address)."""
    up = {n["name"] for n in facts.get("net") or () if n.get("operstate") in ("up", "unknown")}
    for name, cidrs in sorted((facts.get("addrs") or {}).items()):
        if name == "lo" or name not in up:
            continue
        for c in cidrs:
            ip = c.split("/")[0]
            if not ipaddress.ip_address(ip).is_loopback:
                return ip
    return None


def data_iface(facts: Facts, own_addr: str | None, peer_addrs: Iterable[str]) -> str | None:
    """The interface that carries traffic to the peers (majority over the peers' routes),
    else the one holding the host's own data-plane address."""
    devs = [r.get("dev") for a in peer_addrs if (r := route_for(facts.get("routes") or (), a))]
    dev, _, _ = mode(devs)
    if dev:
        return str(dev)
    return iface_of_addr(facts, own_addr) if own_addr else None


def nvidia_pci_gpus(facts: Facts) -> list[Mapping[str, Any]]:
    return [p for p in facts.get("pci") or () if p.get("kind") == "gpu"]


def nvml(facts: Facts) -> Mapping[str, Any]:
    v = facts.get("nvml")
    return v if isinstance(v, Mapping) else {"available": False, "reason": "no NVML facts"}


def is_error(v: Any) -> bool:
    return isinstance(v, Mapping) and "error" in v
