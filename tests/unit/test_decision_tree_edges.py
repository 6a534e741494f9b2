"""The Phase 1 decision tree at the edges of a job's life and of its roster: peers outside the
job, host-keyed records, a job stopped from outside, and OfflineDiag's wait for Phase 2. The
log formats and helpers are test_decision_tree's."""

from __future__ import annotations

import pytest

from processors.core.decision_tree import DecisionTree
from schemas.records import LogRecord
from tests.unit.test_decision_tree import (
    JOB,
    closed,
    ib_completion,
    inventory,
    ip,
    rec,
    reset,
    run,
    watchdog,
    xid79,
)


def test_a_peer_outside_the_job_makes_nobody_a_culprit() -> None:
    """One host's connection error to an address no inventory lists (a storage server, a
    stray endpoint): not "errors between 2 hosts", so no isolation; NetDiag checks that link."""
    tree = DecisionTree(JOB, inventory=inventory(5))
    (d,) = run(tree, [rec(60.0, "h01", ib_completion("10.200.1.1"))], until=120.0)
    assert not any(a[0].startswith("isolate") for a in d.evidence["actions"])
    assert d.kind == "hang_network"
    assert d.evidence["actions"] == [["run_netdiag", "10.200.1.1<->h01"]]


def test_a_two_host_job_names_its_other_host_for_an_unresolved_peer() -> None:
    """In a 2-host job the other end of a failed connection is the other host, even when the
    address the line names is not in the inventory (a NAT, an alias)."""
    tree = DecisionTree(JOB, inventory=inventory(2))
    (d,) = run(tree, [rec(60.0, "h01", reset("10.99.0.7"))], until=120.0)
    assert d.kind == "dist_error" and d.culprits.hosts == ("h00", "h01")


SYSTEM_ERROR = ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, "
                "unhandled system error, NCCL version 2.18.1")
SIGTERM = ("W0409 07:28:49.530000 1359 torch/distributed/elastic/agent/server/api.py:719] "
           "Received 15 death signal, shutting down workers")
CANCELLED = "slurmstepd: error: *** STEP 494583.0 ON h00 CANCELLED AT 2024-04-20T09:09:37 ***"


@pytest.mark.parametrize("line", [SIGTERM, CANCELLED])
def test_a_job_stopped_from_outside_isolates_nobody(line: str) -> None:
    """scancel / time limit / SIGTERM: the survivors' connection errors are the shutdown."""
    tree = DecisionTree(JOB, inventory=inventory(4))
    recs = [rec(100.0, "h00", line), rec(100.4, "h01", closed(ip(0))),
            rec(100.6, "h02", reset(ip(0))), rec(101.0, "h03", closed(ip(0)))]
    (d,) = run(tree, recs, until=200.0)
    assert d.evidence["rule"] == "job_terminated" and d.evidence["actions"] == []
    assert d.kind == "config" and d.evidence["path"][-1] == "Terminated:hit"


def test_a_kill_after_the_errors_does_not_explain_them() -> None:
    """srun --kill-on-bad-exit SIGTERMs the others after a crash: the errors came first."""
    tree = DecisionTree(JOB, inventory=inventory(4))
    recs = [rec(100.0, "h01", closed(ip(0))), rec(100.2, "h02", reset(ip(0))),
            rec(100.4, "h03", closed(ip(0))), rec(102.5, "h02", SIGTERM)]
    (d,) = run(tree, recs, until=200.0)
    assert d.evidence["rule"] == "root_diag"
    assert d.evidence["actions"][0][0].startswith("isolate") and d.evidence["actions"][0][1].startswith("h00")


def test_a_host_keyed_record_does_not_make_a_named_peer_a_job_host() -> None:
    """Without a job id the agent keys records by host; a peer that host names is a host of
    the cluster, not of that pseudo-job, so it is not "errors between 2 hosts"."""
    inv = inventory(4)
    tree = DecisionTree("h03", inventory=inv)  # the pseudo-job of h03 (no roster)
    r = LogRecord(host="h03", ts=60.0, source="nccl", line=reset(ip(0)), job=None)
    (d,) = run(tree, [r], until=120.0)
    assert not any(a[0].startswith("isolate") for a in d.evidence["actions"])


def test_a_finding_during_the_offline_wait_takes_precedence() -> None:
    """Timeouts alone head for OfflineDiag; an XID 79 logged during the wait is judged at
    once (its own settle time), and the offline test never goes out."""
    tree = DecisionTree(JOB, inventory=inventory(6))
    recs = [rec(10.0 + 0.5 * h, f"h{h:02d}", watchdog(h * 8)) for h in range(6)]
    assert run(tree, recs, until=60.0) == []
    (d,) = run(tree, [rec(61.0, "h04", xid79(), "kernel")], until=300.0)
    assert d.kind == "critical_error" and d.culprits.hosts == ("h04",)


def test_flush_judges_a_burst_still_waiting_for_offline() -> None:
    tree = DecisionTree(JOB, inventory=inventory(6))
    assert run(tree, [rec(10.0 + 0.5 * h, f"h{h:02d}", watchdog(h * 8)) for h in range(6)]) == []
    (d,) = tree.flush().diagnoses
    assert d.kind == "offline_needed" and d.detected_ts == 135.0


@pytest.mark.parametrize("line", [
    "NVRM: GPU 0000:{bus}: GPU has fallen off the bus.",
    "NVRM: GPU at PCI:0000:{bus}: GPU has fallen off the bus.",
])
def test_a_gpu_fallen_off_the_bus_without_its_xid_takes_the_host(line: str) -> None:
    """The driver's own words for XID 79 take XID 79's action, also when the Xid line comes
    later or never: isolating only the GPU left the host in the job."""
    from tests.unit.test_decision_tree import BUSES

    tree = DecisionTree(JOB, inventory=inventory(4))
    bus = BUSES[2].split(":", 1)[1]
    (d,) = run(tree, [rec(60.0, "h01", line.format(bus=bus))], until=120.0)
    assert d.kind == "critical_error"
    assert d.evidence["actions"] == [["isolate_host", "h01"], ["restart_job", JOB]]


def test_a_gpu_of_another_job_on_a_shared_host_is_not_this_jobs_fault() -> None:
    """The rank map puts the job on GPUs 0-3 of h01 (another job has 4-7): an XID 48 of GPU 4
    is that job's; an XID 48 of GPU 2, or an XID 79 (the whole host), is this job's too."""
    from tests.unit.test_decision_tree import BUSES

    def xid(x: int, g: int) -> str:
        return f"NVRM: Xid (PCI:{BUSES[g][:-2]}): {x}, pid=1, name=python3, Ch 00000001"

    inv = inventory(2)
    inv.ranks[JOB] = {r: ("h00" if r < 8 else "h01", r % 8) for r in range(12)}
    assert run(DecisionTree(JOB, inventory=inv), [rec(60.0, "h01", xid(48, 4))], until=300.0) == []
    (d,) = run(DecisionTree(JOB, inventory=inv), [rec(60.0, "h01", xid(48, 2))], until=300.0)
    assert d.evidence["actions"][0] == ["isolate_gpu", "h01/gpu2"]
    (d,) = run(DecisionTree(JOB, inventory=inv), [rec(60.0, "h01", xid(79, 4))], until=300.0)
    assert d.evidence["actions"][0] == ["isolate_host", "h01"]


def test_an_idle_host_keyed_by_its_name_gets_no_restart_job() -> None:
    """Records without a job id are keyed by their host: an XID 79 on an idle host isolates
    it, and there is no job to restart (a restart_job naming the host used to go out)."""
    tree = DecisionTree("h05", inventory=inventory(8))
    recs = [LogRecord("h05", 60.0, "kernel", xid79(), None)]
    (d,) = run(tree, recs, until=120.0)
    assert d.evidence["actions"] == [["isolate_host", "h05"]]


NIC_DOWN = "mlx5_core 0000:5e:00.0 ens1f0np0: Link down"


def test_the_first_of_a_crashed_hosts_peers_is_not_isolated_with_it() -> None:
    """h03's NCCL fails at 120 s; h00 reports a reset naming h03 3 s later, the other peers
    6-8 s after that. Judging "errors between 2 hosts" at 5 s isolated h00 with h03; the
    pair verdict waits pair_settle_s (15 s) in a job of more hosts, and then RootDiag sees the
    whole picture: h03 alone. (Had h03's line been its own watchdog timeout, the resets would
    be its teardown: test_decision_tree_teardown.)"""
    tree = DecisionTree(JOB, inventory=inventory(6))
    recs = [rec(120.0, "h03", SYSTEM_ERROR), rec(123.0, "h00", reset(ip(3)))]
    recs += [rec(129.0 + h, f"h0{h}", closed(ip(3))) for h in (1, 2, 5)]
    recs += [rec(130.0 + 0.5 * i, f"h0{h}", "heartbeat") for i, h in enumerate(range(6))]
    (d,) = run(tree, recs, until=200.0)
    assert d.evidence["rule"] == "root_diag" and d.culprits.gpus == ("h03/gpu0",)
    assert d.evidence["actions"] == [["isolate_gpu", "h03/gpu0"], ["restart_job", JOB]]
    assert d.detected_ts == 120.0 + 15.0


def test_a_link_fault_between_two_hosts_of_a_bigger_job_still_isolates_both() -> None:
    """Aegis Alg. 1: errors between exactly 2 hosts, and nobody else reports: isolate both,
    once pair_settle_s has passed."""
    tree = DecisionTree(JOB, inventory=inventory(6))
    recs = [rec(120.0, "h01", ib_completion(ip(2))), rec(120.4, "h02", ib_completion(ip(1)))]
    assert run(tree, recs, until=130.0) == []
    (d,) = run(tree, [], until=140.0)
    assert d.evidence["rule"] == "dist_error_2hosts" and d.culprits.hosts == ("h01", "h02")


@pytest.mark.parametrize(("own", "rule", "actions"), [
    (NIC_DOWN, "root_diag", [["isolate_gpu", "h03/gpu0"], ["restart_job", JOB]]),
    ("NVML not detected: could not load NVML library: libnvidia-ml.so.1", "config_check", []),
])
def test_the_end_with_a_fault_of_its_own_is_the_root(own: str, rule: str, actions: list) -> None:
    """h03 logs a fault of its own (a NIC link down, a broken NVML) and h00 loses its
    connection to it: not "isolate both". A host-side fault makes h03 the root; a
    configuration error is ConfigCheck's, with no isolation."""
    tree = DecisionTree(JOB, inventory=inventory(6))
    recs = [rec(119.0, "h03", own, "kernel"), rec(121.0, "h00", reset(ip(3)))]
    (d,) = run(tree, recs, until=200.0)
    assert d.evidence["rule"] == rule and d.evidence["actions"] == actions
    assert "DistError:2hosts:" + ("host" if actions else "config") + "_evidence" in d.evidence["path"]


def test_a_loopback_peer_is_the_reporters_own_host() -> None:
    """Gloo and the c10d store connect inside the host: a closed connection to 127.0.1.1 is
    no link to check (it gave run_netdiag 127.0.1.1<->h03)."""
    tree = DecisionTree(JOB, inventory=inventory(6))
    line = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:575] Connection "
            "closed by peer [127.0.1.1]:39827")  # YOLOX#702
    (d,) = run(tree, [rec(60.0, "h03", line)], until=300.0)
    assert not any("127.0" in a[1] for a in d.evidence["actions"])


def test_a_peer_that_has_not_reported_yet_is_not_the_silent_host() -> None:
    """Every host logs a watchdog within a second but h05, 8 s later. Judged at 5 s, h05 was
    "the one host that reported nothing" and was isolated; the silent-host verdict waits
    pair_settle_s."""
    tree = DecisionTree(JOB, inventory=inventory(6))
    recs = [rec(120.0 + 0.2 * h, f"h0{h}", watchdog(8 * h)) for h in (3, 0, 1, 2, 4)]
    recs.append(rec(128.0, "h05", watchdog(40)))
    out = run(tree, recs, until=400.0)
    assert not any(a[0].startswith("isolate") for d in out for a in d.evidence["actions"])


def test_one_hosts_version_mismatch_is_not_systemic_without_an_inventory() -> None:
    """Without a roster the job's hosts are those seen logging, not only those in the burst:
    one host's NCCL version mismatch in a 6-host job asked for a rollback."""
    from tests.unit.test_decision_tree import NVML_MISMATCH

    tree = DecisionTree(JOB)
    recs = [rec(100.0 + h, f"h0{h}", "heartbeat", "agent") for h in range(6)]
    (d,) = run(tree, [*recs, rec(120.0, "h03", NVML_MISMATCH)], until=200.0)
    assert d.kind == "config" and d.evidence["actions"] == [] and not d.evidence["systemic"]


@pytest.mark.parametrize("step", [-60.0, 60.0])
def test_a_reporter_a_minute_off_does_not_make_the_last_reporter_silent(step: float) -> None:
    """h03's clock is a minute off: its watchdog line arrives with its peers' but stamped
    ``step`` s away. The silent-host verdict waits pair_settle_s after the last reporter
    joined, not after the first line; judged 15 s after h03's early line, while h05's line
    was still on its way, h05 was isolated."""
    tree = DecisionTree(JOB, inventory=inventory(6))
    arrivals = [(240.0, "h00"), (240.1, "h01"), (240.3, "h02"), (240.4, "h04"),
                (240.2 + step, "h03"), (240.6, "h05")]
    out = []
    for ts, host in arrivals:
        out += tree.observe(rec(ts, host, watchdog(8 * int(host[-1])))).diagnoses
    out += tree.advance(240.6 + step + 400.0).diagnoses
    assert not any(a[0].startswith("isolate") for d in out for a in d.evidence["actions"])


def test_the_silent_host_is_still_named_after_the_last_reporter_settles() -> None:
    """Reporters joining over 12 s: h05, silent throughout, is named pair_settle_s after the
    last of them, and not before."""
    tree = DecisionTree(JOB, inventory=inventory(6))
    out = []
    for h in range(5):
        out += tree.observe(rec(120.0 + 3.0 * h, f"h0{h}", watchdog(8 * h))).diagnoses
    assert out == [] and tree.advance(146.9).diagnoses == []
    (d,) = tree.advance(147.0).diagnoses
    assert d.evidence["path"][-1] == "RootDiag:silent_host" and d.culprits.hosts == ("h05",)
    assert d.detected_ts == 147.0


@pytest.mark.parametrize("line", ["srun: error: Node failure on h01",
                                  "The node with node id: 4f2a and address: 10.0.0.2 and node name: "
                                  "10.0.0.2 has been marked dead because the detector has missed "
                                  "too many heartbeats from it."])
def test_a_two_host_job_whose_scheduler_lost_the_other_node_isolates_only_that_node(line: str) -> None:
    """Errors between 2 hosts isolate both (Aegis Alg. 1), but srun (or Ray's head) on h00
    says h01 is down: h00 only lost it."""
    tree = DecisionTree(JOB, inventory=inventory(2))
    recs = [rec(100.0, "h00", reset(ip(1))), rec(100.5, "h00", line.replace("10.0.0.2", ip(1)))]
    (d,) = run(tree, recs, until=300.0)
    assert d.culprits.hosts == ("h01",)
    assert [a for a in d.evidence["actions"] if a[0].startswith("isolate")] == [["isolate_host", "h01"]]
    assert d.evidence["path"][-2:] == ["DistError:2hosts:host_evidence", "RootDiag:host_evidence"]
