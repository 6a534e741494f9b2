"""Phase 1 on simulator scenarios: only the log stream, through the engine and guard."""

from __future__ import annotations

import pytest

from processors.engine import Engine
from processors.settings import PipelineConfig
from producers.sim.simulation import SimConfig, Simulation
from schemas.topics import LOGS


def run_logs(scenario: str, hosts: int = 16, seed: int = 4,
             config: PipelineConfig | None = None) -> tuple[Simulation, Engine]:
    sim = Simulation(SimConfig(hosts=hosts, hosts_per_job=hosts, scenario=scenario, seed=seed,
                               duration_s=240, fault_at_s=60))
    eng = Engine(config, inventory=sim.inventory)
    for topic, _k, _ts, value in sim.iter_encoded():
        if topic == LOGS.name:
            eng.feed(topic, value)
    eng.sink.flush()
    return sim, eng


def isolated(eng: Engine) -> set[str]:
    return {c.target for c in eng.sink.commands if c.action in ("isolate_host", "isolate_gpu")}


@pytest.mark.parametrize("scenario", ["xid79", "xid48", "xid94", "nvlink_error", "pcie_degradation"])
def test_critical_error_isolates_that_host_and_none_of_its_peers(scenario: str) -> None:
    sim, eng = run_logs(scenario)
    culprit = sim.truth[0]["culprit"]["hosts"][0]
    assert isolated(eng) == {culprit}
    assert [d.kind for d in eng.sink.diagnoses] == ["critical_error"]
    assert any(c.action == "restart_job" for c in eng.sink.commands)


def test_xid94_made_non_fatal_restarts_the_job_without_isolation(tmp_path) -> None:
    """NVIDIA's RESTART_APP for Xid 94: the killed process' peers time out, the application
    logs its ECC error; nothing is isolated, the job restarts."""
    (tmp_path / "xid94.toml").write_text('[xid.94]\nseverity = "degraded"\naction = "restart_job"\n')
    _, eng = run_logs("xid94", config=PipelineConfig(xid_policy_path=str(tmp_path / "xid94.toml")))
    assert [(d.kind, d.evidence["rule"]) for d in eng.sink.diagnoses] == [("config", "restart_app")]
    assert not isolated(eng)
    assert [c.action for c in eng.sink.commands] == ["restart_job"]


def test_two_host_connection_reset_isolates_both() -> None:
    sim, eng = run_logs("conn_reset_2host")
    assert isolated(eng) == set(sim.truth[0]["culprit"]["hosts"]) and len(isolated(eng)) == 2
    assert eng.sink.diagnoses[0].kind == "dist_error"


def test_correctable_ecc_storm_isolates_nothing() -> None:
    _, eng = run_logs("ecc_storm")
    assert not isolated(eng)


def test_config_error_on_every_host_is_config_without_isolation() -> None:
    _, eng = run_logs("config_error")
    assert [d.kind for d in eng.sink.diagnoses] == ["config"]
    assert not isolated(eng)


def test_healthy_run_has_no_diagnosis() -> None:
    _, eng = run_logs("healthy")
    assert not eng.sink.diagnoses and not eng.sink.commands


def test_sixteen_hosts_root_is_the_gpu_whose_connections_fail_first() -> None:
    sim, eng = run_logs("gpu_conn_fail", hosts=16)
    gpu = sim.truth[0]["culprit"]["gpus"][0]
    (d,) = eng.sink.diagnoses
    assert d.kind == "dist_error" and d.culprits.gpus == (gpu,)
    assert d.evidence["path"][-1] == "RootDiag:hit"
    assert isolated(eng) == {gpu}  # that GPU only: not its host, not the peers that reported
    assert any(c.action == "restart_job" for c in eng.sink.commands)
