"""A hung job's teardown: PyTorch's watchdogs fire (10 minutes by default), every rank takes
its process down, and the survivors' connections to aborting ranks (and to the c10d store on
rank 0's host) fail. Those failures name rank 0's host or a ring neighbour, not the culprit.
The log formats and helpers are test_decision_tree's."""

from __future__ import annotations

import pytest

from processors.core.decision_tree import DecisionTree, DecisionTreeConfig
from processors.core.log_classifier import classify
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

STORE_RESET = ("[W1203 10:21:09.512000 3100] TCPStore.cpp:125] [c10d] recvValue failed on "
               "SocketImpl(fd=77, addr=[h01]:41812, remote=[{ip}]:29500): Connection reset by peer")


def storm(at: float, hosts: list[int], master: int = 0) -> list:
    """Every host in ``hosts`` times out (600 s waited) at ``at``; 2 s later the survivors'
    connections to the master's host reset (store and NCCL)."""
    recs = [rec(at + 0.1 * h, f"h{h:02d}", watchdog(h * 8)) for h in hosts]
    recs += [rec(at + 2.0 + 0.1 * h, f"h{h:02d}", STORE_RESET.format(ip=ip(master)))
             for h in hosts if h != master]
    recs += [rec(at + 2.5 + 0.1 * h, f"h{h:02d}", ib_completion(ip(master))) for h in hosts
             if h != master]
    return recs


@pytest.mark.parametrize(("line", "waited"), [
    (watchdog(3), 600.06),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
     "waiting 1800000ms for recv operation to complete", 1800.0),
    ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=BROADCAST, "
     "Timeout(ms)=1800000) ran for 99999999999 milliseconds before timing out.", 86400.0),
])
def test_a_timeout_line_says_how_long_its_operation_waited(line: str, waited: float) -> None:
    assert classify(line).waited_s == pytest.approx(waited)


@pytest.mark.parametrize("line", [reset("10.0.0.1"), closed("10.0.0.1"), xid79(),
                                  "Timeout(ms)=600000 set for the default process group"])
def test_other_lines_carry_no_waiting_time(line: str) -> None:
    assert classify(line).waited_s is None


def test_the_teardown_after_an_xid_is_that_incident() -> None:
    """XID 79 on h03 at 100 s; 10 minutes later the others' watchdogs fire and their
    connections to h00 (rank 0: the store) reset. Before, RootDiag isolated h00."""
    tree = DecisionTree(JOB, inventory=inventory(6))
    recs = [rec(100.0, "h03", xid79(), "kernel")] + storm(700.0, [0, 1, 2, 4, 5])
    (d,) = run(tree, recs, until=1000.0)
    assert d.kind == "critical_error" and d.culprits.hosts == ("h03",)


def test_the_teardown_of_a_silent_hang_names_the_silent_host() -> None:
    """No log line at the fault (Phase 2 found it): the watchdogs of every host but h03 fire,
    then the teardown's resets name h00. The resets are not edges; the silent host is the
    root, and the evidence began when the timed-out collective did (600.06 s earlier), so the
    guard sees the incident Phase 2 already answered."""
    tree = DecisionTree(JOB, inventory=inventory(6))
    (d,) = run(tree, storm(700.0, [0, 1, 2, 4, 5]), until=1000.0)
    assert d.evidence["path"][-1] == "RootDiag:silent_host" and d.culprits.hosts == ("h03",)
    assert d.event_ts == pytest.approx(700.0 - 600.06)


def test_errors_in_any_order_within_the_teardown_are_the_teardown() -> None:
    """A reset that reaches the pipeline before the watchdog lines it follows."""
    tree = DecisionTree(JOB, inventory=inventory(6))
    recs = [rec(100.0, "h03", xid79(), "kernel"), rec(699.5, "h02", reset(ip(0)))]
    recs += storm(700.0, [0, 1, 2, 4, 5])
    (d,) = run(tree, recs, until=1000.0)
    assert d.kind == "critical_error"


def test_connection_errors_before_the_watchdogs_are_not_the_teardown() -> None:
    """A link's own failure comes first and the watchdogs after it: its errors stay edges, so
    the verdict is the one without the teardown rule."""
    recs = [rec(690.0, "h01", ib_completion(ip(2))), rec(690.4, "h02", ib_completion(ip(1))),
            rec(691.0, "h01", ib_completion(ip(2)))]
    recs += [rec(700.0 + 0.1 * h, f"h{h:02d}", watchdog(h * 8)) for h in range(6)]
    recs += [rec(702.0, "h04", reset(ip(5)))]
    (d,) = run(DecisionTree(JOB, inventory=inventory(6)), recs, until=1000.0)
    (off,) = run(DecisionTree(JOB, DecisionTreeConfig(teardown_s=0.0), inventory=inventory(6)),
                 [r for r in recs if r.ts < 702.0], until=1000.0)
    assert d.culprits == off.culprits and d.evidence["path"] == off.evidence["path"]
    assert d.culprits.links == ("h01<->h02",)  # the link; the later reset is the teardown's


def test_the_first_host_to_time_out_is_not_the_centre_of_its_teardown() -> None:
    """h03 times out first and aborts; its peers' connections to it reset. The first rank to
    time out had entered the collective and waited on the culprit: before the rule, RootDiag
    isolated h03's GPU. Every host reports, so nothing points anywhere: OfflineDiag."""
    tree = DecisionTree(JOB, inventory=inventory(6))
    recs = [rec(120.0, "h03", watchdog(24)), rec(123.0, "h00", reset(ip(3)))]
    recs += [rec(129.0 + h, f"h0{h}", closed(ip(3))) for h in (1, 2, 4, 5)]
    (d,) = run(tree, recs, until=400.0)
    assert d.evidence["path"][-1] == "OfflineDiag"
    assert not any(a[0].startswith("isolate") for a in d.evidence["actions"])


def test_teardown_off_keeps_the_old_verdict() -> None:
    tree = DecisionTree(JOB, DecisionTreeConfig(teardown_s=0.0), inventory=inventory(6))
    (d,) = run(tree, storm(700.0, [0, 1, 2, 4, 5]), until=1000.0)
    assert d.evidence["path"][-1] == "RootDiag:hit" and d.culprits.gpus == ("h00/gpu0",)


def test_the_watchdog_times_survive_a_snapshot() -> None:
    tree = DecisionTree(JOB, inventory=inventory(6))
    recs = [rec(100.0, "h03", xid79(), "kernel")] + storm(700.0, [0, 1, 2, 4, 5])
    head = [r for r in recs if r.ts < 701.0]
    run(tree, head)
    again = DecisionTree.restore(tree.snapshot(), JOB, inventory=inventory(6))
    assert again.watchdogs == tree.watchdogs and len(again.watchdogs) == 5
    (d,) = run(DecisionTree(JOB, inventory=inventory(6)), head, until=200.0)
    assert run(again, [r for r in recs if r.ts >= 701.0], until=1000.0) == []
    assert d.kind == "critical_error"


# ---- the c10d store and rendezvous on rank 0's host (MASTER_ADDR:MASTER_PORT) ------------------
REFUSED = ("[W socket.cpp:697] [c10d] The client socket has failed to connect to [h00]:29500 "
           "(errno: 111 - Connection refused).")  # hpcaitech/Open-Sora#667
CONNECT_TIMEOUT = ("[E socket.cpp:860] [c10d] The client socket has timed out after 60s while "
                   "trying to connect to ({ip}, 29500).")  # pytorch/pytorch#107021
SHOULD_DUMP = ("[rank{r}]:[W318 10:00:41.929037914 ProcessGroupNCCL.cpp:1771] [PG ID 0 PG GUID 0 "
               "Rank {r}] Failed to check the \"should dump\" flag on TCPStore, (maybe TCPStore "
               "server has shut down too early), with error: Connection reset by peer")


def test_store_failures_are_not_links_to_rank_0s_host() -> None:
    """A link fault between h01 and h02, then torchrun stops every worker and the survivors'
    store connections to h00 reset. Before, RootDiag isolated h00 and missed the link."""
    tree = DecisionTree(JOB, inventory=inventory(6))
    recs = [rec(100.0, "h01", ib_completion(ip(2))), rec(100.4, "h02", ib_completion(ip(1)))]
    for h in (1, 2, 3, 4, 5):
        recs += [rec(105.5 + 0.1 * h, f"h{h:02d}", SHOULD_DUMP.format(r=h * 8)),
                 rec(105.6 + 0.1 * h, f"h{h:02d}", STORE_RESET.format(ip=ip(0)))]
    (d,) = run(tree, recs, until=300.0)
    assert d.evidence["rule"] == "dist_error_2hosts" and d.culprits.hosts == ("h01", "h02")


@pytest.mark.parametrize("hosts", [2, 6])
def test_a_slow_rendezvous_master_isolates_nobody(hosts: int) -> None:
    """The master comes up late: the others retry, then their connect times out. Nothing
    between two hosts failed and nothing locates a fault: the job never started, so
    OfflineDiag. Before, the retries were links to h00 (2 hosts: both isolated; 6: h00)."""
    tree = DecisionTree(JOB, inventory=inventory(hosts))
    recs = []
    for h in range(1, hosts):
        recs += [rec(40.0 + 10 * k + 0.1 * h, f"h{h:02d}", REFUSED) for k in range(6)]
        recs.append(rec(100.0 + 0.1 * h, f"h{h:02d}", CONNECT_TIMEOUT.format(ip=ip(0))))
    (d,) = run(tree, recs, until=1000.0)
    assert d.evidence["path"][-1] == "OfflineDiag" and d.evidence["actions"] == [
        ["run_offline_diag", JOB]]
