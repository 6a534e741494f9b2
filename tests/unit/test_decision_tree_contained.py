"""RestartApp: a non-fatal XID the policy answers with restart_job (NVIDIA's RESTART_APP), and
the application's ECC line following the host's ECC XID (processors.core.tree_contained)."""

from __future__ import annotations

from processors.core.decision_tree import DecisionTree
from processors.core.xid_policy import XidPolicy
from tests.unit.test_decision_tree import JOB, closed, inventory, ip, rec, run, watchdog

NVIDIA_94 = XidPolicy.load().merged({"xid": {"94": {"severity": "degraded",
                                                     "action": "restart_job"}}}, "nvidia.toml")
# formats: leptonai/gpud#1160 (Xid 94), pytorch/pytorch#113128 (the watchdog's CUDA error),
# NVIDIA's catalogue (Xid 8, "GPU stopped processing")
XID94 = "NVRM: Xid (PCI:0000:3b:00): 94, pid=1234, name=python3, Contained ECC error"
XID8 = "NVRM: Xid (PCI:0000:3b:00): 8, pid=1234, name=python3, Channel 00000010"
APP_ECC = ("[rank12]:[E817 17:40:34.227531918 ProcessGroupNCCL.cpp:1515] [PG 0 (default_pg) Rank "
           "12] Process group watchdog thread terminated with exception: CUDA error: "
           "uncorrectable ECC error encountered")


def crash(xid_line: str, app_line: bool = True) -> list:
    """h01's GPU 4 logs ``xid_line``, its process dies (the app's ECC line), peers time out."""
    recs = [rec(10.0, "h01", xid_line, "kernel")]
    if app_line:
        recs.append(rec(11.5, "h01", APP_ECC))
    recs += [rec(40.0 + h, f"h{h:02d}", watchdog(h * 8)) for h in (0, 2, 3)]
    return recs


def test_contained_xid94_restarts_the_job_and_isolates_nothing() -> None:
    tree = DecisionTree(JOB, inventory=inventory(4), policy=NVIDIA_94)
    (d,) = run(tree, crash(XID94), until=200.0)
    assert (d.kind, d.evidence["rule"]) == ("config", "restart_app")
    assert d.evidence["path"] == ["CriticalError:miss", "RestartApp:hit"]
    assert d.evidence["actions"] == [["restart_job", JOB]]
    assert d.culprits.hosts == ("h01",) and d.culprits.gpus == ()
    assert d.evidence["lines"][0]["rule"] == "xid_94" and "XID 94" in d.summary


def test_the_peers_timeouts_after_it_are_its_incident() -> None:
    tree = DecisionTree(JOB, inventory=inventory(4), policy=NVIDIA_94)
    recs = crash(XID94) + [rec(70.0 + h, f"h{h:02d}", closed(ip(1))) for h in (0, 2)]
    assert len(run(tree, recs, until=400.0)) == 1  # no second burst, no OfflineDiag


def test_without_the_application_line_too() -> None:
    tree = DecisionTree(JOB, inventory=inventory(4), policy=NVIDIA_94)
    (d,) = run(tree, crash(XID94, app_line=False), until=200.0)
    assert d.evidence["rule"] == "restart_app" and d.culprits.hosts == ("h01",)


def test_default_policy_keeps_xid94_critical() -> None:
    (d,) = run(DecisionTree(JOB, inventory=inventory(4)), crash(XID94), until=200.0)
    assert d.kind == "critical_error"
    # the application's line names no GPU: the host goes, as for Xid 48 with that line
    assert ["isolate_host", "h01"] in d.evidence["actions"]


def test_application_ecc_line_alone_stays_critical() -> None:
    """No ECC XID on the host (the agent cannot read the kernel log): the line is the only
    word of a hardware ECC error, and stays fatal under either policy."""
    recs = [rec(11.5, "h01", APP_ECC)] + [rec(40.0 + h, f"h{h:02d}", watchdog(h * 8)) for h in (0, 2, 3)]
    (d,) = run(DecisionTree(JOB, inventory=inventory(4), policy=NVIDIA_94), recs, until=200.0)
    assert d.kind == "critical_error" and d.culprits.hosts == ("h01",)


def test_a_shipped_restart_app_xid_before_the_hang_is_contained_too() -> None:
    (d,) = run(DecisionTree(JOB, inventory=inventory(4)), crash(XID8, app_line=False), until=200.0)
    assert d.evidence["rule"] == "restart_app" and d.culprits.hosts == ("h01",)


def test_an_xid_after_the_first_distributed_symptom_is_not_its_cause() -> None:
    recs = [rec(10.0 + h, f"h{h:02d}", watchdog(h * 8)) for h in (0, 2, 3)]
    recs.append(rec(20.0, "h01", XID8, "kernel"))  # the hang's consequence, if anything
    diags = run(DecisionTree(JOB, inventory=inventory(4)), recs, until=400.0)
    assert diags and all(d.evidence["rule"] != "restart_app" for d in diags)


CONTAINED = ("[rank5]: RuntimeError: CUDA error: Invalid access of peer GPU memory over nvlink or "
             "a hardware error")  # ultralytics/ultralytics#24536


def test_cudas_contained_error_follows_the_hosts_xid94_like_the_ecc_line() -> None:
    """CUDA's contained error is the application's view of Xid 94: with the XID made
    non-fatal, the job restarts and nothing is isolated; by default the host goes. Before,
    it was the job's own bug (AppError), whatever the driver said."""
    recs = [r if r.line != APP_ECC else rec(r.ts, r.host, CONTAINED) for r in crash(XID94)]
    (d,) = run(DecisionTree(JOB, inventory=inventory(4), policy=NVIDIA_94), recs, until=200.0)
    assert d.evidence["rule"] == "restart_app" and d.evidence["actions"] == [["restart_job", JOB]]
    (d,) = run(DecisionTree(JOB, inventory=inventory(4)), recs[1:], until=200.0)  # no XID
    assert d.kind == "critical_error" and ["isolate_host", "h01"] in d.evidence["actions"]
