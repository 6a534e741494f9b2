"""CBD on real sockets: 4 network namespaces on a bridge stand in for 4 GPU hosts.

Must-show cases (Aegis §6 CBD; Alg. 1 OfflineDiag's >1 KB silent-loss case):
- a healthy batch: every host ``deliver`` (and the light profile's wall time, printed);
- large-packet loss: one host's switch port drops frames above 1000 B; the multi-size probe
  mesh holds exactly that host, a 64 B-only probe of the same mesh sees nothing;
- a slow link: one host's egress at 20 Mbit/s (tbf); the collective test (socket-ring
  fallback driver, as no nccl-tests is installed here) and the probe mesh hold that host;
- mass failure: a required NCCL variable missing on every host gives ONE rollback_update and
  no isolation, through the ``aegis cbd`` command.

Needs root and ``ip netns``: without them the tests FAIL with a message, never skip. Every
lab deletes its namespaces on exit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from processors.cbd_cli import main as cbd_main
from producers.cbd import profiles
from producers.cbd.checks_multi import MeshParams, ProbeMeshCheck
from producers.cbd.config import CbdConfig
from producers.cbd.model import BatchReport
from producers.cbd.planner import Fabric, plan_groups
from producers.cbd.runner import run_cbd
from tests.integration.netns import NetnsLab, require_root


@pytest.fixture
def lab() -> Iterator[NetnsLab]:
    require_root()
    with NetnsLab(4) as lab:
        yield lab
    assert lab.exists() == [], "namespaces left behind"


def held(report: BatchReport) -> list[str]:
    return report.held


def test_healthy_batch_delivers_and_light_profile_time(lab: NetnsLab,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.monotonic()
    report = run_cbd(lab.specs(), profiles.light(), batch="lab-healthy")
    wall = time.monotonic() - t0
    assert report.verdict == "deliver", [(h, v.reasons) for h, v in report.hosts.items()]
    assert report.commands == []
    coll = report.hosts["h1"].results["collective"]
    assert coll.status == "pass" and coll.evidence["driver"] == "socket-ring"
    assert "nccl-tests not usable" in coll.evidence["why_driver"]
    mesh = report.hosts["h1"].results["probe_mesh"]
    assert mesh.evidence["sizes"][0] == 64 and mesh.evidence["sizes"][-1] == 1500
    with capsys.disabled():
        print(f"\n[cbd] light profile on 4 netns hosts: {wall:.2f}s wall "
              f"(stages: {', '.join(f'{k} {v:.2f}s' for k, v in report.stage_s.items())})")


def test_large_packet_loss_is_localised_and_64b_probes_miss_it(lab: NetnsLab) -> None:
    lab.port_mtu(4, 1000)  # h4's switch port drops frames > 1000 B; h4 itself says MTU 1500
    mesh_only = profiles.light().only(["probe_mesh", "nic_link"])
    report = run_cbd(lab.specs(), mesh_only, batch="lab-mtu")
    assert held(report) == ["h4"], [(h, v.reasons) for h, v in report.hosts.items()]
    assert report.hosts["h4"].results["nic_link"].status == "pass"  # config looks fine
    r = report.hosts["h4"].results["probe_mesh"]
    assert r.status == "fail" and "large-packet loss on 3/3 link(s)" in r.reason
    for name, link in r.evidence["links"].items():
        assert link["class"] == "large_packet_loss", name
        assert link["loss"]["udp"]["64"] == 0.0 and link["loss"]["udp"]["1500"] == 1.0
        assert link["loss"]["tcp"]["64"] == 0.0  # TCP probed too (veth lets GSO segments by)
    assert r.evidence["suspects"] == ["h4"]
    assert [c.action for c in report.commands] == ["isolate_host"]

    pingmesh = profiles.Profile("pingmesh-64B", 60.0, mesh_only.stage_budget_s, [], [], [
        ProbeMeshCheck(MeshParams(sizes=(64,), exact_sizes=True, bandwidth=False),
                       timeout_s=20.0)])
    small = run_cbd(lab.specs(), pingmesh, batch="lab-mtu-64")
    assert small.verdict == "deliver", [(h, v.reasons) for h, v in small.hosts.items()]
    assert small.hosts["h4"].results["probe_mesh"].evidence["sizes"] == [64]


def test_slow_link_is_flagged_by_collective_and_probe_mesh(lab: NetnsLab) -> None:
    lab.rate_limit(3)  # tbf rate 20mbit burst 32kbit latency 400ms on h3's eth0
    report = run_cbd(lab.specs(), profiles.light().only(["probe_mesh", "collective"]),
                     batch="lab-slow")
    assert held(report) == ["h3"], [(h, v.reasons) for h, v in report.hosts.items()]
    coll = report.hosts["h3"].results["collective"]
    assert coll.status == "fail" and coll.evidence["driver"] == "socket-ring"
    assert coll.evidence["suspects"] == ["h3"]
    mesh = report.hosts["h3"].results["probe_mesh"]
    assert mesh.status == "fail" and "slow on" in mesh.reason
    for h in ("h1", "h2", "h4"):
        assert report.hosts[h].results["collective"].status == "pass"
        assert report.hosts[h].results["probe_mesh"].status == "pass"


def test_mass_config_failure_rolls_back_once(lab: NetnsLab, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("".join(f"{s.name}=netns:{s.arg} addr={s.addr}\n" for s in lab.specs()))
    cfg = tmp_path / "cbd.toml"
    cfg.write_text('required_env = ["NCCL_SOCKET_IFNAME"]\n')
    rc = cbd_main(["--hosts", str(hosts), "--config", str(cfg), "--batch", "lab-mass",
                   "--only", "versions,nccl_env,nic_link,routes", "--json", "--quiet"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["verdict"] == "rollback"
    assert [(c["action"], c["target"]) for c in doc["commands"]] == [
        ("rollback_update", "lab-mass")]
    (diag,) = doc["diagnoses"]
    assert diag["kind"] == "systemic" and diag["culprits"]["hosts"] == lab.names
    assert doc["systemic"][0]["check"] == "nccl_env" and doc["systemic"][0]["share"] == 1.0
    # the same variable set on every host: consistent, so the batch is delivered
    ok = run_cbd(lab.specs(env={"NCCL_SOCKET_IFNAME": "eth0"}),
                 profiles.light().only(["nccl_env"]),
                 CbdConfig(required_env=["NCCL_SOCKET_IFNAME"]), batch="lab-mass-ok")
    assert ok.verdict == "deliver"


def test_collective_runs_per_planner_group(lab: NetnsLab) -> None:
    fabric = Fabric.from_wire({"hosts": {"h1": ["tor-a"], "h2": ["tor-a"], "h3": ["tor-b"],
                                         "h4": ["tor-b"]}, "n_agg": 2})
    plan = plan_groups(lab.names, fabric, max_group=2)
    assert [[g.hosts for g in s] for s in plan.stages] == [
        [["h1", "h2"], ["h3", "h4"]], [["h1", "h3"]]]
    report = run_cbd(lab.specs(), profiles.light().only(["collective"]), batch="lab-plan",
                     plan=plan)
    assert report.verdict == "deliver", [(h, v.reasons) for h, v in report.hosts.items()]
    assert report.plan is not None and len(report.plan["stages"]) == 2
    assert report.hosts["h4"].results["collective"].evidence["group"] == ["h3", "h4"]
