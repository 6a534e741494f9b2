"""The job clock's guard against one host with a skewed clock (processors.core.job_clock)."""

from __future__ import annotations

import pytest

from processors.core.job_clock import InputConfig, JobClock
from processors.pipeline import InputProcessor
from schemas.codec import encode
from schemas.errors import ConfigError
from schemas.records import CCLRecord, LogRecord, OpCounters, RankSnapshot

T0 = 1_767_225_600.0
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python3, GPU has fallen off the bus."


def test_a_lone_host_far_ahead_is_refused_until_another_agrees() -> None:
    c = JobClock(300.0)
    assert c.check("a", T0, None) == ""
    assert c.check("b", T0 + 1, T0) == ""
    assert "ahead of the job clock" in c.check("a", T0 + 3.2e7, T0 + 1)
    assert c.check("b", T0 + 2, T0 + 1) == ""  # the honest host goes on
    assert c.check("b", T0 + 1000, T0 + 2) == ""  # a second host agrees: the clock moves
    assert c.ahead == {}


def test_a_host_back_in_step_is_forgotten_and_one_host_jobs_follow_their_host() -> None:
    c = JobClock(300.0)
    c.check("a", T0, None)
    c.check("b", T0, T0)
    assert c.check("a", T0 + 900, T0)
    assert c.check("a", T0 + 3, T0) == "" and c.ahead == {}
    solo = JobClock(300.0)
    solo.check("a", T0, None)
    assert solo.check("a", T0 + 900, T0) == ""


def test_a_job_back_on_fewer_hosts_moves_on_after_lone_after_s() -> None:
    """A 2-host job restarted on one host after a long gap: nobody else will agree. A burst
    of lines from one skewed host spans no time, so it never qualifies."""
    c = JobClock(300.0, lone_after_s=60.0)
    c.check("a", T0, None)
    c.check("b", T0, T0)
    assert all(c.check("a", T0 + 900 + i * 0.001, T0) for i in range(100))  # a burst
    assert c.check("a", T0 + 959, T0)
    assert c.check("a", T0 + 960, T0) == ""


def test_a_skewed_host_among_present_ones_never_moves_the_clock() -> None:
    c = JobClock(300.0, lone_after_s=3.0)
    c.check("a", T0, None)
    c.check("b", T0, T0)
    for i in range(10):
        assert c.check("a", T0 + 3.2e7 + 2 * i, T0 + i)
        assert c.check("b", T0 + i + 1, T0 + i) == ""  # b is present: a's streak restarts


def test_state_round_trips() -> None:
    c = JobClock(300.0)
    c.check("a", T0, None)
    c.check("b", T0, T0)
    c.check("a", T0 + 900, T0)
    r = JobClock.restore(c.snapshot(), 300.0)
    assert (r.hosts, r.ahead, r.streak) == (c.hosts, c.ahead, c.streak)


def test_config_is_checked() -> None:
    with pytest.raises(ConfigError):
        InputConfig(max_future_s=0)


def test_a_skewed_record_does_not_blind_the_decision_tree() -> None:
    """One log line a year ahead used to move the job clock, so the XID after it was late."""
    proc = InputProcessor("logs")
    rejected = []
    for i in range(30):
        for h in ("h1", "h2", "h3"):
            proc.handle(encode(LogRecord(h, T0 + i, "agent", "heartbeat", job="j")))
    res = proc.handle(encode(LogRecord("h2", T0 + 3.2e7, "agent", "heartbeat", job="j")))
    rejected += [r.reason for r in res.rejections]
    diags = []
    for i in range(30, 60):
        for h in ("h1", "h2", "h3"):
            line = XID79 if (h == "h1" and i == 31) else "heartbeat"
            res = proc.handle(encode(LogRecord(h, T0 + i, "kernel", line, job="j")))
            diags += res.diagnoses
            rejected += [r.reason for r in res.rejections]
    diags += proc.flush("j")
    assert rejected == ["clock_skew"]
    assert [d.kind for d in diags] == ["critical_error"]
    assert InputProcessor("logs").restore("j", proc.snapshot("j"))  # the clock is in the state


def test_a_skewed_first_host_is_found_when_another_host_is_far_behind_it() -> None:
    c = JobClock(300.0, lone_after_s=60.0)
    assert c.check("a", T0 + 3.2e7, None) == ""  # nobody can disagree yet
    assert c.restarts("a", T0 + 3.2e7 + 1, T0 + 3.2e7) is None  # the same host
    assert c.restarts("b", T0, T0 + 3.2e7) == "a"
    assert c.check("b", T0, None) == ""  # the clock starts over at b
    assert "ahead of the job clock" in c.check("a", T0 + 3.2e7 + 2, T0)
    assert c.check("c", T0 + 1, T0) == "" and c.confirmed
    assert c.restarts("d", T0 - 3.2e7, T0 + 1) is None  # settled: a host behind is late


def test_a_first_host_alone_for_lone_after_s_keeps_its_clock() -> None:
    c = JobClock(300.0, lone_after_s=60.0)
    for i in range(61):
        c.check("a", T0 + i, T0 + i - 1 if i else None)
    assert c.restarts("b", T0 - 3600, T0 + 60) is None
    r = JobClock.restore({"hosts": ["a", "b"], "ahead": {}, "streak": {}}, 300.0)
    assert r.confirmed and r.restarts("c", T0 - 3600, T0) is None  # older state is settled
    fresh = JobClock(300.0)
    fresh.check("a", T0, None)
    back = JobClock.restore(fresh.snapshot(), 300.0)
    assert (back.leader, back.lead_from, back.confirmed) == ("a", T0, False)


def test_a_skewed_first_record_does_not_blind_the_decision_tree() -> None:
    """The job's very first record came from a host a year ahead: every honest record after
    it used to be late, and the XID was missed."""
    proc = InputProcessor("logs")
    res = proc.handle(encode(LogRecord("h2", T0 + 3.2e7, "agent", "heartbeat", job="j")))
    assert res.rejections == []
    rejected, diags = [], []
    for i in range(60):
        for h in ("h1", "h2", "h3"):
            ts = T0 + 3.2e7 + i if h == "h2" else T0 + i
            line = XID79 if (h == "h1" and i == 31) else "heartbeat"
            res = proc.handle(encode(LogRecord(h, ts, "kernel", line, job="j")))
            diags += res.diagnoses
            rejected += [(r.reason, r.host) for r in res.rejections]
    diags += proc.flush("j")
    assert set(rejected) == {("clock_skew", "h2")} and len(rejected) == 61
    assert [d.kind for d in diags] == ["critical_error"]


def test_a_skewed_hosts_ccl_records_are_taken_at_the_job_clock_its_lines_are_not() -> None:
    """A host an hour ahead still reports its counters (refused, it looked silent during
    another host's hang): a CCL record is taken at the job clock, with a notice. A log line
    is refused: under bulk load a partition runs ahead, and re-timed lines delayed XIDs."""
    ccl = InputProcessor("ccl")

    def rec(h: str, ts: float, cl: int) -> CCLRecord:
        op = OpCounters("AllReduce", cl, cl, cl, cl, 100.0, 5.0)
        return CCLRecord(h, ts, (RankSnapshot("c0", 3, int(h[1]) - 1, 0, (op,)),), job="j")

    for i in range(30):
        for h in ("h1", "h2", "h3"):
            ccl.handle(encode(rec(h, T0 + i, i + 1)))
    res = ccl.handle(encode(rec("h2", T0 + 3629, 31)))
    assert [r.reason for r in res.rejections] == ["clock_skew"]
    assert "taken at the job clock" in res.rejections[0].detail
    logs = InputProcessor("logs")
    for h in ("h1", "h3"):
        logs.handle(encode(LogRecord(h, T0, "agent", "heartbeat", job="j")))
    res = logs.handle(encode(LogRecord("h2", T0 + 3629, "kernel", XID79, job="j")))
    assert [r.reason for r in res.rejections] == ["clock_skew"]
    assert "taken at the job clock" not in res.rejections[0].detail
