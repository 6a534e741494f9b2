"""Scoring against ground truth: matching rules for actions and diagnoses."""

from __future__ import annotations

from processors.core.base import make_diagnosis
from processors.scoring import action_matches, score
from schemas.records import IsolationCommand


def cmd(action: str, target: str, job: str = "j", ts: float = 10.0) -> IsolationCommand:
    return IsolationCommand(f"d:{action}:{target}", job, action, target, "r", "d", ts)


def fault(scenario: str, acts: list[list[str]], kinds: list[str], hosts: list[str],
          nics: list[str] | None = None, must: bool = True) -> dict:
    return {"fault_id": scenario, "scenario": scenario, "job": "j", "start_ts": 5.0, "end_ts": 100.0,
            "culprit": {"hosts": hosts, "gpus": [], "nics": nics or [], "links": []},
            "expected_kinds": kinds, "expected_actions": acts, "must_detect": must}


def test_netdiag_matches_a_link_with_the_bad_nic() -> None:
    assert action_matches(["run_netdiag", "h1/nic3"], cmd("run_netdiag", "h1/nic3<->tor-p0-r3"))
    assert not action_matches(["run_netdiag", "h1/nic3"], cmd("run_netdiag", "h2/nic3<->tor-p0-r3"))
    assert action_matches(["isolate_gpu", "h1/gpu2"], cmd("isolate_host", "h1"))


def test_precision_recall_and_false_isolations() -> None:
    truth = [fault("xid79", [["isolate_host", "h1"], ["restart_job", "j"]], ["critical_error"], ["h1"])]
    s = score(truth, [], [cmd("isolate_host", "h1"), cmd("isolate_host", "h9")])
    assert s.recall == 1.0 and s.precision == 0.5 and s.false_isolations == 1


def test_job_wide_config_finding_matches_by_job_and_kind() -> None:
    d = make_diagnosis(job="j", kind="config", detector="decision_tree", rule="config_check",
                       event_ts=6.0, detected_ts=11.0)
    truth = [fault("config_error", [], ["config"], ["h1", "h2"])]
    s = score(truth, [d], [])
    assert s.results[0].correct and s.false_isolations == 0
    assert not score(truth, [], []).results[0].correct
