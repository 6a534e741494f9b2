"""Static facts about hosts and jobs that detectors need to name culprits: each host's IP
addresses, its GPUs' PCI bus ids, its NICs and their rails, and a job's rank → host/GPU map.

The simulator writes one next to its output; in production the agent's ``--once`` output or
the scheduler provides it (``aegis diagnose --inventory FILE``). Format: JSON, see
docs/wire-format.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from schemas.errors import ConfigError, DecodeError, ValidationError, WireError

_BUS_RE = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def normalise_bus_id(bus: str) -> str | None:
    """``00000000:3B:00.0`` / ``3b:00.0`` / ``0000:3b:00.0`` → ``0000:3b:00.0``; None if not a bus id."""
    m = _BUS_RE.match(bus.strip())
    if not m:
        return None
    dom = (m.group(1) or "0000")[-4:]
    return f"{dom}:{m.group(2)}:{m.group(3)}.{m.group(4)}".lower()


@dataclass(frozen=True, slots=True)
class HostInventory:
    host: str
    ips: tuple[str, ...] = ()
    gpu_bus_ids: tuple[str, ...] = ()  # index i = GPU i, normalised
    nics: tuple[str, ...] = ()  # index i = NIC i (rail i), e.g. mlx5_0
    tor: tuple[str, ...] = ()  # index i = ToR switch that NIC i connects to
    rail_ips: tuple[str, ...] = ()  # index i = data-plane (RoCE) address of NIC i
    gpu_nics: tuple[int, ...] = ()  # index i = index in ``nics`` of the NIC GPU i uses
    nic_bus_ids: tuple[str, ...] = ()  # index i = PCI bus id of NIC i, normalised

    def __post_init__(self) -> None:
        for g, n in enumerate(self.gpu_nics):
            if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < len(self.nics):
                raise ValidationError("HostInventory", f"{self.host}.gpu_nics[{g}]", n,
                                      f"not an index into the host's {len(self.nics)} nics")
        if self.gpu_nics and self.gpu_bus_ids and len(self.gpu_nics) != len(self.gpu_bus_ids):
            raise ValidationError("HostInventory", f"{self.host}.gpu_nics", list(self.gpu_nics),
                                  f"{len(self.gpu_nics)} entries for "
                                  f"{len(self.gpu_bus_ids)} GPUs")

    def nic_for_gpu(self, gpu: int) -> int | None:
        """Index (in ``nics``) of the NIC GPU ``gpu`` uses: ``gpu_nics`` when given; else GPU
        i → NIC i when no NICs are listed or as many NICs as GPUs (rail-optimised); else, when
        the GPU count is a multiple of the NIC count, contiguous blocks (8 GPUs / 4 NICs:
        GPUs 0, 1 → NIC 0; one bonded NIC serves every GPU); else None (unknown)."""
        n_gpus, n_nics = len(self.gpu_bus_ids), len(self.nics)
        if gpu < 0:
            return None
        if self.gpu_nics:
            return self.gpu_nics[gpu] if gpu < len(self.gpu_nics) else None
        if n_nics == 0:
            return gpu
        if n_gpus == 0 or n_gpus == n_nics:
            return gpu if gpu < n_nics else None
        if n_gpus % n_nics == 0 and gpu < n_gpus:
            return gpu // (n_gpus // n_nics)
        return None

    def gpus_for_nic(self, nic: int) -> tuple[int, ...]:
        """The GPUs that use NIC ``nic`` (index in ``nics``), by :meth:`nic_for_gpu`."""
        n = len(self.gpu_nics) or len(self.gpu_bus_ids)
        if n == 0:
            return (nic,) if nic >= 0 and (not self.nics or nic < len(self.nics)) else ()
        return tuple(g for g in range(n) if self.nic_for_gpu(g) == nic)

    def gpu_for_ip(self, ip: str) -> int | None:
        """The GPU behind ``ip`` when ``ip`` is NIC j's data-plane address and exactly one GPU
        uses NIC j (rail-optimised: NIC i and GPU i share a PCIe switch); else, when ``ips``
        lists exactly one address per GPU, its index; else None (a management address, or a
        NIC shared by several GPUs, names only the host)."""
        if ip in self.rail_ips:
            gpus = self.gpus_for_nic(self.rail_ips.index(ip))
            return gpus[0] if len(gpus) == 1 else None
        if len(self.ips) > 1 and len(self.ips) == len(self.gpu_bus_ids) and ip in self.ips:
            return self.ips.index(ip)
        return None

    def gpu_for_bus(self, bus: str) -> int | None:
        n = normalise_bus_id(bus)
        return self.gpu_bus_ids.index(n) if n in self.gpu_bus_ids else None

    def nic_for_bus(self, bus: str) -> int | None:
        """Index in ``nics`` of the NIC at PCI ``bus`` (a kernel line names a NIC by its
        bus and netdev, ``mlx5_core 0000:dc:00.0 enp220s0np0: Link down``), else None."""
        n = normalise_bus_id(bus)
        i = self.nic_bus_ids.index(n) if n in self.nic_bus_ids else None
        return i if i is not None and i < len(self.nics) else None


@dataclass(slots=True)
class Inventory:
    hosts: dict[str, HostInventory] = field(default_factory=dict)
    jobs: dict[str, tuple[str, ...]] = field(default_factory=dict)  # job -> hosts
    ranks: dict[str, dict[int, tuple[str, int]]] = field(default_factory=dict)  # job -> rank -> (host, gpu)
    _by_ip: dict[str, str] = field(default_factory=dict)

    def add_host(self, h: HostInventory) -> None:
        self.hosts[h.host] = h
        for ip in (*h.ips, *h.rail_ips):
            self._by_ip[ip] = h.host

    def merge(self, other: Inventory) -> Inventory:
        """Add another inventory's hosts, jobs and rank maps (e.g. several simulated runs
        served by one worker). Names must not collide; an IP already known is an error."""
        for h in other.hosts.values():
            clash = [ip for ip in (*h.ips, *h.rail_ips)
                     if ip in self._by_ip and self._by_ip[ip] != h.host]
            if h.host in self.hosts or clash:
                raise ConfigError(f"inventory merge: host {h.host} or its IPs {clash} already known")
            self.add_host(h)
        self.jobs.update(other.jobs)
        self.ranks.update(other.ranks)
        return self

    def host_for_ip(self, ip: str) -> str | None:
        return self._by_ip.get(ip)

    def to_wire(self) -> dict[str, Any]:
        return {
            "hosts": [{"host": h.host, "ips": list(h.ips), "gpu_bus_ids": list(h.gpu_bus_ids),
                       "nics": list(h.nics), "tor": list(h.tor),
                       **({"rail_ips": list(h.rail_ips)} if h.rail_ips else {}),
                       **({"gpu_nics": list(h.gpu_nics)} if h.gpu_nics else {}),
                       **({"nic_bus_ids": list(h.nic_bus_ids)} if h.nic_bus_ids else {})}
                      for h in self.hosts.values()],
            "jobs": {j: list(hs) for j, hs in self.jobs.items()},
            "ranks": {j: {str(r): [h, g] for r, (h, g) in m.items()} for j, m in self.ranks.items()},
        }

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> Inventory:
        """The inventory from its JSON form; a malformed one raises ValidationError."""
        if not isinstance(d, Mapping):
            raise DecodeError(f"inventory: not a JSON object but {type(d).__name__}")
        try:
            return cls._from_wire(d)
        except (TypeError, ValueError, AttributeError, IndexError, KeyError) as e:
            raise DecodeError(f"inventory: malformed hosts, jobs or ranks ({type(e).__name__}: "
                              f"{e}); docs/wire-format.md has its form") from e

    @classmethod
    def _from_wire(cls, d: Mapping[str, Any]) -> Inventory:
        inv = cls()
        for h in d.get("hosts", []):
            if not isinstance(h, Mapping) or not isinstance(h.get("host"), str):
                raise ValidationError("Inventory", "hosts", h, "host entry without a name")
            buses = tuple(normalise_bus_id(b) or b for b in h.get("gpu_bus_ids", []))
            gpu_nics = h.get("gpu_nics", [])
            if not isinstance(gpu_nics, list):
                raise ValidationError("Inventory", f"{h['host']}.gpu_nics", gpu_nics,
                                      "not a list of NIC indices")
            nic_buses = h.get("nic_bus_ids", [])
            if not isinstance(nic_buses, list) or not all(isinstance(b, str) for b in nic_buses):
                raise ValidationError("Inventory", f"{h['host']}.nic_bus_ids", nic_buses,
                                      "not a list of PCI bus ids")
            inv.add_host(HostInventory(h["host"], tuple(h.get("ips", [])), buses,
                                       tuple(h.get("nics", [])), tuple(h.get("tor", [])),
                                       tuple(h.get("rail_ips", [])), tuple(gpu_nics),
                                       tuple(normalise_bus_id(b) or b for b in nic_buses)))
        inv.jobs = {j: tuple(hs) for j, hs in d.get("jobs", {}).items()}
        inv.ranks = {j: {int(r): (str(v[0]), int(v[1])) for r, v in m.items()}
                     for j, m in d.get("ranks", {}).items()}
        return inv

    def dumps(self) -> bytes:
        return orjson.dumps(self.to_wire())

    @classmethod
    def load(cls, path: str) -> Inventory:
        """An inventory file; OSError if unreadable, ConfigError if it is not one."""
        with open(path, "rb") as fh:
            data = fh.read()
        try:
            return cls.from_wire(orjson.loads(data))
        except orjson.JSONDecodeError as e:
            raise ConfigError(f"inventory {path}: not JSON: {e}") from e
        except WireError as e:
            raise ConfigError(f"inventory {path}: {e}") from e
