"""Log following: rotation, truncation, partial and over-long lines, prefilter, sources."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from producers.agent.collector import Notices
from producers.agent.logtail import (
    TRUNCATED,
    FileFollower,
    LineSplitter,
    LogTailer,
    open_kernel_log,
    parse_kmsg_record,
)


def append(path: Path, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)


@pytest.fixture
def log(tmp_path: Path) -> Path:
    p = tmp_path / "train.log"
    p.write_text("old line before the agent started\n")
    return p


def test_starts_at_end_and_waits_for_newline(log: Path) -> None:
    f = FileFollower(log)
    assert f.poll() == []
    append(log, "step 1 loss 2.3\nstep 2 lo")
    assert f.poll() == ["step 1 loss 2.3"]
    assert f.poll() == []  # the partial line waits
    append(log, "ss 2.2\r\n")
    assert f.poll() == ["step 2 loss 2.2"]


def test_from_start(log: Path) -> None:
    assert FileFollower(log, from_start=True).poll() == ["old line before the agent started"]


def test_rotation_finishes_old_file_then_reads_new_from_start(log: Path) -> None:
    f = FileFollower(log)
    f.poll()
    append(log, "last full line\npartial at rotation")
    os.rename(log, log.with_suffix(".log.1"))
    log.write_text("first line of new file\n")
    assert f.poll() == ["last full line", "partial at rotation", "first line of new file"]
    append(log, "second\n")
    assert f.poll() == ["second"]


def test_rotation_with_writer_still_on_old_file(log: Path) -> None:
    f = FileFollower(log)
    f.poll()
    rotated = log.with_suffix(".log.1")
    os.rename(log, rotated)
    append(rotated, "written after the rename\n")  # no new file yet: keep following the old one
    assert f.poll() == ["written after the rename"]
    log.write_text("new\n")
    assert f.poll() == ["new"]


def test_truncation_restarts_at_zero(log: Path) -> None:
    f = FileFollower(log)
    f.poll()
    append(log, "a\nb\n")
    assert f.poll() == ["a", "b"]
    with open(log, "w") as fh:  # copytruncate
        fh.write("c\n")
    assert f.poll() == ["c"]


def test_missing_file_is_waited_for_and_read_from_start(tmp_path: Path) -> None:
    seen: list[str] = []
    p = tmp_path / "later.log"
    f = FileFollower(p, Notices(seen.append))
    assert f.poll() == [] and f.poll() == []
    assert len(seen) == 1 and "not found" in seen[0]
    p.write_text("hello\n")
    assert f.poll() == ["hello"]


def test_long_lines_are_cut_once() -> None:
    s = LineSplitter(max_line=10)
    out = s.feed(b"0123456789abcdef")  # over the bound with no newline yet
    assert out == ["0123456789" + TRUNCATED]
    assert s.feed(b"ghij\nshort\n") == ["short"]  # the rest of the long line is skipped
    assert LineSplitter(max_line=4).feed(b"abcdefg\n") == ["abcd" + TRUNCATED]


def test_bad_utf8_is_replaced() -> None:
    assert LineSplitter().feed(b"Xid \xff\xfe 79\n") == ["Xid \ufffd\ufffd 79"]


def test_tailer_prefilter_and_sources(tmp_path: Path) -> None:
    kern = tmp_path / "kern.log"
    train = tmp_path / "train.log"
    kern.write_text("")
    train.write_text("")
    t = LogTailer(FileFollower(kern), [str(train)])
    t.collect(1.0)
    append(kern, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
                 "usb 1-1: new high-speed USB device\n"
                 "mlx5_core 0000:5e:00.0: Port module event: module 0, Cable unplugged\n")
    append(train, "epoch 1 step 10 loss 1.2\n"
                  "h01:123:456 [3] NCCL WARN Call to ibv_poll_cq failed\n"
                  "RuntimeError: NCCL communicator was aborted\n")
    logs = t.collect(2.0).logs
    assert [(x.source, x.line[:20]) for x in logs] == [
        ("kernel", "NVRM: Xid (PCI:0000:"), ("kernel", "mlx5_core 0000:5e:00"),
        ("nccl", "h01:123:456 [3] NCCL"), ("nccl", "RuntimeError: NCCL c")]
    assert all(x.ts == 2.0 for x in logs)


def test_tailer_without_filter_and_storm_bound(tmp_path: Path) -> None:
    train = tmp_path / "train.log"
    train.write_text("")
    t = LogTailer(None, [str(train)], prefilter=None, max_lines=3)
    t.collect(0.0)
    append(train, "".join(f"line {i}\n" for i in range(10)))
    assert [x.line for x in t.collect(1.0).logs] == ["line 0", "line 1", "line 2"]
    assert t.suppressed == 7


def test_parse_kmsg_record() -> None:
    rec = "3,812,5531201,-;NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>'\n SUBSYSTEM=pci\n"
    assert parse_kmsg_record(rec, 1000.0) == (1005.531201, "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>'")
    assert parse_kmsg_record("garbage", 0.0) is None


def test_kernel_log_path_that_is_a_file(tmp_path: Path) -> None:
    p = tmp_path / "kern.log"
    p.write_text("")
    src = open_kernel_log(str(p), Notices())
    assert isinstance(src, FileFollower)


def test_no_fault_line_of_the_dataset_is_dropped_at_the_host() -> None:
    """Every real line the classifier places in a category reaches the worker."""
    import orjson

    from processors.core.log_classifier import classify

    path = Path(__file__).parents[1] / "data" / "log_lines.jsonl"
    rows = [orjson.loads(x) for x in path.read_bytes().splitlines() if x.strip()]
    t = LogTailer(None)
    faults = [r["line"] for r in rows if classify(r["line"]).category != "other"]
    assert len(faults) > 300
    assert [ln for ln in faults if not t._keep(ln)] == []
    assert not t._keep("epoch 1 step 10 loss 1.2") and not t._keep("   ")
