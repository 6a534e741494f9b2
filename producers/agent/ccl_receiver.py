"""Host side of the CCL hooks: read the plugin's snapshot datagrams, emit one CCLRecord.

The NCCL profiler plugin (``ccl_hooks/``, docs/ccl-hooks.md) in every training process
sends, once per interval, the Aegis §4.2 counters CL/WR/WC and the §5.2 figures TD and N
of each of its communicator ranks to a Unix datagram socket. :class:`CCLReceiver` binds that
socket, drains it without blocking (:meth:`CCLReceiver.poll`), keeps the latest entry per
(communicator, rank), and merges the host's ranks into ONE
:class:`~schemas.records.CCLRecord` per interval (:meth:`CCLReceiver.collect`).

Bad datagrams are never dropped silently: ``poll`` returns them with the decode error, and
the receiver counts them by error type and keeps the most recent ones.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from schemas.ccl_snapshot import MAX_DATAGRAM, RankEntry, Snapshot, decode_snapshot
from schemas.errors import ConfigError, WireError
from schemas.records import CCLRecord, OpCounters, RankSnapshot

DEFAULT_SOCKET = "/run/aegis/ccl.sock"


@dataclass(frozen=True, slots=True)
class BadDatagram:
    """A datagram that is not a valid snapshot, with why (a schemas.errors.WireError)."""

    error: WireError
    data: bytes

    @property
    def reason(self) -> str:
        return str(self.error)


@dataclass(frozen=True, slots=True)
class SenderDrops:
    """Datagrams a sending process could not deliver so far (from its latest header)."""

    pid: int
    full: int  # dropped because this socket was full
    unsent: int  # not sent: no receiver, or another error


@dataclass(frozen=True, slots=True)
class _Latest:
    entry: RankEntry
    received_ts: float  # the datagram's own wall clock, epoch seconds
    last_event_ts: float
    pid: int = 0  # the sending process


class CCLReceiver:
    """Bind ``socket_path`` and turn the plugin's datagrams into CCLRecords for ``host``.

    ``job_getter`` names the job running on the host now (None if unknown); it keys the
    record. The plugin reports every interval even while stalled, so an entry that is not
    refreshed for ``stale_intervals`` of its sender's interval, and at least
    ``expire_after_s``, belongs to a process that is gone (killed, crashed): it is dropped,
    and the detectors see that rank stop reporting instead of a frozen rank that looks hung.
    An entry flagged FINAL (communicator destroyed) is reported once more, then dropped.
    """

    def __init__(self, socket_path: str | os.PathLike[str], host: str,
                 job_getter: Callable[[], str | None], *, mode: int = 0o666,
                 expire_after_s: float = 10.0, stale_intervals: float = 3.0,
                 max_per_poll: int = 100_000, rcvbuf_bytes: int = 1 << 20) -> None:
        self.path = Path(socket_path)
        self.host = host
        self._job_getter = job_getter
        self._expire_after_s = expire_after_s
        self._stale_intervals = stale_intervals
        self._sender_last: dict[int, float] = {}  # pid -> wall time of its latest interval
        self._sender_interval: dict[int, float] = {}  # pid -> its reporting interval
        self._max_per_poll = max_per_poll
        self._latest: dict[tuple[int, int], _Latest] = {}
        self._drops: dict[int, SenderDrops] = {}
        self.received = 0
        self.bad_count = 0
        self.bad_reasons: Counter[str] = Counter()
        self.recent_bad: deque[BadDatagram] = deque(maxlen=32)
        self._sock = _bind(self.path, mode, rcvbuf_bytes)

    # -- socket side -------------------------------------------------------------------

    def fileno(self) -> int:
        return self._sock.fileno()

    def poll(self) -> list[BadDatagram]:
        """Read every pending datagram (up to max_per_poll) without blocking. Returns the
        bad ones read by this call; the good ones update the per-(comm, rank) state."""
        bad: list[BadDatagram] = []
        for _ in range(self._max_per_poll):
            try:
                data = self._sock.recv(MAX_DATAGRAM + 1)
            except (BlockingIOError, InterruptedError):
                break
            self.received += 1
            result = decode_snapshot(data)
            if isinstance(result, WireError):
                item = BadDatagram(result, data)
                bad.append(item)
                self.bad_count += 1
                self.bad_reasons[type(result).__name__] += 1
                self.recent_bad.append(item)
            else:
                self._absorb(result)
        return bad

    def _absorb(self, snap: Snapshot) -> None:
        self._drops[snap.pid] = SenderDrops(snap.pid, snap.drops_full, snap.drops_unsent)
        received_ts = snap.wall_ns / 1e9
        last = self._sender_last.get(snap.pid)
        if last is None or received_ts - last > 0.05:  # MORE datagrams share one interval
            if last is not None and received_ts > last:
                self._sender_interval[snap.pid] = received_ts - last
            self._sender_last[snap.pid] = received_ts
        for entry in snap.entries:
            self._latest[(entry.comm_hash, entry.rank)] = _Latest(
                entry, received_ts, snap.wall_time(entry.last_event_ns), snap.pid)

    def _expired(self, v: _Latest, now: float) -> bool:
        interval = self._sender_interval.get(v.pid, 0.0)
        return v.received_ts < now - max(self._expire_after_s, self._stale_intervals * interval)

    @property
    def sender_drops(self) -> tuple[SenderDrops, ...]:
        return tuple(self._drops[p] for p in sorted(self._drops))

    # -- record side -------------------------------------------------------------------

    def collect(self, now: float) -> CCLRecord | None:
        """One CCLRecord holding every live rank of this host at event time ``now``, or
        None if there is none. ``now`` comes from the caller (the agent's sample clock)."""
        for key in [k for k, v in self._latest.items() if self._expired(v, now)]:
            del self._latest[key]
        live = {v.pid for v in self._latest.values()}
        for pid in [p for p in self._sender_last if p not in live]:
            self._sender_last.pop(pid, None)
            self._sender_interval.pop(pid, None)
            self._drops.pop(pid, None)
        if not self._latest:
            return None
        ranks = tuple(_rank_snapshot(self._latest[k]) for k in sorted(self._latest))
        for key in [k for k, v in self._latest.items() if v.entry.final]:
            del self._latest[key]
        return CCLRecord(host=self.host, ts=now, ranks=ranks, job=self._job_getter())

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Close the socket and remove its file."""
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                self.path.unlink()

    def __enter__(self) -> CCLReceiver:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _rank_snapshot(latest: _Latest) -> RankSnapshot:
    """Aegis §4.2/§5.2 counters of one rank, ns converted to µs."""
    e = latest.entry
    ops = tuple(OpCounters(op=o.kind, cl=o.cl, wr=o.wr, wc=o.wc, seq=o.seq,
                           td_us=o.td_ns / 1000.0, n_us=o.n_ns / 1000.0) for o in e.ops)
    return RankSnapshot(comm=e.comm, comm_size=e.nranks, rank=e.rank, gpu=e.local_gpu, ops=ops,
                        pending_peers=tuple(sorted(e.pending_peers)),
                        last_event_ts=latest.last_event_ts)


def _bind(path: Path, mode: int, rcvbuf_bytes: int) -> socket.socket:
    """Create the directory, replace a stale socket file, bind non-blocking."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(path)
            if not stat.S_ISSOCK(st.st_mode):
                raise ConfigError(f"ccl receiver: {path} exists and is not a socket; not removing it")
            path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    except OSError as exc:
        raise ConfigError(f"ccl receiver: cannot prepare socket {path}: {exc}") from exc
    try:
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf_bytes)
        sock.bind(str(path))
        os.chmod(path, mode)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"ccl receiver: cannot bind {path}: {exc}") from exc
    return sock
