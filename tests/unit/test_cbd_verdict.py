"""Verdicts and the mass-failure rule (Aegis §6: roll back instead of isolating everyone)."""

from __future__ import annotations

import pytest

from producers.cbd.config import CbdConfig
from producers.cbd.model import BatchReport, CheckResult
from producers.cbd.report import baseline_from_report, render_text
from producers.cbd.verdict import decide, systemic_checks
from schemas.records import Diagnosis, IsolationCommand

KINDS = {"nccl_env": "config", "nvml_health": "critical_error", "probe_mesh": "slow_network"}
HOSTS = [f"h{i}" for i in range(1, 9)]


def results(fail: dict[str, list[str]] | None = None, error: dict[str, list[str]] | None = None
            ) -> dict[str, dict[str, CheckResult]]:
    out = {}
    for h in HOSTS:
        rs = {}
        for c in KINDS:
            status = "pass"
            if h in (fail or {}).get(c, []):
                status = "fail"
            elif h in (error or {}).get(c, []):
                status = "error"
            rs[c] = CheckResult(c, status, f"{c} {status} on {h}")
        out[h] = rs
    return out


def run(res: dict, cfg: CbdConfig | None = None) -> BatchReport:
    return decide("pod-7", res, KINDS, cfg or CbdConfig(), 1000.0, 1030.0, hosts=HOSTS)


def test_healthy_batch_delivers_everything() -> None:
    r = run(results())
    assert r.verdict == "deliver" and r.delivered == HOSTS
    assert r.diagnoses == [] and r.commands == []


def test_one_bad_host_is_held_and_isolated_with_a_stable_id() -> None:
    r = run(results(fail={"nvml_health": ["h3"], "probe_mesh": ["h3"]}))
    assert r.verdict == "partial" and r.held == ["h3"]
    (d,) = r.diagnoses
    (c,) = r.commands
    assert d.kind == "critical_error" and d.culprits.hosts == ("h3",)
    assert d.evidence["actions"] == [["isolate_host", "h3"]]
    assert c.action == "isolate_host" and c.target == "h3" and c.diagnosis_id == d.id
    assert c.id == f"{d.id}:isolate_host:h3" and c.issued_at == 1030.0
    again = run(results(fail={"nvml_health": ["h3"], "probe_mesh": ["h3"]}))
    assert again.commands[0].id == c.id  # same run -> same ids: never issued twice
    assert Diagnosis.from_wire(d.to_wire()) == d
    assert IsolationCommand.from_wire(c.to_wire()) == c


def test_mass_failure_gives_one_rollback_and_no_isolation() -> None:
    r = run(results(fail={"nccl_env": HOSTS[:6]}))
    assert r.verdict == "rollback"
    assert [c.action for c in r.commands] == ["rollback_update"]
    (d,) = r.diagnoses
    assert d.kind == "systemic" and r.commands[0].target == "pod-7"
    assert d.evidence["actions"] == [["rollback_update", "pod-7"]]
    assert d.evidence["systemic"][0]["share"] == 0.75
    assert all(r.hosts[h].systemic_checks == ["nccl_env"] for h in HOSTS[:6])
    assert r.hosts["h7"].verdict == "deliver"


def test_mass_failure_plus_an_independent_fault() -> None:
    r = run(results(fail={"nccl_env": HOSTS, "nvml_health": ["h2"]}))
    actions = sorted((c.action, c.target) for c in r.commands)
    assert actions == [("isolate_host", "h2"), ("rollback_update", "pod-7")]


@pytest.mark.parametrize("share, failing, systemic", [
    (0.5, 4, True), (0.5, 3, False), (0.25, 2, True), (1.0, 7, False)])
def test_mass_share_threshold(share: float, failing: int, systemic: bool) -> None:
    found = systemic_checks(results(fail={"nccl_env": HOSTS[:failing]}),
                            CbdConfig(mass_share=share))
    assert bool(found) == systemic


def test_not_applicable_hosts_do_not_dilute_the_share() -> None:
    res = results(fail={"nvml_health": HOSTS[:2]})
    for h in HOSTS[2:]:
        res[h]["nvml_health"] = CheckResult("nvml_health", "not_applicable", "no GPU")
    assert systemic_checks(res, CbdConfig())[0]["share"] == 1.0


def test_errors_hold_without_isolation() -> None:
    r = run(results(error={"probe_mesh": ["h5"]}))
    assert r.held == ["h5"] and r.commands == []
    relaxed = run(results(error={"probe_mesh": ["h5"]}), CbdConfig(hold_on_error=False))
    assert relaxed.verdict == "deliver"


def test_report_rendering_and_baseline() -> None:
    res = results(fail={"nvml_health": ["h3"]})
    res["h1"]["probe_mesh"] = CheckResult("probe_mesh", "pass", "", {
        "links": {"h1<->h2": {"gbps": {"h1->h2": 4.0, "h2->h1": 6.0}}}})
    r = run(res)
    text = render_text(r)
    assert "PARTIAL" in text and "command: isolate_host h3" in text
    assert baseline_from_report(r) == {"link_gbps": 5.0}
    wire = r.to_wire()
    assert wire["hold"] == ["h3"] and wire["commands"][0]["action"] == "isolate_host"
