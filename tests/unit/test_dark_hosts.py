"""Hosts that went dark (no line, no agent heartbeat): the tree names every one of them when
the failed connections all touch them (RootDiag:dark_hosts), the guard lets their isolation
past the job's blast radius, and the simulator's host_down / rack_power_loss go silent."""

from __future__ import annotations

import numpy as np
import pytest

from processors.core.decision_tree import DecisionTree
from processors.core.tree_events import DecisionTreeConfig
from processors.core.tree_liveness import Liveness, explained_by_dark
from producers.sim.simulation import SimConfig, Simulation
from schemas.errors import ConfigError
from schemas.records import LogRecord
from schemas.topics import CCL, LOGS, TELEMETRY
from sinks.guard import Guard, GuardConfig
from sinks.guard_state import GuardState
from tests.unit.test_decision_tree import JOB, ib_completion, inventory, ip, rec, run
from tests.unit.test_guard import diag

BEAT = "aegis-agent heartbeat seq=1"


def beats(hosts: range, until: float, dark: dict[int, float], period: float = 5.0) -> list[LogRecord]:
    """Every host's heartbeats every ``period`` from 0 until ``until`` (a dark host: until its
    dark time)."""
    return [LogRecord(f"h{h:02d}", t, "agent", BEAT, JOB)
            for h in hosts for t in np.arange(0.3 * h % period, min(until, dark.get(h, until)), period)]


def rack_down(n: int = 16, down: tuple[int, ...] = (8, 9, 10, 11), at: float = 100.0,
              heartbeats: bool = True, errors_at: float = 120.0) -> list[LogRecord]:
    """``down`` lose power at ``at``; their live ring neighbours' IB errors name the ends."""
    dark = dict.fromkeys(down, at)
    recs = beats(range(n), 160.0, dark) if heartbeats else []
    lo, hi = min(down), max(down)
    for g in range(8):
        recs.append(rec(errors_at + 0.01 * g, f"h{lo - 1:02d}", ib_completion(ip(lo, g)), "nccl"))
        recs.append(rec(errors_at + 0.2 + 0.01 * g, f"h{hi + 1:02d}", ib_completion(ip(hi, g)),
                        "nccl"))
    return recs


def test_a_rack_gone_dark_is_named_whole_in_one_diagnosis() -> None:
    tree = DecisionTree(JOB, inventory=inventory(16))
    [d] = run(tree, rack_down(), until=160.0)
    assert d.evidence["path"][-1] == "RootDiag:dark_hosts"
    assert d.kind == "dist_error" and list(d.culprits.hosts) == ["h08", "h09", "h10", "h11"]
    assert d.evidence["hosts_down"] == ["h08", "h09", "h10", "h11"]
    assert [a for a in d.evidence["actions"] if a[0] == "isolate_host"] == [
        ["isolate_host", f"h{h:02d}"] for h in (8, 9, 10, 11)]
    assert all(96.0 <= t < 100.0 for t in d.evidence["last_heard"].values())


def test_errors_soon_after_the_power_loss_wait_until_the_hosts_are_dark() -> None:
    """NCCL's IB retries give up ~8 s after the loss: at the 5 s settle two of the four have
    missed beats but are not dark yet (15 s); the verdict waits until they are."""
    tree = DecisionTree(JOB, inventory=inventory(16))
    [d] = run(tree, rack_down(errors_at=108.0), until=160.0)
    assert d.evidence["path"][-1] == "RootDiag:dark_hosts"
    assert list(d.culprits.hosts) == ["h08", "h09", "h10", "h11"]
    assert 113.0 < d.detected_ts < 114.0


def test_a_crashed_host_whose_agent_still_beats_is_judged_without_waiting() -> None:
    recs = beats(range(16), 160.0, {})
    recs += [rec(108.0 + 0.1 * h, f"h{h:02d}", ib_completion(ip(8, h % 8)), "nccl") for h in (7, 9)]
    tree = DecisionTree(JOB, inventory=inventory(16))
    [d] = run(tree, recs, until=160.0)
    assert d.evidence["path"][-1] == "RootDiag:hit" and list(d.culprits.hosts) == ["h08"]
    assert d.detected_ts == pytest.approx(108.7 + 5.0)  # the settle, no wait


def test_without_heartbeats_the_tree_falls_back_to_the_links() -> None:
    tree = DecisionTree(JOB, inventory=inventory(16))
    [d] = run(tree, rack_down(heartbeats=False), until=160.0)
    assert "RootDiag:dark_hosts" not in d.evidence["path"] and "hosts_down" not in d.evidence


def test_off_when_dark_s_is_zero() -> None:
    tree = DecisionTree(JOB, DecisionTreeConfig(dark_s=0.0), inventory(16))
    [d] = run(tree, rack_down(), until=160.0)
    assert "RootDiag:dark_hosts" not in d.evidence["path"]


def test_a_live_host_the_errors_name_is_no_dark_host() -> None:
    """h03 keeps beating: the errors naming it are not explained by the dark h08."""
    recs = beats(range(16), 160.0, {8: 100.0})
    recs += [rec(120.0 + h, f"h{h:02d}", ib_completion(ip(3)), "nccl") for h in (2, 4)]
    recs.append(rec(120.5, "h07", ib_completion(ip(8)), "nccl"))
    tree = DecisionTree(JOB, inventory=inventory(16))
    [d] = run(tree, recs, until=160.0)
    assert "RootDiag:dark_hosts" not in d.evidence["path"]
    assert {g.split("/")[0] for g in d.culprits.gpus} | set(d.culprits.hosts) == {"h03"}


def test_liveness_rules() -> None:
    lv = Liveness()
    for h in ("a", "b", "c", "d"):
        for t in range(0, 60, 10):  # a 10 s period: dark after 3 periods = 30 s
            lv.note(h, float(t), "agent", BEAT)
    lv.note("e", 50.0, "training", "loss 1.0")  # never beat: never dark
    assert lv.dark(75.0, "abcde", 15.0, 300.0) == []  # 25 s < 30 s
    assert lv.dark(81.0, "abcde", 15.0, 300.0) == []  # all four silent: the logs are late
    for h in ("b", "c", "d"):
        lv.note(h, 80.0, "agent", BEAT)
    assert lv.dark(81.0, "abcde", 15.0, 300.0) == ["a"]
    assert lv.dark(400.0, "abcde", 15.0, 300.0) == []  # dark for too long: not this incident
    assert lv.dark(81.0, "ab", 15.0, 300.0) == []  # fewer than 3 beating hosts
    back = Liveness.restore(lv.snapshot())
    assert back.snapshot() == lv.snapshot() and back.dark(81.0, "abcde", 15.0, 300.0) == ["a"]
    edge = (1.0, ("b", 0), ("a", 0))
    assert explained_by_dark([edge], ["a"]) and not explained_by_dark([edge], ["c"])
    assert not explained_by_dark([], ["a"])


def test_tree_snapshot_keeps_liveness() -> None:
    recs = rack_down()
    cut = [r for r in recs if r.ts < 110.0]
    whole = run(DecisionTree(JOB, inventory=inventory(16)), recs, until=160.0)
    first = DecisionTree(JOB, inventory=inventory(16))
    run(first, cut)
    second = DecisionTree.restore(first.snapshot(), JOB, inventory=inventory(16))
    resumed = run(second, [r for r in recs if r.ts >= 110.0], until=160.0)
    assert [d.to_wire() for d in resumed] == [d.to_wire() for d in whole]


def _down(hosts: list[str], ts: float = 1000.0):
    d = diag(actions=[*(("isolate_host", h) for h in hosts), ("restart_job", "j1")], ts=ts)
    d.evidence["hosts_down"] = list(hosts)
    return d


def test_guard_isolates_dark_hosts_past_the_job_cap_and_does_not_count_them() -> None:
    g = Guard(job_hosts=lambda job: 16)  # cap max(2, 10% of 16) = 2
    dec = g.decide(_down(["h8", "h9", "h10", "h11"]))
    assert [c.target for c in dec.commands if c.action == "isolate_host"] == ["h8", "h9", "h10", "h11"]
    assert not dec.diagnoses and not dec.refusals
    later = g.decide(diag(actions=[("isolate_host", "h1"), ("isolate_host", "h2")], ts=1500.0))
    assert [c.target for c in later.commands] == ["h1", "h2"]  # the dark four left the cap whole
    state = GuardState.from_wire(g._s.to_wire())
    assert state.down == g._s.down and len(state.down) == 4


def test_guard_policy_off_or_cluster_limit_still_refuse() -> None:
    off = Guard(GuardConfig(down_hosts_past_cap=False), job_hosts=lambda job: 16)
    dec = off.decide(_down(["h8", "h9", "h10", "h11"]))
    assert {r.reason for r in dec.refusals if r.action == "isolate_host"} == {"blast_radius"}
    with pytest.raises(ConfigError, match="down_hosts_past_cap"):
        GuardConfig(down_hosts_past_cap=3)  # type: ignore[arg-type]  # a policy file's typo
    small = Guard(GuardConfig(cluster_max_isolations=3), job_hosts=lambda job: 16)
    dec = small.decide(_down(["h8", "h9", "h10", "h11"]))
    assert {r.reason for r in dec.refusals if r.action == "isolate_host"} == {"cluster_rate_limit"}


@pytest.mark.parametrize(("scenario", "n_down"), [("host_down", 1), ("rack_power_loss", 4)])
def test_simulated_dark_hosts_send_nothing_after_the_fault(scenario: str, n_down: int) -> None:
    sim = Simulation(SimConfig(hosts=16, hosts_per_job=16, scenario=scenario, seed=1,
                               duration_s=200, fault_at_s=60))
    [truth] = sim.truth_doc()["faults"]
    down = set(truth["culprit"]["hosts"])
    assert len(down) == n_down and truth["should_isolate"]
    assert sorted(a[1] for a in truth["expected_actions"] if a[0] == "isolate_host") == sorted(down)
    start = truth["start_ts"]
    after: dict[str, set[str]] = {t.name: set() for t in (TELEMETRY, LOGS, CCL)}
    before = {t.name: set() for t in (TELEMETRY, LOGS, CCL)}
    peers_named = False
    for topic, _key, ts, r in sim.iter_records():
        if r.host in down:
            (after if ts >= start else before)[topic].add(r.host)
        if topic == LOGS.name and r.host not in down and "Got completion" in getattr(r, "line", ""):
            peers_named = True
    assert after == {t.name: set() for t in (TELEMETRY, LOGS, CCL)}
    assert all(v == down for v in before.values()) and peers_named
