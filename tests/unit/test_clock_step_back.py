"""A host whose clock steps back (an NTP step) while it and its job run on: its CCL records
are taken at the job clock and its telemetry still shows it alive, so it is neither silent
to the hang detector nor dark (docs/decisions.md, job clock)."""

from __future__ import annotations

import dataclasses

import pytest

from processors.core.job_clock import InputConfig
from processors.engine import Engine
from processors.pipeline import InputProcessor
from processors.settings import PipelineConfig
from producers.sim.simulation import SimConfig, Simulation
from schemas.codec import encode
from schemas.errors import ConfigError
from schemas.records import CCLRecord, OpCounters, RankSnapshot

STEPPED = "h0009"  # in the faulty job (h0008-h0015 for seed 3), not the culprit


def run_stepped(scenario: str, step: float, at: float = 100.0) -> tuple[Simulation, Engine]:
    """Every record of STEPPED from ``at`` s on is stamped ``step`` s off."""
    sim = Simulation(SimConfig(hosts=16, hosts_per_job=8, scenario=scenario, seed=3,
                               duration_s=420))
    eng = Engine(PipelineConfig(), inventory=sim.inventory)
    t0 = sim.config.start_ts
    for topic, _key, ts, rec in sim.iter_records():
        if getattr(rec, "host", None) == STEPPED and ts - t0 >= at:
            rec = dataclasses.replace(rec, ts=rec.ts + step)
        eng.feed(topic, encode(rec))
    eng.finish()
    return sim, eng


@pytest.mark.parametrize("scenario", ["compute_hang", "network_hang", "xid79", "host_down"])
def test_a_host_stepped_back_a_minute_is_not_isolated_during_another_hosts_fault(
        scenario: str) -> None:
    """Before, its CCL reports were refused as late and rank_silent isolated it."""
    sim, eng = run_stepped(scenario, -60.0)
    culprit = sim.truth[0]["culprit"]["hosts"]
    assert STEPPED not in culprit
    targets = [c.target for c in eng.sink.commands if c.action != "restart_job"]
    assert any(t.startswith(tuple(culprit)) for t in targets)  # still found
    assert not any(STEPPED in t for t in targets)
    assert not any(STEPPED in d.culprits.hosts for d in eng.sink.diagnoses)


@pytest.mark.parametrize("step", [-60.0, -20.0, 60.0])
def test_a_stepped_hosts_early_or_late_lines_do_not_make_a_healthy_host_silent(step: float) -> None:
    """Its watchdog lines reach the tree a minute apart from its peers'. Before, RootDiag's
    silent_host was judged pair_settle_s after the first of them, while the peers were
    still reporting, and isolated h0012, the healthy host that reported last."""
    sim, eng = run_stepped("compute_hang", step)
    [culprit] = sim.truth[0]["culprit"]["hosts"]
    isolated = {c.target for c in eng.sink.commands if c.action.startswith("isolate")}
    assert isolated == {culprit}
    assert all(set(d.culprits.hosts) <= {culprit} for d in eng.sink.diagnoses)


def test_a_healthy_job_with_a_stepped_host_gives_no_diagnosis() -> None:
    """Before, the liveness detector named the live host dark every few seconds."""
    _, eng = run_stepped("healthy", -20.0)
    assert eng.sink.diagnoses == [] and eng.sink.commands == []


def _rec(host: str, ts: float, cl: int) -> bytes:
    snap = RankSnapshot(comm="c1", comm_size=2, rank=0 if host == "a" else 1, gpu=0,
                        ops=(OpCounters("AllReduce", cl, cl, cl),))
    return encode(CCLRecord(host=host, ts=ts, job="j", ranks=(snap,)))


def test_ccl_records_far_behind_the_job_clock_are_taken_at_it_with_a_notice() -> None:
    proc = InputProcessor("ccl")
    proc.handle(_rec("a", 100.0, 1))
    near = proc.handle(_rec("b", 95.0, 1))  # within ccl_behind_s: its own time
    assert not any(r.reason == "clock_skew" for r in near.rejections)
    far = proc.handle(_rec("b", 80.0, 2))
    [note] = [r for r in far.rejections if r.reason == "clock_skew"]
    assert "20s behind the job clock; taken at the job clock 100.000" in note.detail
    assert proc._jobs["j"]["alignment"].roster.members["c1"][1].seen_ts == 100.0
    with pytest.raises(ConfigError, match="ccl_behind_s"):
        InputConfig(ccl_behind_s=0)
