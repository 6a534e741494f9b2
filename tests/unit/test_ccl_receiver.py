"""CCLReceiver over a real Unix datagram socket: encode_snapshot -> sendto -> poll -> collect."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from producers.agent.ccl_receiver import CCLReceiver
from schemas import codec
from schemas.ccl_snapshot import OpStats, RankEntry, Snapshot, encode_snapshot
from schemas.errors import ConfigError, DecodeError, ValidationError
from schemas.records import CCLRecord

WALL = 1_700_000_000_000_000_000  # ns
MONO = 50_000_000_000


def _entry(rank: int, *, comm: int = 0xC0FFEE, cl: int = 10, wr: int = 80, wc: int = 80,
           pending: tuple[int, ...] = (), final: bool = False, gpu: int = 0,
           last: int = MONO - 250_000_000) -> RankEntry:
    return RankEntry(comm_hash=comm, nranks=8, rank=rank, local_gpu=gpu, ops=(
        OpStats("AllReduce", cl=cl, wr=wr, wc=wc, seq=cl, td_ns=1_500_000, n_ns=25_500,
                n_samples=5),
        OpStats("Send", cl=2, wr=4, wc=4, seq=2, td_ns=3_000, n_ns=1_000, n_samples=4),
    ), pending_peers=pending, pending_total=len(pending), last_event_ns=last, final=final)


def _snap(*entries: RankEntry, pid: int = 100, seq: int = 1, wall: int = WALL,
          drops_full: int = 0) -> bytes:
    return encode_snapshot(Snapshot(pid=pid, seq=seq, wall_ns=wall, mono_ns=MONO,
                                    entries=entries, drops_full=drops_full))


@pytest.fixture
def sock_path(tmp_path: Path) -> Path:
    return tmp_path / "run" / "aegis" / "ccl.sock"


@pytest.fixture
def receiver(sock_path: Path) -> Iterator[CCLReceiver]:
    with CCLReceiver(sock_path, "h017", lambda: "job-7") as rx:
        yield rx


@pytest.fixture
def sender() -> Iterator[socket.socket]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    yield s
    s.close()


def _send(sender: socket.socket, path: Path, *datagrams: bytes) -> None:
    for d in datagrams:
        sender.sendto(d, str(path))


def test_snapshot_becomes_one_record(receiver: CCLReceiver, sender: socket.socket,
                                     sock_path: Path) -> None:
    _send(sender, sock_path, _snap(_entry(3, gpu=3, pending=(5, 1))))
    assert receiver.poll() == []
    rec = receiver.collect(now=1_700_000_001.0)
    assert isinstance(rec, CCLRecord)
    assert (rec.host, rec.job, rec.ts, rec.key) == ("h017", "job-7", 1_700_000_001.0, "job-7")
    (rank,) = rec.ranks
    assert (rank.comm, rank.comm_size, rank.rank, rank.gpu) == ("0000000000c0ffee", 8, 3, 3)
    assert rank.pending_peers == (1, 5)
    assert rank.last_event_ts == pytest.approx(1_699_999_999.75)
    ar, send = rank.ops
    assert (ar.op, ar.cl, ar.wr, ar.wc, ar.seq) == ("AllReduce", 10, 80, 80, 10)
    assert (ar.td_us, ar.n_us) == (1500.0, 25.5)
    assert (send.op, send.td_us, send.n_us) == ("Send", 3.0, 1.0)
    assert codec.decode(CCLRecord, codec.encode(rec)) == rec


def test_ranks_of_several_processes_merge_sorted(receiver: CCLReceiver, sender: socket.socket,
                                                 sock_path: Path) -> None:
    _send(sender, sock_path,
          _snap(_entry(1, gpu=1), pid=11),
          _snap(_entry(0, gpu=0), _entry(4, comm=0x1, gpu=0), pid=10))
    receiver.poll()
    rec = receiver.collect(now=1.7e9)
    assert rec is not None
    assert [(r.comm, r.rank) for r in rec.ranks] == [
        ("0000000000000001", 4), ("0000000000c0ffee", 0), ("0000000000c0ffee", 1)]


def test_latest_snapshot_per_rank_wins(receiver: CCLReceiver, sender: socket.socket,
                                       sock_path: Path) -> None:
    _send(sender, sock_path, _snap(_entry(2, cl=10), seq=1), _snap(_entry(2, cl=11), seq=2))
    receiver.poll()
    rec = receiver.collect(now=1.7e9)
    assert rec is not None and len(rec.ranks) == 1 and rec.ranks[0].cl == 13


def test_state_persists_across_intervals_while_stalled(receiver: CCLReceiver,
                                                       sender: socket.socket,
                                                       sock_path: Path) -> None:
    _send(sender, sock_path, _snap(_entry(0, wr=90, wc=80, pending=(6,))))
    receiver.poll()
    first = receiver.collect(now=1.7e9)
    receiver.poll()
    second = receiver.collect(now=1.7e9 + 1)
    assert first is not None and second is not None
    assert second.ranks == first.ranks and second.ranks[0].pending_peers == (6,)


def test_bad_datagrams_are_returned_and_counted(receiver: CCLReceiver, sender: socket.socket,
                                                sock_path: Path) -> None:
    good = _snap(_entry(0))
    bad_rank = bytearray(good)
    bad_rank[52:56] = (9).to_bytes(4, "little")  # rank 9 of 8
    _send(sender, sock_path, b"garbage", good, bytes(bad_rank), good[:-1])
    bad = receiver.poll()
    assert [type(b.error) for b in bad] == [DecodeError, ValidationError, DecodeError]
    assert bad[0].data == b"garbage" and "shorter than" in bad[0].reason
    assert receiver.bad_count == 3 and receiver.received == 4
    assert receiver.bad_reasons == {"DecodeError": 2, "ValidationError": 1}
    assert len(receiver.recent_bad) == 3
    rec = receiver.collect(now=1.7e9)
    assert rec is not None and len(rec.ranks) == 1


def test_final_entry_reported_once_then_dropped(receiver: CCLReceiver, sender: socket.socket,
                                                sock_path: Path) -> None:
    _send(sender, sock_path, _snap(_entry(0), _entry(1)), _snap(_entry(1, final=True), seq=2))
    receiver.poll()
    rec = receiver.collect(now=1.7e9)
    assert rec is not None and [r.rank for r in rec.ranks] == [0, 1]
    rec = receiver.collect(now=1.7e9 + 1)
    assert rec is not None and [r.rank for r in rec.ranks] == [0]


def test_silent_rank_expires(sock_path: Path, sender: socket.socket) -> None:
    with CCLReceiver(sock_path, "h1", lambda: None, expire_after_s=30) as rx:
        _send(sender, sock_path, _snap(_entry(0)))
        rx.poll()
        rec = rx.collect(now=WALL / 1e9 + 29)
        assert rec is not None and rec.job is None and rec.key == "h1"
        assert rx.collect(now=WALL / 1e9 + 31) is None


def test_a_killed_process_disappears_within_seconds(receiver: CCLReceiver,
                                                   sender: socket.socket, sock_path: Path) -> None:
    """The plugin reports every interval even while stalled: an entry that stops being
    refreshed is a process that is gone (killed, crashed), not a rank frozen in a hang."""
    t0 = WALL / 1e9
    for i in range(5):
        _send(sender, sock_path, _snap(_entry(0), _entry(1), seq=i + 1, wall=WALL + i * 10**9))
    receiver.poll()
    assert receiver.collect(now=t0 + 13.9) is not None  # 10 s after the last report
    assert receiver.collect(now=t0 + 14.1) is None


def test_a_slow_sender_keeps_its_entries_for_three_of_its_intervals(
        receiver: CCLReceiver, sender: socket.socket, sock_path: Path) -> None:
    t0 = WALL / 1e9
    for i in range(3):  # AEGIS_CCL_INTERVAL_MS=60000
        _send(sender, sock_path, _snap(_entry(0), seq=i + 1, wall=WALL + i * 60 * 10**9))
    receiver.poll()
    assert receiver.collect(now=t0 + 120 + 179) is not None
    assert receiver.collect(now=t0 + 120 + 181) is None


def test_nothing_received_gives_none(receiver: CCLReceiver) -> None:
    assert receiver.poll() == []
    assert receiver.collect(now=1.0) is None


def test_sender_drop_counters_kept_per_process(receiver: CCLReceiver, sender: socket.socket,
                                               sock_path: Path) -> None:
    _send(sender, sock_path, _snap(_entry(0), pid=5, drops_full=3), _snap(_entry(1), pid=4))
    receiver.poll()
    assert [(d.pid, d.full, d.unsent) for d in receiver.sender_drops] == [(4, 0, 0), (5, 3, 0)]


def test_poll_reads_at_most_max_per_poll(sock_path: Path, sender: socket.socket) -> None:
    with CCLReceiver(sock_path, "h1", lambda: None, max_per_poll=2) as rx:
        _send(sender, sock_path, *[_snap(_entry(0), seq=i) for i in range(3)])
        rx.poll()
        assert rx.received == 2
        rx.poll()
        assert rx.received == 3


def test_stale_socket_replaced_and_dir_created(sock_path: Path, sender: socket.socket) -> None:
    first = CCLReceiver(sock_path, "h1", lambda: None)
    first._sock.close()  # a crashed agent leaves its socket file behind
    assert sock_path.exists()
    with CCLReceiver(sock_path, "h1", lambda: None, mode=0o600) as rx:
        assert (os.stat(sock_path).st_mode & 0o777) == 0o600
        _send(sender, sock_path, _snap(_entry(0)))
        rx.poll()
        assert rx.collect(now=1.7e9) is not None
    assert not sock_path.exists()


def test_regular_file_in_the_way_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "ccl.sock"
    path.write_text("not a socket")
    with pytest.raises(ConfigError, match="not a socket"):
        CCLReceiver(path, "h1", lambda: None)
    assert path.read_text() == "not a socket"
