"""What-if: rule changes change exactly the expected diagnoses.

- XID 94 made non-fatal (an override XID policy): the critical_error on the GPU that logged
  it disappears, and nothing else moves; on the whole simulated crash, a restart_app config
  diagnosis restarts the job instead, and nothing is isolated;
- a shorter Z-score window T: the slow_network on the ECN-marking NIC is detected earlier.
"""

from __future__ import annotations

import orjson
import pytest

from processors import replay
from processors.core.base import make_diagnosis
from processors.whatif import compare, diff_doc, diff_lines
from producers.sim import log_templates as lt
from producers.sim.simulation import SimConfig, Simulation
from schemas import codec
from schemas.recording import RecordingWriter
from schemas.records import IsolationCommand, LogRecord
from schemas.topics import LOGS, TELEMETRY
from sinks.base import GuardRefusal


def diag(kind="slow_network", host="h1", detected=100.0, event=50.0, conf=0.8, rule="r",
         actions=(("run_netdiag", "h1/nic0<->tor"),)):
    return make_diagnosis(job="j", kind=kind, detector="d", rule=rule, event_ts=event,
                          detected_ts=detected, hosts=[host], confidence=conf,
                          evidence={"actions": [list(a) for a in actions]})


def cmd(d, action="run_netdiag", target="h1/nic0<->tor"):
    return IsolationCommand(IsolationCommand.make_id(d.id, action, target), d.job, action,
                            target, "r", d.id, d.detected_ts)


# ---- pure comparison ------------------------------------------------------------------
def test_identical_outputs_have_no_difference():
    d = diag()
    diff = compare([d, cmd(d)], [d, cmd(d)])
    assert diff.empty and diff.diagnoses.same == 1 and diff.commands.same == 1


def test_appear_disappear_and_change():
    kept, gone, new = diag(host="h1"), diag(host="h2"), diag(host="h3")
    earlier = diag(host="h1", detected=60.0, conf=0.9)
    diff = compare([kept, gone, cmd(kept)], [earlier, new, cmd(earlier)])
    assert diff.diagnoses.appear == [new] and diff.diagnoses.disappear == [gone]
    (pair,) = diff.diagnoses.change
    assert pair.fields == {"detected_ts": [100.0, 60.0], "confidence": [0.8, 0.9]}
    (cpair,) = diff.commands.change  # same action and target on the same finding
    assert cpair.fields == {"issued_at": [100.0, 60.0]}


def test_changed_actions_and_several_incidents_pair_in_time_order():
    a1, a2 = diag(event=10.0, detected=20.0), diag(event=500.0, detected=520.0)
    b1 = diag(event=10.0, detected=20.0, actions=())
    diff = compare([a1, a2], [b1])
    assert [p.fields for p in diff.diagnoses.change] == [
        {"actions": [[["run_netdiag", "h1/nic0<->tor"]], []]}]
    assert diff.diagnoses.disappear == [a2]


def test_refusals_are_compared_too():
    d = diag()
    r = GuardRefusal(d.id, "isolate_host", "h1", "blast_radius", "j", "", 100.0)
    diff = compare([d], [d, r])
    assert diff.refusals.appear == [r]


def test_renderings():
    gone = diag(host="h2")
    diff = compare([gone], [])
    lines = diff_lines(diff, "default", "cand.toml")
    assert lines[0].startswith("what-if: cand.toml vs default: diagnoses +0 -1 ~0 =0")
    assert lines[1].startswith("- diagnosis slow_network job=j hosts=h2")
    doc = orjson.loads(orjson.dumps(diff_doc(diff, "default", "cand.toml")))
    assert doc["format"] == "aegis-whatif" and not doc["identical"]
    assert doc["summary"]["diagnoses"] == {"appear": 0, "disappear": 1, "change": 0, "same": 0}
    assert doc["diagnoses"]["disappear"][0]["id"] == gone.id


# ---- on simulated records -------------------------------------------------------------
def _write(path, sim, entries):
    with RecordingWriter(str(path), meta=sim.header_meta()) as w:
        for e in entries:
            w.emit_encoded(*e)


@pytest.fixture(scope="module")
def xid94_recording(tmp_path_factory):
    """A healthy job whose host h0003 logs one Xid 94 on GPU 2, 60 s in (logs only)."""
    sim = Simulation(SimConfig(hosts=8, hosts_per_job=8, scenario="healthy", seed=4,
                               duration_s=150))
    ts = sim.config.start_ts + 60.25
    line = lt.xid(sim.inventory.hosts["h0003"].gpu_bus_ids[2], 94, "Contained ECC error.", 4242)
    rec = LogRecord("h0003", ts, "kernel", line, "job-000")
    logs = [e for e in sim.iter_encoded() if e[0] == LOGS.name]
    at = next(i for i, e in enumerate(logs) if e[2] > ts)
    logs.insert(at, (LOGS.name, rec.key, ts, codec.encode(rec)))
    path = tmp_path_factory.mktemp("whatif") / "xid94.aegis"
    _write(path, sim, logs)
    return path


def test_xid94_non_fatal_removes_exactly_the_critical_error(xid94_recording, tmp_path, capsys):
    (tmp_path / "xid94.toml").write_text('[xid.94]\nseverity = "degraded"\naction = "restart_job"\n')
    pol = tmp_path / "nvidia.toml"
    pol.write_text('xid_policy = "xid94.toml"\n')
    out, dj = tmp_path / "cand.jsonl", tmp_path / "diff.json"
    code = replay.main([str(xid94_recording), "--policy", str(pol), "-o", str(out),
                        "--diff-json", str(dj), "--fail-on-diff"])
    assert code == 1  # the candidate differs
    printed = capsys.readouterr().out
    doc = orjson.loads(dj.read_bytes())
    dd = doc["diagnoses"]
    assert dd["appear"] == [] and dd["change"] == []
    (gone,) = dd["disappear"]
    assert gone["kind"] == "critical_error" and gone["culprits"]["gpus"] == ["h0003/gpu2"]
    assert gone["evidence"]["path"] == ["CriticalError:hit"]
    assert doc["summary"]["diagnoses"]["same"] == 0
    gone_cmds = {(c["action"], c["target"]) for c in doc["commands"]["disappear"]}
    assert ("restart_job", "job-000") in gone_cmds and doc["commands"]["appear"] == []
    assert "- diagnosis critical_error job=job-000 gpus=h0003/gpu2" in printed
    assert out.read_bytes() == b""  # under the candidate nothing is diagnosed at all


@pytest.fixture(scope="module")
def ecn_recording(tmp_path_factory):
    """nic_ecn on one 8-host job, telemetry only (the Z-score detector's input)."""
    sim = Simulation(SimConfig(hosts=8, hosts_per_job=8, scenario="nic_ecn", seed=1,
                               duration_s=780, fault_at_s=60))
    path = tmp_path_factory.mktemp("whatif") / "ecn.aegis"
    _write(path, sim, (e for e in sim.iter_encoded() if e[0] == TELEMETRY.name))
    return path, sim.truth[0]


def test_shorter_window_detects_slow_network_earlier(ecn_recording, tmp_path):
    path, fault = ecn_recording
    pol = tmp_path / "short.toml"
    pol.write_text("[zscore]\nwindow_s = 120.0\n")
    dj = tmp_path / "diff.json"
    assert replay.main([str(path), "--policy", str(pol), "-o", str(tmp_path / "c.jsonl"),
                        "--diff-json", str(dj)]) == 0
    doc = orjson.loads(dj.read_bytes())
    nic = fault["culprit"]["nics"][0]
    changed = [c for c in doc["diagnoses"]["change"]
               if c["policy"]["kind"] == "slow_network" and c["policy"]["evidence"]["device"] == nic]
    assert len(changed) == 1, doc["summary"]
    base_ts, new_ts = changed[0]["fields"]["detected_ts"]
    assert new_ts <= base_ts - 400  # T 600 s -> 120 s: at least 480 s earlier, less a sub-window
    assert changed[0]["policy"]["evidence"]["window_s"] == 120.0
    everything = [x for part in ("appear", "disappear") for x in doc["diagnoses"][part]] + \
        [c["policy"] for c in doc["diagnoses"]["change"]]
    assert {x["detector"] for x in everything} == {"zscore"}  # only the Z-score detector moved


def test_xid94_non_fatal_on_the_whole_crash_restarts_without_isolating(tmp_path) -> None:
    """The simulated Xid 94 crash (every topic: the kernel's Xid 94, the application's `CUDA
    error: uncorrectable ECC error`, the peers' hang and timeouts): under NVIDIA's RESTART_APP
    the critical_error and its isolation are gone, a restart_app config diagnosis restarts the
    job, and the CCL hang detector's isolation of that host is refused as its consequence."""
    sim = Simulation(SimConfig(hosts=8, hosts_per_job=8, scenario="xid94", seed=4, duration_s=300))
    (fault,) = sim.truth
    host = fault["culprit"]["hosts"][0]
    path = tmp_path / "x94.aegis"
    _write(path, sim, sim.iter_encoded())
    (tmp_path / "xid94.toml").write_text('[xid.94]\nseverity = "degraded"\naction = "restart_job"\n')
    pol = tmp_path / "nvidia.toml"
    pol.write_text('xid_policy = "xid94.toml"\n')
    dj = tmp_path / "diff.json"
    assert replay.main([str(path), "--policy", str(pol), "-o", str(tmp_path / "c.jsonl"),
                        "--diff-json", str(dj)]) == 0
    doc = orjson.loads(dj.read_bytes())
    dd, cc, rr = doc["diagnoses"], doc["commands"], doc["refusals"]
    assert [(x["kind"], x["culprits"]["hosts"]) for x in dd["disappear"]] == [("critical_error", [host])]
    assert [(x["kind"], x["evidence"]["rule"], x["culprits"]["hosts"]) for x in dd["appear"]] == [
        ("config", "restart_app", [host])]
    assert dd["change"] == [] and doc["summary"]["diagnoses"]["same"] == 1  # the CCL hang
    assert {(c["action"], c["target"]) for c in cc["disappear"]} == {
        ("isolate_host", host), ("restart_job", fault["job"])}
    assert [(c["action"], c["target"]) for c in cc["appear"]] == [("restart_job", fault["job"])]
    assert [(r["action"], r["target"], r["reason"]) for r in rr["disappear"]] == [
        ("isolate_host", host, "already_isolated")]
    assert [(r["action"], r["target"], r["reason"]) for r in rr["appear"]] == [
        ("isolate_host", host, "explained_by_config")]
