"""Hosts whose telemetry stopped while their job's other hosts kept sending: one host_dark
diagnosis per group (no action of its own); the guard then lets another detector's isolation
of them past the job's blast radius and refuses NetDiag of their links. Without heartbeats,
a rack's power loss is no longer taken for a bad update."""

from __future__ import annotations

import pytest

from processors.core.telemetry_liveness import LivenessConfig, TelemetryLiveness
from processors.scoring import score
from processors.settings import PipelineConfig
from producers.sim.simulation import SimConfig
from schemas.errors import ConfigError
from schemas.records import TelemetryBatch
from sinks.guard import Guard, GuardConfig
from sinks.guard_state import GuardState
from tests.unit.test_guard import diag
from tests.unit.test_switch_rollup_small_pods import run_engine

JOB = "j1"


def feed(det: TelemetryLiveness, hosts: list[str], t0: int, t1: int, period: int = 1,
         stop: dict[str, int] | None = None, skew: dict[str, int] | None = None) -> list:
    """Every host's batch each ``period`` s in [t0, t1) (a host of ``stop``: until then; of
    ``skew``: stamped that many s off), with ``advance`` after each, as the InputProcessor
    calls it."""
    out = []
    for t in range(t0, t1, period):
        for h in hosts:
            if t < (stop or {}).get(h, t1):
                det.observe(TelemetryBatch(h, float(t + (skew or {}).get(h, 0)), {}, JOB))
            out += det.advance(float(t)).diagnoses
    return out


def test_hosts_that_stop_together_make_one_host_dark_diagnosis() -> None:
    det = TelemetryLiveness(JOB)
    hosts = [f"h{i}" for i in range(8)]
    assert feed(det, hosts, 0, 100) == []
    out = feed(det, hosts, 100, 200, stop={"h2": 100, "h3": 100})
    [d] = out
    assert d.kind == "host_dark" and d.detector == "telemetry_liveness"
    assert d.culprits.hosts == ("h2", "h3") and d.evidence["hosts_down"] == ["h2", "h3"]
    assert d.evidence["actions"] == [] and d.evidence["rule"] == "telemetry_dark"
    assert d.event_ts == 99.0 and d.detected_ts == 115.0  # silent for more than dark_s = 15 s
    assert d.evidence["live_hosts"] == 6 and "h2, h3 stopped sending telemetry" in d.summary
    # heard again, it re-arms: a second outage is a new diagnosis with its own id
    again = feed(det, hosts, 200, 300, stop={"h2": 250})
    assert [x.culprits.hosts for x in again] == [("h2",)] and again[0].id != d.id


def test_no_verdict_when_half_the_job_is_silent_or_too_few_hosts() -> None:
    det = TelemetryLiveness(JOB)
    hosts = [f"h{i}" for i in range(4)]
    feed(det, hosts, 0, 50)
    assert feed(det, hosts, 50, 120, stop={"h0": 50, "h1": 50}) == []  # the telemetry is late
    two = TelemetryLiveness(JOB)
    feed(two, ["a", "b"], 0, 50)
    assert feed(two, ["a", "b"], 50, 120, stop={"a": 50}) == []  # nobody to compare with
    off = TelemetryLiveness(JOB, LivenessConfig(dark_s=0))
    feed(off, hosts, 0, 50)
    assert feed(off, hosts, 50, 120, stop={"h0": 50}) == []


def test_slow_senders_wait_three_intervals_and_old_silence_is_not_this_incident() -> None:
    det = TelemetryLiveness(JOB)
    hosts = [f"h{i}" for i in range(6)]
    feed(det, hosts, 0, 100, period=10)
    [d] = feed(det, hosts, 100, 200, period=10, stop={"h5": 100})
    assert d.detected_ts == 130.0 and d.evidence["dark_s"] == 30.0  # 3 x 10 s, not 15 s
    late = TelemetryLiveness(JOB, LivenessConfig(dark_recent_s=20.0))
    feed(late, hosts, 0, 100, period=10)
    assert feed(late, hosts, 100, 200, period=10, stop={"h5": 100}) == []  # out of the pool


def test_other_jobs_and_non_finite_times_are_left_to_the_zscore_detector() -> None:
    det = TelemetryLiveness(JOB)
    assert det.observe(TelemetryBatch("x", 1.0, {}, "other")).diagnoses == []
    assert det.observe(TelemetryBatch("x", float("nan"), {}, JOB)).diagnoses == []
    assert det.last == {}


def test_snapshot_resumes_to_the_same_diagnoses() -> None:
    hosts = [f"h{i}" for i in range(6)]
    whole = TelemetryLiveness(JOB)
    feed(whole, hosts, 0, 100)
    expect = feed(whole, hosts, 100, 200, stop={"h1": 110})
    first = TelemetryLiveness(JOB)
    feed(first, hosts, 0, 100)
    feed(first, hosts, 100, 120, stop={"h1": 110})
    second = TelemetryLiveness.restore(first.snapshot(), JOB)
    assert second.snapshot() == first.snapshot()
    got = feed(second, hosts, 120, 200, stop={"h1": 110})
    assert [d.to_wire() for d in got] == [d.to_wire() for d in expect] and len(got) == 1
    with pytest.raises(ConfigError, match="v2"):
        TelemetryLiveness.restore({"v": 2}, JOB)


@pytest.mark.parametrize("step", [-20, -60, -200])
def test_a_host_whose_clock_steps_back_is_not_dark(step: int) -> None:
    """An NTP step back: its batches go on, older than the newest it sent. Before, each one
    ended its report and the next check made it dark again: a host_dark every few seconds."""
    det = TelemetryLiveness(JOB)
    hosts = [f"h{i}" for i in range(8)]
    feed(det, hosts, 0, 100)
    assert feed(det, hosts, 100, 500, skew={"h1": step}) == []
    restored = TelemetryLiveness.restore(det.snapshot(), JOB)
    assert restored.snapshot() == det.snapshot()
    # and when it does stop, it is dark once
    [d] = feed(det, hosts, 500, 600, stop={"h1": 500})
    assert d.culprits.hosts == ("h1",) and d.detected_ts == 515.0


def test_an_old_batch_again_does_not_re_report_a_dark_host() -> None:
    det = TelemetryLiveness(JOB)
    hosts = [f"h{i}" for i in range(6)]
    feed(det, hosts, 0, 100)
    [d] = feed(det, hosts, 100, 130, stop={"h5": 100})
    det.observe(TelemetryBatch("h5", 99.0, {}, JOB))  # redelivered: says nothing new
    assert feed(det, hosts, 130, 200, stop={"h5": 100}) == []
    assert d.culprits.hosts == ("h5",)


@pytest.mark.parametrize("bad", [dict(dark_s=-1.0), dict(check_s=0.0), dict(min_hosts=1),
                                 dict(dark_s=30.0, dark_recent_s=10.0),
                                 dict(dark_s=float("nan"))])
def test_config_errors(bad: dict) -> None:
    with pytest.raises(ConfigError, match="liveness"):
        LivenessConfig(**bad)


def _dark(hosts: list[str], ts: float = 1000.0):
    d = diag(kind="host_dark", actions=[], ts=ts, event_ts=ts - 16.0)
    d.evidence["hosts_down"] = list(hosts)
    return d


def _silent(host: str, ts: float = 1015.0):
    return diag(kind="hang_compute", actions=[("isolate_host", host), ("restart_job", "j1")],
                ts=ts, event_ts=984.0)


def test_guard_lets_isolations_of_hosts_shown_dark_past_the_cap() -> None:
    g = Guard(job_hosts=lambda job: 12)  # cap max(2, 10% of 12) = 2
    assert g.decide(_dark(["h16", "h17", "h18", "h19"])).commands == ()
    done = [c.target for h in ("h16", "h17", "h18", "h19")
            for c in g.decide(_silent(h)).commands if c.action == "isolate_host"]
    assert done == ["h16", "h17", "h18", "h19"]
    later = g.decide(diag(actions=[("isolate_host", "h1"), ("isolate_host", "h2")], ts=1500.0))
    assert [c.target for c in later.commands] == ["h1", "h2"]  # the dark four left the cap whole
    assert GuardState.from_wire(g._s.to_wire()).dark == g._s.dark and len(g._s.dark) == 4
    # without the host_dark diagnosis, the same four are capped: a bad update, rolled back
    blind = Guard(job_hosts=lambda job: 12)
    outs = [blind.decide(_silent(h)) for h in ("h16", "h17", "h18", "h19")]
    assert [c.action for o in outs for c in o.commands].count("rollback_update") == 1


def test_guard_refuses_netdiag_of_links_to_a_dark_host_only() -> None:
    g = Guard(job_hosts=lambda job: 12)
    g.decide(_dark(["h16"]))
    dec = g.decide(diag(kind="hang_network", ts=1010.0, event_ts=990.0, actions=[
        ("run_netdiag", "h15<->h16"), ("run_netdiag", "h3<->h4")]))
    assert [c.target for c in dec.commands] == ["h3<->h4"]
    assert [(r.target, r.reason) for r in dec.refusals] == [("h15<->h16", "endpoint_down")]
    # an onset far from the diagnosis' evidence, or the policy off: no exception
    far = g.decide(diag(kind="hang_network", ts=5000.0, event_ts=4990.0,
                        actions=[("run_netdiag", "h15<->h16")]))
    assert [c.target for c in far.commands] == ["h15<->h16"]
    off = Guard(GuardConfig(down_hosts_past_cap=False), job_hosts=lambda job: 12)
    off.decide(_dark(["h16"]))
    dec = off.decide(diag(kind="hang_network", ts=1010.0, event_ts=990.0,
                          actions=[("run_netdiag", "h15<->h16")]))
    assert [c.target for c in dec.commands] == ["h15<->h16"]
    with pytest.raises(ConfigError, match="down_window_s"):
        GuardConfig(down_window_s=-1.0)


def test_rack_power_loss_without_heartbeats_isolates_the_rack() -> None:
    """Agents that send no heartbeat (heartbeat_s 0): the tree cannot see dark hosts, and the
    CCL records alone cannot tell a rack's power from crashed processes."""
    sim, engine = run_engine(SimConfig(hosts=16, hosts_per_job=8, pp=2, hosts_per_pod=4,
                               scenario="rack_power_loss", seed=11, duration_s=420,
                               heartbeat_s=0), PipelineConfig())
    result = score(sim.truth, engine.sink.diagnoses, engine.sink.commands)
    actions = {(c.action, c.target) for c in engine.sink.commands}
    down = sim.truth[0]["culprit"]["hosts"]
    assert {("isolate_host", h) for h in down} <= actions
    assert not any(a in ("rollback_update", "run_netdiag") for a, _ in actions)
    assert result.precision == 1.0 and result.recall == 1.0 and result.false_isolations == 0
    [dark] = [d for d in engine.sink.diagnoses if d.kind == "host_dark"]
    assert list(dark.culprits.hosts) == sorted(down)
    # pp=2: the dead hosts sit in different communicators, yet make one rank_silent
    # diagnosis and one restart, not one per communicator
    [silent] = [d for d in engine.sink.diagnoses if d.evidence.get("rule") == "rank_silent"]
    assert list(silent.culprits.hosts) == sorted(down) and silent.evidence["other_comms"]
    assert [c.action for c in engine.sink.commands].count("restart_job") == 1


def _root(host: str, peers: list[str]):
    d = diag(kind="dist_error", actions=[("isolate_host", host), ("restart_job", "j1")],
             ts=1010.0, event_ts=1005.0)
    d.evidence["peer_hosts"] = list(peers)
    return d


def test_guard_refuses_a_root_whose_failed_connections_all_end_at_down_hosts() -> None:
    g = Guard(job_hosts=lambda job: 12)
    g.decide(_dark(["h16", "h17", "h18", "h19"]))
    dec = g.decide(_root("h15", ["h16", "h19"]))  # the live neighbour of a dead rack
    assert dec.commands == ()
    assert [(r.target, r.reason) for r in dec.refusals] == [
        ("h15", "peers_down"), ("j1", "follows_refused_isolation")]
    # one peer alive, the root itself down, no peers given, or the policy off: isolated
    assert [c.target for c in g.decide(_root("h14", ["h13", "h16"])).commands] == ["h14", "j1"]
    assert [c.target for c in g.decide(_root("h17", ["h16"])).commands] == ["h17", "j1"]
    assert [c.target for c in g.decide(_root("h3", [])).commands] == ["h3", "j1"]
    off = Guard(GuardConfig(down_hosts_past_cap=False), job_hosts=lambda job: 12)
    off.decide(_dark(["h16", "h17", "h18", "h19"]))
    assert [c.target for c in off.decide(_root("h15", ["h16", "h19"])).commands] == ["h15", "j1"]


def test_the_live_neighbour_of_a_dead_rack_is_not_isolated_without_heartbeats() -> None:
    """30 hosts, jobs of 10 in 2 pipeline stages, no heartbeats (seed 31): the stage's one
    survivor was the only host whose connections failed, to 2 of the 4 dead hosts, and
    RootDiag isolated it 5 s before Phase 2 named the rack."""
    sim, engine = run_engine(SimConfig(hosts=30, hosts_per_job=10, pp=2, hosts_per_pod=5, seed=31,
                               scenario="rack_power_loss", duration_s=420, heartbeat_s=0), PipelineConfig())
    result = score(sim.truth, engine.sink.diagnoses, engine.sink.commands)
    assert result.precision == 1.0 and result.recall == 1.0 and result.false_isolations == 0
    assert any(r.reason == "peers_down" for r in engine.sink.refusals)
