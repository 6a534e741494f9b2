"""Cumulative CCL counters (Aegis §4.2: CL/WR/WC) never decrease in any scenario, and WC <= WR."""

from __future__ import annotations

import msgpack
import pytest

from producers.sim.faults import CATALOGUE
from producers.sim.simulation import SimConfig, Simulation

SCENARIOS = ["healthy", *CATALOGUE, "mixed"]


def counter_violations(cfg: SimConfig) -> tuple[int, list[str]]:
    """(snapshots checked, descriptions of every decrease or WC > WR)."""
    last: dict[tuple[str, str, int, str], tuple[int, int, int, int]] = {}
    bad: list[str] = []
    for topic, _, ts, value in Simulation(cfg).iter_encoded():
        if topic != "aegis.ccl":
            continue
        d = msgpack.unpackb(value)
        for r in d["ranks"]:
            for op, cl, wr, wc, seq, _td, _n in r["ops"]:
                key = (d["host"], r["comm"], r["rank"], op)
                if wc > wr or seq > cl:
                    bad.append(f"{key} at {ts}: WR {wr} WC {wc} seq {seq} CL {cl}")
                prev = last.get(key)
                if prev is not None and any(n < p for n, p in zip((cl, wr, wc, seq), prev,
                                                                   strict=True)):
                    bad.append(f"{key} at {ts}: {prev} -> {(cl, wr, wc, seq)}")
                last[key] = (cl, wr, wc, seq)
    return len(last), bad


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_counters_monotonic_for_every_rank(scenario: str) -> None:
    cfg = SimConfig(hosts=12, hosts_per_job=4, scenario=scenario, seed=5, duration_s=150,
                    fault_at_s=30, init_s=3, watchdog_s=40, mixed_spacing_s=10,
                    hosts_per_pod=1 if scenario.startswith("tor_") else 32)
    n, bad = counter_violations(cfg)
    assert n > 0 and bad == []


@pytest.mark.parametrize("scenario", ["optics_flap", "network_hang", "compute_hang"])
def test_counters_monotonic_with_pipeline_stages(scenario: str) -> None:
    cfg = SimConfig(hosts=8, hosts_per_job=8, pp=2, scenario=scenario, seed=2, duration_s=120,
                    fault_at_s=25, init_s=3, watchdog_s=40)
    n, bad = counter_violations(cfg)
    assert n > 0 and bad == []
