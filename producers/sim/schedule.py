"""Which faults a run injects: the scenario, the job and the start time of each, decided before
the first tick (so the ground truth is known up front).

A single scenario goes to one job that fits it. Mixed mode gives every fault its own job and
starts fault k at ``fault_at_s + k × mixed_spacing_s`` (faults on different jobs overlap in
time when the spacing is shorter than a fault). Each fault is drawn among the scenarios that
still fit a free job, with the Aegis §2 component shares (``faults.share_weights``), so a
scenario whose ring requirement (``MIN_RING``) no free job meets is replaced by another one
rather than dropped. With ``mixed_cover_all`` the first faults cover every allowed scenario
once, in a seeded order; a job is always the smallest free one that fits (ties in a seeded
order), which keeps the large jobs for the scenarios that need them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from producers.sim.faults import MIN_RING, MIXED_DEFAULT, share_weights
from producers.sim.topology import Topology
from schemas.errors import ConfigError

if TYPE_CHECKING:
    from producers.sim.simulation import SimConfig

END_MARGIN_S = 60.0  # the default mixed count leaves this much run after the last start


@dataclass(frozen=True, slots=True)
class Slot:
    scenario: str
    job: int
    start_ts: float


def ring_size(topo: Topology, job: int) -> int:
    """Hosts per pipeline stage: the length of the job's data-parallel rings."""
    j = topo.jobs[job]
    return len(j.hosts) // j.pp


def fits(topo: Topology, scenario: str, job: int) -> bool:
    return ring_size(topo, job) >= MIN_RING.get(scenario, 1)


def first_fault_ts(cfg: SimConfig) -> float:
    return cfg.start_ts + round(cfg.fault_at_s / cfg.interval_s) * cfg.interval_s


def plan_faults(cfg: SimConfig, topo: Topology, rng: np.random.Generator,
                single: str | None = None) -> list[Slot]:
    """The faults of a run: ``single`` (a catalogue scenario) once, or mixed mode's draw."""
    at = first_fault_ts(cfg)
    if single is not None:
        jobs = [j for j in range(len(topo.jobs)) if fits(topo, single, j)
                and (cfg.fault_job is None or j == cfg.fault_job)]
        if not jobs:
            need = MIN_RING.get(single, 1)
            raise ConfigError(f"scenario {single!r} needs a job with at least {need} "
                              f"hosts per pipeline stage (hosts={cfg.hosts}, hosts_per_job="
                              f"{cfg.hosts_per_job}, pp={cfg.pp}, fault_job={cfg.fault_job})")
        job = jobs[int(rng.integers(len(jobs)))] if cfg.fault_job is None else jobs[0]
        return [Slot(single, job, at)]
    return _plan_mixed(cfg, topo, rng, at)


def _mixed_count(cfg: SimConfig, n_jobs: int, n_cover: int, at: float) -> int:
    end = cfg.start_ts + cfg.duration_s
    spacing = cfg.mixed_spacing_s
    if cfg.mixed_faults is not None:
        n = cfg.mixed_faults
        if n > n_jobs:
            raise ConfigError(f"mixed_faults={n}: only {n_jobs} jobs (one fault per job)")
        if n > 0 and at + (n - 1) * spacing >= end:
            raise ConfigError(f"mixed_faults={n} at {spacing} s spacing from fault_at_s="
                              f"{cfg.fault_at_s}: the last would start after the run")
    else:
        room = n_jobs if spacing == 0 else int(max(0.0, end - END_MARGIN_S - at) // spacing) + 1
        n = min(n_jobs, max(room, n_cover))
        if n_cover and at + (n_cover - 1) * spacing >= end:
            raise ConfigError(f"mixed_cover_all: {n_cover} faults at {spacing} s spacing do "
                              f"not start within the run")
    if n < n_cover:
        raise ConfigError(f"mixed_cover_all needs {n_cover} faults (one per scenario), "
                          f"got {n} (jobs={n_jobs}, mixed_faults={cfg.mixed_faults})")
    return n


def _plan_mixed(cfg: SimConfig, topo: Topology, rng: np.random.Generator,
                at: float) -> list[Slot]:
    allowed = list(cfg.mixed_scenarios) if cfg.mixed_scenarios else list(MIXED_DEFAULT)
    order = [int(j) for j in rng.permutation(len(topo.jobs))]
    tiebreak = {j: i for i, j in enumerate(order)}
    cover = [allowed[int(i)] for i in rng.permutation(len(allowed))] if cfg.mixed_cover_all else []
    n = _mixed_count(cfg, len(topo.jobs), len(cover), at)
    free = set(order)
    slots: list[Slot] = []
    for k in range(n):
        options = {s: [j for j in free if fits(topo, s, j)] for s in allowed}
        if cover:
            name = next((s for s in cover if options[s]), "")
            if not name:
                raise ConfigError(f"mixed_cover_all: no free job fits {', '.join(cover)} "
                                  f"(hosts_per_job={cfg.hosts_per_job}, pp={cfg.pp})")
            cover.remove(name)
        else:
            candidates = [s for s in allowed if options[s]]
            if not candidates:
                raise ConfigError(f"mixed: fault {k + 1} of {n}: no free job fits any of "
                                  f"{', '.join(allowed)} (hosts_per_job={cfg.hosts_per_job}, "
                                  f"pp={cfg.pp})")
            name = candidates[int(rng.choice(len(candidates), p=share_weights(candidates)))]
        job = min(options[name], key=lambda j: (ring_size(topo, j), tiebreak[j]))
        free.remove(job)
        slots.append(Slot(name, job, at + k * cfg.mixed_spacing_s))
    return slots
