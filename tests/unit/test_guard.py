"""The guard is pure: diagnoses in event time -> commands, refusals, systemic diagnoses."""

from __future__ import annotations

import dataclasses
import itertools

import orjson
import pytest

from schemas.errors import ConfigError
from schemas.records import Culprits, Diagnosis, IsolationCommand
from sinks.guard import Guard, GuardConfig, host_of

_ids = itertools.count()


def diag(job: str = "j1", kind: str = "critical_error", actions=(), ts: float = 1000.0,
         did: str | None = None, event_ts: float | None = None) -> Diagnosis:
    hosts = tuple(sorted({host_of(t) for a, t in actions if a.startswith("isolate")}))
    return Diagnosis(id=did or f"d{next(_ids)}", job=job, kind=kind, culprits=Culprits(hosts),
                     evidence={"rule": "test", "actions": [list(a) for a in actions]},
                     confidence=0.9, event_ts=event_ts if event_ts is not None else ts - 5,
                     detected_ts=ts, detector="test", summary="s")


def iso(host: str, job: str = "j1") -> list[tuple[str, str]]:
    return [("isolate_host", host), ("restart_job", job)]


def test_critical_error_becomes_isolation_and_restart() -> None:
    g = Guard()
    d = diag(actions=iso("h0017"))
    out = g.decide(d)
    assert [(c.action, c.target) for c in out.commands] == [("isolate_host", "h0017"),
                                                           ("restart_job", "j1")]
    c = out.commands[0]
    assert c.id == IsolationCommand.make_id(d.id, "isolate_host", "h0017")
    assert c.issued_at == d.detected_ts and c.diagnosis_id == d.id and c.job == "j1"
    assert out.refusals == () and out.diagnoses == () and not out.duplicate


def test_duplicate_diagnosis_gives_nothing() -> None:
    g = Guard()
    d = diag(actions=iso("h1"))
    assert g.decide(d).commands
    again = g.decide(d)
    assert again.duplicate and again.items() == []


def test_config_diagnosis_never_isolates() -> None:
    out = Guard().decide(diag(kind="config", actions=[
        ("isolate_host", "h1"), ("restart_job", "j1"), ("run_netdiag", "h1/nic0<->tor-r0")]))
    assert [c.action for c in out.commands] == ["run_netdiag"]
    assert [(r.action, r.reason) for r in out.refusals] == [
        ("isolate_host", "config_no_isolation"), ("restart_job", "follows_refused_isolation")]


@pytest.mark.parametrize(("hosts", "pct", "minimum", "cap"), [
    (16, 10, 2, 2), (100, 10, 2, 10), (0, 10, 2, 2), (25, 10, 2, 2), (30, 10, 2, 3),
    (1000, 5, 2, 50), (8, 50, 2, 4), (100, 0, 1, 1),
])
def test_job_cap(hosts: int, pct: float, minimum: int, cap: int) -> None:
    assert GuardConfig(job_isolation_pct=pct, job_isolation_min=minimum).job_cap(hosts) == cap


@pytest.mark.parametrize("job_hosts", [16, 30, 100])
def test_mass_isolation_is_refused_with_one_systemic_rollback(job_hosts: int) -> None:
    g = Guard(job_hosts=lambda job: job_hosts)
    cap = g.config.job_cap(job_hosts)
    outs = [g.decide(diag(actions=iso(f"h{i:04d}"), ts=1000.0 + i)) for i in range(cap + 5)]
    for o in outs[:cap]:
        assert [c.action for c in o.commands] == ["isolate_host", "restart_job"]
    trip = outs[cap]
    assert [c.action for c in trip.commands] == ["rollback_update"]
    assert {r.reason for r in trip.refusals} == {"blast_radius", "follows_refused_isolation"}
    (systemic,) = trip.diagnoses
    assert systemic.kind == "systemic" and systemic.detector == "guard"
    assert trip.commands[0].diagnosis_id == systemic.id and trip.commands[0].target == "j1"
    assert len(systemic.culprits.hosts) == cap + 1
    for o in outs[cap + 1:]:  # refused, and no second rollback in the window
        assert o.commands == () and o.diagnoses == ()
        assert {r.reason for r in o.refusals} == {"blast_radius", "follows_refused_isolation"}
    all_cmds = [c for o in outs for c in o.commands]
    assert sum(c.action == "rollback_update" for c in all_cmds) == 1


def test_systemic_action_is_configurable() -> None:
    g = Guard(GuardConfig(systemic_action="run_offline_diag"))
    outs = [g.decide(diag(actions=iso(f"h{i}"))) for i in range(3)]
    assert [c.action for c in outs[2].commands] == ["run_offline_diag"]


def test_window_expires_in_event_time() -> None:
    g = Guard(GuardConfig(window_s=3600))
    for i in range(2):
        g.decide(diag(actions=iso(f"h{i}"), ts=1000.0 + i))
    assert g.decide(diag(actions=iso("h2"), ts=2000.0)).refusals  # within the hour
    later = g.decide(diag(actions=iso("h3"), ts=1002.0 + 3600))
    assert [c.target for c in later.commands] == ["h3", "j1"]


def test_late_diagnosis_counts_against_the_window_both_ways() -> None:
    g = Guard()
    g.decide(diag(actions=iso("h1"), ts=5000.0))
    g.decide(diag(actions=iso("h2"), ts=5100.0))
    late = g.decide(diag(actions=iso("h3"), ts=4000.0))  # arrives late, 1000 s earlier
    assert late.commands[0].action == "rollback_update"


def test_hosts_count_once_whatever_the_action() -> None:
    g = Guard()
    g.decide(diag(actions=[("isolate_gpu", "h1/gpu3")]))
    g.decide(diag(actions=[("isolate_host", "h1"), ("isolate_gpu", "h1/gpu5")]))
    out = g.decide(diag(actions=iso("h2")))
    assert [c.target for c in out.commands] == ["h2", "j1"]


def test_two_host_dist_error_is_all_or_nothing() -> None:
    g = Guard()
    g.decide(diag(actions=iso("h1")))
    out = g.decide(diag(kind="dist_error", actions=[
        ("isolate_host", "h2"), ("isolate_host", "h3"), ("restart_job", "j1")], ts=1001))
    refused = {(r.target, r.reason) for r in out.refusals}
    assert ("h2", "blast_radius") in refused and ("h3", "blast_radius") in refused
    assert [c.action for c in out.commands] == ["rollback_update"]


def test_cluster_rate_limit_spans_jobs_and_raises_no_systemic() -> None:
    g = Guard(GuardConfig(cluster_max_isolations=3))
    outs = [g.decide(diag(job=f"j{i}", actions=iso(f"h{i}", f"j{i}"), ts=1000.0 + i))
            for i in range(5)]
    assert all(o.commands for o in outs[:3])
    for o in outs[3:]:
        assert o.commands == () and o.diagnoses == ()
        assert {r.reason for r in o.refusals} == {"cluster_rate_limit",
                                                  "follows_refused_isolation"}


def test_repeat_actions_are_refused_within_the_repeat_window() -> None:
    g = Guard(GuardConfig(repeat_window_s=600))
    g.decide(diag(actions=iso("h1"), ts=1000))
    second = g.decide(diag(kind="hang_compute", actions=iso("h1"), ts=1100))
    assert second.commands == ()
    assert [r.reason for r in second.refusals] == ["repeat", "repeat"]
    third = g.decide(diag(actions=[("restart_job", "j1")], ts=1700))
    assert [c.action for c in third.commands] == ["restart_job"]


@pytest.mark.parametrize(("actions", "reason"), [
    ([("reboot_world", "h1")], "unknown_action"),
    ([("isolate_host",)], "malformed_action"),
    ([("isolate_host", "")], "malformed_action"),
    (["isolate_host h1"], "malformed_action"),
    ([("isolate_host", 7)], "malformed_action"),
])
def test_bad_actions_are_refused_as_values(actions: list, reason: str) -> None:
    d = dataclasses.replace(diag(), evidence={"actions": actions})
    out = Guard().decide(d)
    assert out.commands == () and [r.reason for r in out.refusals] == [reason]


def test_no_actions_no_commands() -> None:
    d = Diagnosis(id="x", job="j", kind="outlier", culprits=Culprits(), evidence={},
                  confidence=0.5, event_ts=1, detected_ts=2, detector="t")
    assert Guard().decide(d).items() == []


def test_job_size_setter_overrides_callable() -> None:
    g = Guard(job_hosts=lambda job: 16)
    g.set_job_size("j1", 100)
    assert g.job_size("j1") == 100 and g.job_size("j2") == 16
    assert Guard().job_size("anything") == 0


def test_own_systemic_diagnosis_fed_back_is_a_duplicate() -> None:
    g = Guard()
    outs = [g.decide(diag(actions=iso(f"h{i}"))) for i in range(3)]
    (systemic,) = outs[2].diagnoses
    assert g.decide(systemic).duplicate


def _run(g: Guard, ds: list[Diagnosis]) -> list:
    return [g.decide(d) for d in ds]


def _scenario() -> list[Diagnosis]:
    ds = [diag(job=f"j{i % 3}", actions=iso(f"h{i}", f"j{i % 3}"), ts=1000.0 + 50 * i,
               did=f"fixed{i}") for i in range(12)]
    ds += [ds[4], diag(kind="config", actions=iso("h99"), ts=1400, did="cfg")]
    return ds


def test_decisions_are_deterministic() -> None:
    assert _run(Guard(), _scenario()) == _run(Guard(), _scenario())


@pytest.mark.parametrize("cut", [0, 3, 7, 13])
def test_snapshot_restore_continues_identically(cut: int) -> None:
    ds = _scenario()
    whole = _run(Guard(), ds)
    first = Guard()
    part1 = _run(first, ds[:cut])
    state = orjson.loads(orjson.dumps(first.snapshot()))  # through a changelog
    second = Guard()
    second.restore(state)
    assert second.snapshot() == first.snapshot()
    assert part1 + _run(second, ds[cut:]) == whole


def test_state_is_pruned_in_event_time() -> None:
    g = Guard(GuardConfig(memory_s=7200))
    g.decide(diag(actions=iso("h1"), ts=1000, did="old"))
    g.decide(diag(actions=iso("h2"), ts=1000 + 10_000))
    snap = g.snapshot()
    assert [s[0] for s in snap["seen"]] != [] and "old" not in [s[0] for s in snap["seen"]]
    assert all(i[2] != "h1" for i in snap["isolations"])


@pytest.mark.parametrize("kw", [
    {"job_isolation_pct": 120}, {"job_isolation_pct": float("nan")}, {"window_s": -1},
    {"systemic_action": "isolate_host"}, {"memory_s": 100}, {"cluster_max_isolations": -1},
])
def test_bad_config_is_rejected(kw: dict) -> None:
    with pytest.raises(ConfigError):
        GuardConfig(**kw)


def test_restore_rejects_unknown_version() -> None:
    with pytest.raises(ConfigError):
        Guard().restore({"v": 99})


def test_restart_after_a_new_isolation_is_never_a_repeat() -> None:
    g = Guard(GuardConfig(repeat_window_s=600))
    g.decide(diag(actions=iso("h1"), ts=1000))
    out = g.decide(diag(actions=iso("h2"), ts=1200))  # a second host fails in the restarted job
    assert [(c.action, c.target) for c in out.commands] == [("isolate_host", "h2"),
                                                           ("restart_job", "j1")]


def test_offline_diag_refused_when_the_culprit_is_already_known() -> None:
    """Aegis Alg. 1: OfflineDiag is the fallback, not a second opinion."""
    from processors.core.base import make_diagnosis
    from sinks.guard import Guard

    g = Guard()
    hang = make_diagnosis(job="j", kind="hang_compute", detector="ccl_alignment", rule="cl_lag",
                          event_ts=100.0, detected_ts=130.0, hosts=["h1"], gpus=["h1/gpu2"],
                          evidence={"actions": [["isolate_host", "h1"], ["restart_job", "j"]]})
    late = make_diagnosis(job="j", kind="offline_needed", detector="decision_tree",
                          rule="offline_diag", event_ts=220.0, detected_ts=225.0,
                          evidence={"actions": [["run_offline_diag", "j"]]})
    assert [c.action for c in g.decide(hang).commands] == ["isolate_host", "restart_job"]
    out = g.decide(late)
    assert not out.commands and [r.reason for r in out.refusals] == ["already_localised"]
    other = make_diagnosis(job="k", kind="offline_needed", detector="decision_tree",
                           rule="offline_diag", event_ts=220.0, detected_ts=225.0,
                           evidence={"actions": [["run_offline_diag", "k"]]})
    assert [c.action for c in g.decide(other).commands] == ["run_offline_diag"]


def test_one_incident_seen_late_by_a_slower_detector_is_a_repeat() -> None:
    """Z-score confirms after T = 600 s what TD/N isolated within seconds: its evidence began
    before the first command, so the same command is a repeat however late it comes."""
    g = Guard()
    fast = [("isolate_gpu", "h1/gpu6"), ("restart_job", "j1")]
    assert len(g.decide(diag(actions=fast, ts=130.0, event_ts=120.0)).commands) == 2
    late = g.decide(diag(actions=fast, ts=810.0, event_ts=120.0))
    assert late.commands == ()
    assert {(r.action, r.reason) for r in late.refusals} == {
        ("isolate_gpu", "already_isolated"), ("restart_job", "repeat")}
    netdiag = [("run_netdiag", "h1/nic2<->tor-r2")]
    assert g.decide(diag(actions=netdiag, ts=140.0, event_ts=121.0)).commands
    (r,) = g.decide(diag(actions=netdiag, ts=820.0, event_ts=125.0)).refusals
    assert r.reason == "repeat" and "evidence began" in r.detail


def test_a_gpu_crash_does_not_escalate_to_its_host() -> None:
    g = Guard()
    assert g.decide(diag(actions=[("isolate_gpu", "h5/gpu6"), ("restart_job", "j1")],
                         ts=65.0, event_ts=60.0)).commands
    hang = g.decide(diag(kind="hang_compute", actions=iso("h5"), ts=90.0, event_ts=61.0))
    assert hang.commands == ()
    assert [(r.action, r.reason) for r in hang.refusals] == [
        ("isolate_host", "already_isolated"), ("restart_job", "repeat")]


def test_a_host_slow_everywhere_escalates_after_one_gpu_was_isolated() -> None:
    """TD/N isolates the first slow GPU in seconds; Z-score's host roll-up names all eight
    after T. The host goes, though its evidence began before the GPU isolation."""
    g = Guard()
    assert g.decide(diag(kind="slow_compute", actions=[("isolate_gpu", "h5/gpu0")],
                         ts=100.0, event_ts=60.0)).commands
    gpus = tuple(f"h5/gpu{i}" for i in range(8))
    rollup = dataclasses.replace(diag(kind="slow_compute", actions=[("isolate_host", "h5")],
                                      ts=700.0, event_ts=60.0), culprits=Culprits(("h5",), gpus))
    assert [(c.action, c.target) for c in g.decide(rollup).commands] == [("isolate_host", "h5")]
    one = dataclasses.replace(diag(kind="hang_compute", actions=[("isolate_host", "h5")],
                                   ts=710.0, event_ts=61.0), culprits=Culprits(("h5",), gpus[:1]))
    assert [r.reason for r in g.decide(one).refusals] == ["already_isolated"]


def test_a_hang_on_a_host_whose_failure_was_the_jobs_own_is_not_isolated() -> None:
    """The OOM killer ended a rank on h5 (config: app_error, no isolation); its peers then
    hang on it and h5's rank goes silent. The hang asked to isolate the healthy h5."""
    g = Guard()
    g.set_job_size("j1", 16)
    oom = dataclasses.replace(diag(kind="config", ts=105.0, event_ts=100.0),
                              culprits=Culprits(("h5",)))
    assert not g.decide(oom).commands
    hang = g.decide(diag(kind="hang_compute", actions=iso("h5"), ts=130.0, event_ts=100.0))
    assert [(c.action, c.target) for c in hang.commands] == [("restart_job", "j1")]
    assert [(r.target, r.reason) for r in hang.refusals] == [("h5", "explained_by_config")]
    later = Guard()
    later.restore(orjson.loads(orjson.dumps(g.snapshot())))
    tree = later.decide(diag(kind="dist_error", actions=iso("h5"), ts=715.0, event_ts=101.0))
    assert [r.reason for r in tree.refusals] == ["explained_by_config", "repeat"]
    xid = later.decide(diag(kind="critical_error", actions=iso("h5"), ts=140.0, event_ts=139.0))
    assert ("isolate_host", "h5") in [(c.action, c.target) for c in xid.commands]
    new = Guard()
    new.decide(oom)
    out = new.decide(diag(kind="hang_compute", actions=iso("h5"), ts=2000.0, event_ts=1990.0))
    assert ("isolate_host", "h5") in [(c.action, c.target) for c in out.commands]


def test_a_new_fault_after_the_isolation_is_acted_on() -> None:
    g = Guard()
    assert g.decide(diag(actions=[("isolate_gpu", "h5/gpu6"), ("restart_job", "j1")],
                         ts=65.0, event_ts=60.0)).commands
    out = g.decide(diag(actions=iso("h5"), ts=2000.0, event_ts=1990.0))
    assert [(c.action, c.target) for c in out.commands] == [("isolate_host", "h5"),
                                                           ("restart_job", "j1")]


def test_an_earlier_finding_processed_late_is_not_refused_as_answered() -> None:
    """Topics consumed at different speeds: the host isolation detected at +30 s reaches the
    guard before the GPU's XID diagnosis detected at +5 s. The earlier finding still acts."""
    g = Guard()
    assert g.decide(diag(kind="hang_compute", actions=iso("h5"), ts=130.0, event_ts=100.0)).commands
    out = g.decide(diag(actions=[("isolate_gpu", "h5/gpu2"), ("restart_job", "j1")],
                        ts=105.0, event_ts=100.0))
    assert ("isolate_gpu", "h5/gpu2") in [(c.action, c.target) for c in out.commands]


def test_offline_diag_refused_when_the_culprit_was_named_but_a_cap_refused_it() -> None:
    """The cluster budget refused a hang's isolation: the culprit is still known, and taking
    every host of the job out is no better (the e2e's 50-fault run sent run_offline_diag)."""
    g = Guard(GuardConfig(cluster_max_isolations=1))
    assert g.decide(diag(job="j0", actions=iso("h0", "j0"), ts=100.0)).commands
    out = g.decide(diag(job="j1", kind="hang_compute", actions=iso("h1", "j1"), ts=130.0))
    assert {r.reason for r in out.refusals} == {"cluster_rate_limit", "follows_refused_isolation"}
    late = g.decide(diag(job="j1", kind="offline_needed", actions=[("run_offline_diag", "j1")],
                         ts=250.0))
    assert not late.commands and [r.reason for r in late.refusals] == ["already_localised"]
    back = Guard(GuardConfig(cluster_max_isolations=1))
    back.restore(g.snapshot())
    assert back.snapshot() == g.snapshot() and back._s.named == {"j1": 130.0}
