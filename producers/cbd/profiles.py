"""The two CBD suites (Aegis §6): ``full`` < 10 minutes (configuration < 1 min, single-host
3 min, multi-host 6 min) and ``light`` < 1 minute (configuration checks plus the critical
quick tests). Every check carries its own timeout; the profile's budget bounds the batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from producers.cbd.checks_config import CONFIG_CHECKS
from producers.cbd.checks_host import (
    CpuCheck,
    GpuBenchCheck,
    MemoryCheck,
    NvmlHealthCheck,
    ReadSpeedCheck,
    RowRemapCheck,
    XidCheck,
)
from producers.cbd.checks_multi import MeshParams, ProbeMeshCheck
from producers.cbd.collective import CollectiveCheck, RingParams
from schemas.errors import ConfigError

PROFILES = ("light", "full")


@dataclass
class Profile:
    name: str
    budget_s: float
    stage_budget_s: dict[str, float]
    config_checks: list[Any] = field(default_factory=list)
    host_checks: list[Any] = field(default_factory=list)
    batch_checks: list[Any] = field(default_factory=list)

    def all_checks(self) -> list[Any]:
        return [*self.config_checks, *self.host_checks, *self.batch_checks]

    def only(self, names: Iterable[str]) -> Profile:
        """The same profile keeping only the named checks (unknown names are refused)."""
        keep = set(names)
        known = {c.name for c in self.all_checks()}
        if keep - known:
            raise ConfigError(f"unknown check(s) {sorted(keep - known)}; profile {self.name} "
                              f"has {sorted(known)}")
        return Profile(self.name, self.budget_s, self.stage_budget_s,
                       [c for c in self.config_checks if c.name in keep],
                       [c for c in self.host_checks if c.name in keep],
                       [c for c in self.batch_checks if c.name in keep])


def light() -> Profile:
    """< 1 min: configuration, NVML health, row remaps, XIDs, a short GPU test (torch only),
    a quick multi-size probe mesh and a small collective."""
    return Profile(
        "light", 60.0, {"facts": 15.0, "config": 5.0, "single_host": 20.0, "multi_host": 35.0},
        [c() for c in CONFIG_CHECKS],
        [NvmlHealthCheck(), RowRemapCheck(), XidCheck(),
         GpuBenchCheck(seconds=0.5, timeout_s=18.0)],
        [ProbeMeshCheck(MeshParams(udp_count=20, tcp_count=3, bw_cap_s=0.3, bw_cap_mb=32),
                        timeout_s=20.0),
         CollectiveCheck(RingParams(mb=4, link_mb=32, link_cap_s=0.3, timeout_s=8.0),
                         timeout_s=15.0, nccl_max_bytes="64M")])


def full() -> Profile:
    """< 10 min: everything, with longer measurements and pairwise nccl-tests runs."""
    return Profile(
        "full", 600.0, {"facts": 30.0, "config": 30.0, "single_host": 180.0,
                        "multi_host": 360.0},
        [c() for c in CONFIG_CHECKS],
        [NvmlHealthCheck(), RowRemapCheck(), XidCheck(),
         GpuBenchCheck(seconds=8.0, timeout_s=120.0), CpuCheck(seconds=2.0),
         MemoryCheck(seconds=2.0), ReadSpeedCheck(timeout_s=60.0)],
        [ProbeMeshCheck(MeshParams(udp_count=200, tcp_count=10, bw_cap_s=1.0, bw_cap_mb=256,
                                   bw_pairs="mesh"),
                        timeout_s=150.0),
         CollectiveCheck(RingParams(mb=64, link_mb=512, link_cap_s=2.0, timeout_s=60.0),
                         timeout_s=200.0, nccl_max_bytes="1G", pairwise=True)])


def get(name: str) -> Profile:
    if name == "light":
        return light()
    if name == "full":
        return full()
    raise ConfigError(f"profile {name!r} not one of {PROFILES}")
