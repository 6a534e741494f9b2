"""Scenario names for ``aegis simulate --scenario``: healthy, each catalogue fault, and mixed."""

from __future__ import annotations

from producers.sim.faults import CATALOGUE

HEALTHY = "healthy"
MIXED = "mixed"

SCENARIOS: dict[str, str] = {
    HEALTHY: "no fault: every metric in step across a job's hosts, harmless log noise only",
    **{name: cls.summary for name, cls in CATALOGUE.items()},
    MIXED: "faults sampled with the Aegis component shares, one per job, spaced in time",
}


def describe() -> list[str]:
    """One ``name<TAB>description`` line per scenario, for ``--list``."""
    return [f"{name}\t{text}" for name, text in SCENARIOS.items()]
