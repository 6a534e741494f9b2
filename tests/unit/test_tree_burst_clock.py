"""A Phase 1 burst whose trigger arrives behind the job's watermark (one host's clock a minute
ahead, one partition of the logs topic ahead under a bulk load) is judged by the trigger's own
stream, not at once (processors.core.tree_clock). Records are fed in arrival order here, not
sorted by time."""

from __future__ import annotations

from processors.core.decision_tree import DecisionTree
from processors.core.tree_clock import BurstClock
from schemas.records import LogRecord
from tests.unit.test_decision_tree import (
    JOB,
    TRAINING,
    closed,
    inventory,
    ip,
    rec,
    reset,
    watchdog,
    xid48,
)
from tests.unit.test_decision_tree_contained import APP_ECC


def feed(tree: DecisionTree, records: list[LogRecord]) -> list:
    out = []
    for r in records:
        out.extend(tree.observe(r).diagnoses)
    return out


def ahead_then_xid48() -> list[LogRecord]:
    """h00 runs 60 s ahead; h01's GPU at 0000:3b:00 takes an Xid 48 and its process dies."""
    return [rec(70.0, "h00", TRAINING), rec(10.0, "h01", xid48("0000:3b:00"), "kernel"),
            rec(10.8, "h01", APP_ECC), rec(12.0, "h02", TRAINING)]


def test_a_trigger_behind_the_watermark_waits_for_its_hosts_next_lines() -> None:
    """Before: judged on the Xid line alone when the ECC line arrived, so only the GPU went."""
    tree = DecisionTree(JOB, inventory=inventory(4))
    recs = ahead_then_xid48() + [rec(16.0, "h02", TRAINING)]
    (d,) = feed(tree, recs)
    assert d.kind == "critical_error"
    assert [ln["rule"] for ln in d.evidence["lines"]] == ["xid_48", "cuda_ecc_uncorrectable"]
    assert ["isolate_host", "h01"] in d.evidence["actions"]
    assert d.detected_ts == 15.0  # settle_s after the trigger, in the trigger's own time


def test_the_same_lines_in_order_give_the_same_diagnosis() -> None:
    late = feed(DecisionTree(JOB, inventory=inventory(4)), ahead_then_xid48() + [rec(16.0, "h02", TRAINING)])
    in_order = sorted(ahead_then_xid48(), key=lambda r: r.ts)
    tree = DecisionTree(JOB, inventory=inventory(4))
    in_time = feed(tree, in_order[:-1]) + feed(tree, [rec(16.0, "h02", TRAINING), in_order[-1]])
    assert [(d.kind, d.evidence["actions"], d.detected_ts) for d in late] == \
        [(d.kind, d.evidence["actions"], d.detected_ts) for d in in_time]


def test_the_stream_ahead_moving_on_by_the_lead_judges_it_too() -> None:
    """The trigger's stream falls silent: the ahead host's lines, settle_s past the lead."""
    tree = DecisionTree(JOB, inventory=inventory(4))
    assert feed(tree, ahead_then_xid48()[:3] + [rec(74.0, "h00", TRAINING)]) == []
    (d,) = feed(tree, [rec(75.0, "h00", TRAINING)])
    assert ["isolate_host", "h01"] in d.evidence["actions"]


def test_end_of_input_judges_a_late_burst() -> None:
    tree = DecisionTree(JOB, inventory=inventory(4))
    assert feed(tree, ahead_then_xid48()[:3]) == []
    (d,) = tree.flush().diagnoses
    assert ["isolate_host", "h01"] in d.evidence["actions"]


def test_a_checkpoint_mid_burst_keeps_the_late_clock() -> None:
    recs = ahead_then_xid48()
    tree = DecisionTree(JOB, inventory=inventory(4))
    assert feed(tree, recs[:2]) == []
    state = tree.snapshot()
    assert state["burst_clock"] == [60.0, 10.0]
    again = DecisionTree.restore(state, JOB, inventory=inventory(4))
    (d,) = feed(again, recs[2:] + [rec(16.0, "h02", TRAINING)])
    assert ["isolate_host", "h01"] in d.evidence["actions"]


def test_a_state_without_the_key_reads_as_in_time() -> None:
    tree = DecisionTree(JOB, inventory=inventory(4))
    state = tree.snapshot()
    del state["burst_clock"]
    assert DecisionTree.restore(state, JOB, inventory=inventory(4)).clock.lead is None


def test_a_trigger_in_time_is_judged_by_the_watermark() -> None:
    c = BurstClock()
    c.join(100.0, 102.0, 5.0)  # 2 s of interleaving: not late
    assert c.lead is None and c.now(104.0) == 104.0
    c.join(100.0, 160.0, 5.0)
    c.note(170.0, 160.0)  # the stream ahead: not the trigger's
    c.note(103.0, 160.0)
    assert c.now(170.0) == 110.0 and c.snapshot() == [60.0, 103.0]
    c.note(111.0, 170.0)
    assert c.now(170.0) == 111.0
    c.close()
    assert c.now(170.0) == 170.0 and BurstClock.restore(c.snapshot()).lead is None


def test_peers_timeouts_behind_a_skewed_host_join_the_burst() -> None:
    """A watchdog burst whose first line comes behind a host 60 s ahead still gathers the
    other reporters before RootDiag judges it."""
    tree = DecisionTree(JOB, inventory=inventory(4))
    recs = [rec(160.0, "h00", TRAINING)] + [rec(100.0 + h, f"h{h:02d}", watchdog(h * 8)) for h in (1, 2)]
    assert feed(tree, recs) == []
    assert tree.clock.lead == 59.0


def test_a_burst_opened_by_a_host_ahead_waits_for_the_others_behind_it() -> None:
    """h00 runs 60 s ahead: its connection error to h01 opens the burst in time, then the
    others' errors arrive 60 s behind it. Before, the burst was judged on the first of them."""
    tree = DecisionTree(JOB, inventory=inventory(4))
    recs = [rec(160.0, "h00", reset(ip(1))), rec(100.5, "h02", reset(ip(1))),
            rec(100.6, "h03", reset(ip(1))), rec(101.0, "h01", closed(ip(2))),
            rec(106.0, "h02", TRAINING), rec(116.0, "h02", TRAINING)]
    (d,) = feed(tree, recs)
    assert {ln["host"] for ln in d.evidence["lines"]} == {"h00", "h01", "h02", "h03"}
