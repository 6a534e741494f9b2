"""Network-namespace labs for CBD tests: N host namespaces on one bridge, as CPU "hosts".

Layout of a lab (``NetnsLab(4)``), every name unique per lab (``cbd<id>-...``):

- a switch namespace ``cbd<id>-sw`` holding bridge ``br0`` with the gateway 10.200.K.254/24;
- host namespaces ``cbd<id>-h1..hN``, each with ``lo`` and ``eth0`` = 10.200.K.i/24, a
  default route via the gateway; ``eth0`` is a veth whose other end ``v<i>`` is a bridge
  port in the switch namespace.

Faults (the CBD must-show cases):
- ``port_mtu(i, mtu)``: lower the MTU of host i's switch port. Hosts keep MTU 1500 (their
  configuration looks right), and frames above ``mtu`` to or from host i are dropped
  silently by the veth (large-packet loss, the Aegis >1 KB case);
- ``rate_limit(i)``: ``tc qdisc add dev eth0 root tbf rate 20mbit burst 32kbit latency
  400ms`` on host i (a slow egress link).

Traffic never leaves the lab's namespaces: the switch namespace has no other interface.
Needs root and ``ip netns``; :func:`require_root` fails the test (never skips) otherwise.
Always use the lab as a context manager so the namespaces are deleted.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Sequence

import pytest

from producers.cbd.targets import HostSpec


def sh(*argv: str) -> str:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: rc={p.returncode}: {p.stderr.strip()}")
    return p.stdout


def require_root() -> None:
    """Fail (not skip) with a clear message when namespaces cannot be made here."""
    if os.geteuid() != 0:
        pytest.fail("CBD namespace tests need root (ip netns, veth, tc): run pytest as root")
    probe = f"cbdprobe{uuid.uuid4().hex[:6]}"
    try:
        sh("ip", "netns", "add", probe)
    except (OSError, RuntimeError) as e:
        pytest.fail(f"CBD namespace tests need a working 'ip netns add' (iproute2): {e}")
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)


class NetnsLab:
    def __init__(self, n_hosts: int = 4, subnet: int | None = None) -> None:
        self.id = uuid.uuid4().hex[:6]
        self.n = n_hosts
        self.k = subnet if subnet is not None else int(self.id[:2], 16) % 250 + 1
        self.switch = f"cbd{self.id}-sw"
        self.ns = [f"cbd{self.id}-h{i}" for i in range(1, n_hosts + 1)]
        self.made: list[str] = []

    def addr(self, i: int) -> str:
        """Address of host i (1-based)."""
        return f"10.200.{self.k}.{i}"

    @property
    def names(self) -> list[str]:
        return [f"h{i}" for i in range(1, self.n + 1)]

    def specs(self, env: dict[str, str] | None = None,
              envs: Sequence[dict[str, str]] | None = None) -> list[HostSpec]:
        return [HostSpec(f"h{i}", "netns", ns, self.addr(i), None,
                         dict(envs[i - 1]) if envs else dict(env or {}))
                for i, ns in enumerate(self.ns, start=1)]

    def __enter__(self) -> NetnsLab:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        sw = self.switch
        sh("ip", "netns", "add", sw)
        self.made.append(sw)
        sh("ip", "-n", sw, "link", "set", "lo", "up")
        sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge", "forward_delay", "0")
        sh("ip", "-n", sw, "addr", "add", f"10.200.{self.k}.254/24", "dev", "br0")
        sh("ip", "-n", sw, "link", "set", "br0", "up")
        for i, ns in enumerate(self.ns, start=1):
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            sh("ip", "-n", sw, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0",
               "netns", ns)
            sh("ip", "-n", sw, "link", "set", f"v{i}", "master", "br0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "route", "add", "default", "via", f"10.200.{self.k}.254")

    def down(self) -> None:
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.made.clear()

    def port_mtu(self, i: int, mtu: int) -> None:
        """Host i's switch port drops frames above ``mtu`` (host i's own MTU stays 1500)."""
        sh("ip", "-n", self.switch, "link", "set", f"v{i}", "mtu", str(mtu))

    def rate_limit(self, i: int, rate: str = "20mbit") -> None:
        sh("ip", "netns", "exec", self.ns[i - 1], "tc", "qdisc", "add", "dev", "eth0", "root",
           "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms")

    def exists(self) -> list[str]:
        listed = sh("ip", "netns", "list")
        return [ns for ns in [self.switch, *self.ns] if ns in listed]
