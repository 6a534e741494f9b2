"""Whole real incidents through the Phase 1 tree (audit 8; each line's source is in
tests/data/log_lines.jsonl): which end of a link failed, a GPU the driver wants reset, IB
completion error 4 (local protection: ACS), ranks that disagree on a message's size."""

from __future__ import annotations

from processors.core.decision_tree import DecisionTree
from processors.core.log_classifier import classify
from tests.unit.test_decision_tree import (
    JOB,
    TRUNCATED,
    ib_completion,
    ib_local_protection,
    inventory,
    ip,
    rec,
    run,
)

# Lightning-AI/lit-llama#380 (NVIDIA/nccl#905: "a flapping link")
PORT_ERROR = "{h}:34050:34121 [{g}] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async event : port error"
# scitix/sichek#51: the GPU refuses work until it is reset, and no XID is logged
RESET_REQUIRED = ("NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset required [NV_ERR_RESET_REQUIRED] "
                  "(0x00000062) returned from status @ kernel_channel.c:2874")
BUSY = "Test CUDA failure common.cu:1007 'CUDA-capable device(s) is/are busy or unavailable'"


def gid_single(peer_ip: str) -> str:
    """NCCL 2.19-2.22 name the remote GID after a space (nccl#1434), 2.23+ after ``s:``."""
    return ("transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.9.0.1<39430> "
            f"with error 12, opcode 129, len 0, vendor err 129 (Recv) localGid ::ffff:10.9.0.2 "
            f"remoteGid ::ffff:{peer_ip}")


def actions(diags: list) -> list[list[str]]:
    return [a for d in diags for a in d.evidence["actions"]]


def test_a_port_error_on_one_end_isolates_that_end_only() -> None:
    """h00's own HCA reports its port down; h03 only lost its link to h00. Both were isolated
    because NCCL's async port event was not a fault of h00's own."""
    tree = DecisionTree(JOB, inventory=inventory(4))
    recs = [rec(100.0 + 0.01 * g, "h00", PORT_ERROR.format(h="h00", g=g)) for g in range(8)]
    recs.append(rec(104.0, "h03", ib_completion(ip(0, 2))))
    out = run(tree, recs, until=400.0)
    # the peer's line names h00's NIC 2, so RootDiag names the GPU on it; h03 is spared
    assert [a for a in actions(out) if a[0].startswith("isolate")] == [["isolate_gpu", "h00/gpu2"]]
    assert out[0].evidence["path"][:2] == ["CriticalError:miss", "DistError:2hosts:host_evidence"]


def test_port_errors_on_both_ends_still_isolate_both() -> None:
    tree = DecisionTree(JOB, inventory=inventory(2))
    recs = [rec(100.0, "h00", PORT_ERROR.format(h="h00", g=0)),
            rec(100.2, "h01", PORT_ERROR.format(h="h01", g=0)),
            rec(101.0, "h01", ib_completion(ip(0)))]
    isolated = [a for a in actions(run(tree, recs, until=300.0)) if a[0].startswith("isolate")]
    assert isolated == [["isolate_host", "h00"], ["isolate_host", "h01"]]


def test_a_gpu_that_requires_a_reset_is_a_critical_error() -> None:
    e = classify(RESET_REQUIRED)
    assert (e.category, e.severity, e.rule) == ("critical_gpu", "fatal", "nvrm_reset_required")
    tree = DecisionTree(JOB, inventory=inventory(2))
    recs = [rec(30.0, "h01", RESET_REQUIRED, "kernel"), rec(31.0, "h01", BUSY)]
    (d,) = run(tree, recs, until=100.0)
    assert d.kind == "critical_error" and d.culprits.hosts == ("h01",)
    assert actions([d]) == [["isolate_host", "h01"], ["restart_job", JOB]]


def test_error_4_on_every_host_is_config_not_netdiag() -> None:
    """Every host of a ring reports IB error 4 towards its neighbour (ACS enabled: nccl#928):
    the same error everywhere is ConfigCheck's, not 5 run_netdiag."""
    tree = DecisionTree(JOB, inventory=inventory(5))
    recs = [rec(100.0 + 0.1 * h, f"h{h:02d}", ib_local_protection(ip((h + 1) % 5, 1))) for h in range(5)]
    (d,) = run(tree, recs, until=300.0)
    assert d.kind == "config" and d.evidence["config_rule"] == "nccl_ib_local_protection_error"
    assert d.evidence["systemic"] and actions([d]) == []


def test_error_4_on_both_ends_of_a_two_host_job_is_config() -> None:
    tree = DecisionTree(JOB, inventory=inventory(2))
    recs = [rec(100.0, "h00", ib_local_protection(ip(1))), rec(100.3, "h01", ib_local_protection(ip(0)))]
    (d,) = run(tree, recs, until=300.0)
    assert d.kind == "config" and actions([d]) == []


def test_error_4_on_one_end_checks_that_hosts_config() -> None:
    tree = DecisionTree(JOB, inventory=inventory(6))
    (d,) = run(tree, [rec(100.0, "h02", ib_local_protection(ip(4, 2)))], until=300.0)
    assert d.kind == "config" and d.culprits.hosts == ("h02",) and actions([d]) == []


def test_error_4_naming_one_centre_still_goes_to_rootdiag() -> None:
    tree = DecisionTree(JOB, inventory=inventory(8))
    recs = [rec(200.0 + 0.05 * h, f"h{h:02d}", ib_local_protection(ip(5, 3))) for h in range(8) if h != 5]
    (d,) = run(tree, recs, until=300.0)
    assert d.evidence["rule"] == "root_diag" and d.culprits.gpus == ("h05/gpu3",)


def test_one_hosts_message_truncated_in_a_two_host_job_is_not_systemic() -> None:
    """NVIDIA/nccl#626: one receiver's 'message truncated'. It asked for rollback_update: the
    rule was a version mismatch, and 1 host of 2 counted as systemic."""
    tree = DecisionTree(JOB, inventory=inventory(2))
    (d,) = run(tree, [rec(50.0, "h01", TRUNCATED)], until=200.0)
    assert d.kind == "config" and not d.evidence["systemic"]
    assert d.culprits.hosts == ("h01",) and actions([d]) == []


def test_a_remote_gid_after_a_space_names_the_gpu() -> None:
    """h02's NIC 3 dies; the peers' lines name it by its RoCE GID (NCCL 2.19-2.22 form)."""
    assert classify(gid_single(ip(2, 3))).peer == ip(2, 3)
    tree = DecisionTree(JOB, inventory=inventory(4))
    recs = [rec(50.0 + 0.2 * h, f"h{h:02d}", gid_single(ip(2, 3))) for h in (0, 1, 3)]
    (d,) = run(tree, recs, until=200.0)
    assert d.evidence["rule"] == "root_diag" and d.culprits.gpus == ("h02/gpu3",)
