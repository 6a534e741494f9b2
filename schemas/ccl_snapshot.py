"""The CCL snapshot datagram, version 1: the one definition of the bytes ``ccl_hooks`` sends.

The NCCL profiler plugin (``ccl_hooks/``) sends one datagram per interval to a Unix
datagram socket; :mod:`producers.agent.ccl_receiver` reads them. They carry, per
communicator and rank, the Aegis §4.2 counters CL/WR/WC per collective kind and the §5.2
figures TD (last op duration, and which launch it was) and N (mean network time of the last
L = 5 work requests). The C encoder (``ccl_hooks/src/wire.c``) and this codec are checked
against the same vectors in ``schemas/vectors/``.

All integers little-endian, fixed size, no padding::

    header, 40 bytes
      0  4s   magic            b"AGCC"
      4  u8   version          1
      5  u8   flags            bit 0 MORE: the snapshot continues in the next datagram
      6  u16  n_entries
      8  u32  pid              sending process
     12  u32  seq              datagram number in that process, from 1
     16  u32  drops_full       datagrams dropped so far because the socket was full
     20  u32  drops_unsent     datagrams not sent so far: no receiver, or another error
     24  u64  wall_ns          CLOCK_REALTIME when encoded
     32  u64  mono_ns          CLOCK_MONOTONIC at the same moment
    entry, 40 bytes, then n_ops op records, then n_pending peers
      0  u64  comm_hash        NCCL communicator hash
      8  u32  nranks
     12  u32  rank
     16  i16  local_gpu        -1 when unknown
     18  u8   n_ops            <= 12, one per kind with any activity
     19  u8   n_pending        <= 32
     20  u16  flags            bit 0 FINAL (comm finalized), bit 1 PENDING_CUT
     22  u16  reserved         0
     24  u32  pending_total    peers with outstanding steps (>= n_pending)
     28  u32  handles_exhausted  NULL event handles returned so far (pool empty)
     32  u64  last_event_ns    CLOCK_MONOTONIC of the latest event, 0 = none yet
    op record, 56 bytes
      0  u8   kind             index into OP_KINDS
      1  u8   n_samples        steps behind n_ns, <= 5
      2  u16, 4 u32  reserved  0
      8  u64  cl, 16 wr, 24 wc, 32 seq, 40 td_ns, 48 n_ns
    peer, 4 bytes: u32 rank, < nranks
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from schemas.errors import DecodeError, ValidationError, VersionError, WireError

MAGIC = b"AGCC"
VERSION = 1
HEADER = struct.Struct("<4sBBHIIIIQQ")
ENTRY = struct.Struct("<QIIhBBHHIIQ")
OP = struct.Struct("<BBHIQQQQQQ")
PEER = struct.Struct("<I")
OP_KINDS = ("other", "AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce",
            "AlltoAll", "Gather", "Scatter", "Send", "Recv", "SendRecv")
FLAG_MORE = 0x01
ENTRY_FINAL = 0x0001
ENTRY_PENDING_CUT = 0x0002
N_LAST = 5
MAX_PENDING = 32
MAX_DATAGRAM = 65536
_REC = "CCLSnapshot"


@dataclass(frozen=True, slots=True)
class OpStats:
    """One collective kind on one rank, cumulative (Aegis §4.2 CL/WR/WC, §5.2 TD/N)."""

    kind: str
    cl: int
    wr: int
    wc: int
    seq: int = 0  # launch number (1-based) that td_ns belongs to; 0 = none finished
    td_ns: int = 0
    n_ns: int = 0  # mean network time of the last n_samples (<= 5) completed steps
    n_samples: int = 0


@dataclass(frozen=True, slots=True)
class RankEntry:
    """One rank of one communicator in one process."""

    comm_hash: int
    nranks: int
    rank: int
    local_gpu: int
    ops: tuple[OpStats, ...]
    pending_peers: tuple[int, ...] = ()
    pending_total: int = 0
    handles_exhausted: int = 0
    last_event_ns: int = 0
    final: bool = False

    @property
    def comm(self) -> str:
        """The communicator as 16 hex digits, the form CCLRecord uses."""
        return f"{self.comm_hash:016x}"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One decoded datagram."""

    pid: int
    seq: int
    wall_ns: int
    mono_ns: int
    entries: tuple[RankEntry, ...]
    drops_full: int = 0
    drops_unsent: int = 0
    more: bool = False
    version: int = VERSION

    def wall_time(self, mono_ns: int) -> float:
        """Epoch seconds of a CLOCK_MONOTONIC reading from the same process (0 stays 0)."""
        if mono_ns <= 0:
            return 0.0
        return max(0.0, (self.wall_ns - (self.mono_ns - mono_ns)) / 1e9)


def encode_snapshot(snap: Snapshot) -> bytes:
    """Bytes for ``snap`` (used by tests and vector generation). Raises ValueError if a
    value does not fit its field, or a kind is not in OP_KINDS."""
    try:
        out = [HEADER.pack(MAGIC, snap.version, FLAG_MORE if snap.more else 0,
                           len(snap.entries), snap.pid, snap.seq, snap.drops_full,
                           snap.drops_unsent, snap.wall_ns, snap.mono_ns)]
        for e in snap.entries:
            if len(e.ops) > len(OP_KINDS) or len(e.pending_peers) > MAX_PENDING:
                raise ValueError(f"entry comm {e.comm} rank {e.rank}: too many ops or peers")
            flags = (ENTRY_FINAL if e.final else 0) | (
                ENTRY_PENDING_CUT if e.pending_total > len(e.pending_peers) else 0)
            out.append(ENTRY.pack(e.comm_hash, e.nranks, e.rank, e.local_gpu, len(e.ops),
                                  len(e.pending_peers), flags, 0, e.pending_total,
                                  e.handles_exhausted, e.last_event_ns))
            for o in e.ops:
                out.append(OP.pack(OP_KINDS.index(o.kind), o.n_samples, 0, 0, o.cl, o.wr, o.wc,
                                   o.seq, o.td_ns, o.n_ns))
            out.extend(PEER.pack(p) for p in e.pending_peers)
    except struct.error as exc:
        raise ValueError(f"{_REC}: value out of range for its field ({exc})") from exc
    return b"".join(out)


def decode_snapshot(data: bytes | bytearray | memoryview) -> Snapshot | WireError:
    """Decode one datagram. Returns the Snapshot, or a WireError value saying what is wrong
    (DecodeError: not a snapshot or wrong length; VersionError; ValidationError: a field
    out of range). Never raises."""
    try:
        return _decode(data)
    except WireError as err:
        return err
    except (struct.error, ValueError, TypeError, OverflowError) as exc:
        return DecodeError(f"{_REC}: undecodable datagram ({exc})")


def _decode(data: bytes | bytearray | memoryview) -> Snapshot:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DecodeError(f"{_REC}: payload is {type(data).__name__}, not bytes")
    buf = bytes(data)
    if len(buf) > MAX_DATAGRAM:
        raise DecodeError(f"{_REC}: {len(buf)} bytes, over the {MAX_DATAGRAM}-byte limit")
    if len(buf) < HEADER.size:
        raise DecodeError(f"{_REC}: {len(buf)} bytes, shorter than the {HEADER.size}-byte header")
    magic, version, flags, n_entries, pid, seq, drops_full, drops_unsent, wall_ns, mono_ns = (
        HEADER.unpack_from(buf, 0))
    if magic != MAGIC:
        raise DecodeError(f"{_REC}: magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise VersionError(_REC, version, (VERSION,))
    if flags & ~FLAG_MORE:
        raise ValidationError(_REC, "flags", flags, "unknown header flag bits")
    off = HEADER.size
    entries = []
    for i in range(n_entries):
        entry, off = _decode_entry(buf, off, f"entries[{i}]")
        entries.append(entry)
    if off != len(buf):
        raise DecodeError(f"{_REC}: {len(buf) - off} trailing bytes after {n_entries} entries")
    return Snapshot(pid=pid, seq=seq, wall_ns=wall_ns, mono_ns=mono_ns, entries=tuple(entries),
                    drops_full=drops_full, drops_unsent=drops_unsent,
                    more=bool(flags & FLAG_MORE), version=version)


def _need(buf: bytes, off: int, size: int, what: str) -> None:
    if off + size > len(buf):
        raise DecodeError(f"{_REC}: truncated in {what} (needs {off + size} bytes, has {len(buf)})")


def _decode_entry(buf: bytes, off: int, where: str) -> tuple[RankEntry, int]:
    _need(buf, off, ENTRY.size, where)
    (comm_hash, nranks, rank, local_gpu, n_ops, n_pending, flags, reserved, pending_total,
     exhausted, last_event_ns) = ENTRY.unpack_from(buf, off)
    off += ENTRY.size
    if nranks < 1:
        raise ValidationError(_REC, f"{where}.nranks", nranks, "not at least 1")
    if rank >= nranks:
        raise ValidationError(_REC, f"{where}.rank", rank, f"not below nranks {nranks}")
    if local_gpu < -1:
        raise ValidationError(_REC, f"{where}.local_gpu", local_gpu, "below -1")
    if n_ops > len(OP_KINDS):
        raise ValidationError(_REC, f"{where}.n_ops", n_ops, f"over {len(OP_KINDS)} kinds")
    if n_pending > MAX_PENDING:
        raise ValidationError(_REC, f"{where}.n_pending", n_pending, f"over {MAX_PENDING}")
    if flags & ~(ENTRY_FINAL | ENTRY_PENDING_CUT) or reserved:
        raise ValidationError(_REC, f"{where}.flags", flags, "unknown flag or reserved bits")
    if pending_total < n_pending:
        raise ValidationError(_REC, f"{where}.pending_total", pending_total,
                              f"below the {n_pending} peers listed")
    if bool(flags & ENTRY_PENDING_CUT) != (pending_total > n_pending):
        raise ValidationError(_REC, f"{where}.flags", flags,
                              "PENDING_CUT disagrees with pending_total")
    ops = []
    seen: set[str] = set()
    for j in range(n_ops):
        op = _decode_op(buf, off, f"{where}.ops[{j}]")
        if op.kind in seen:
            raise ValidationError(_REC, f"{where}.ops[{j}].kind", op.kind, "repeated")
        seen.add(op.kind)
        ops.append(op)
        off += OP.size
    _need(buf, off, n_pending * PEER.size, f"{where}.pending")
    peers = tuple(PEER.unpack_from(buf, off + k * PEER.size)[0] for k in range(n_pending))
    off += n_pending * PEER.size
    for p in peers:
        if p >= nranks:
            raise ValidationError(_REC, f"{where}.pending", p, f"not a rank below {nranks}")
    if len(set(peers)) != len(peers):
        raise ValidationError(_REC, f"{where}.pending", peers, "repeated peer")
    return RankEntry(comm_hash=comm_hash, nranks=nranks, rank=rank, local_gpu=local_gpu,
                     ops=tuple(ops), pending_peers=peers, pending_total=pending_total,
                     handles_exhausted=exhausted, last_event_ns=last_event_ns,
                     final=bool(flags & ENTRY_FINAL)), off


def _decode_op(buf: bytes, off: int, where: str) -> OpStats:
    _need(buf, off, OP.size, where)
    kind, n_samples, r16, r32, cl, wr, wc, seq, td_ns, n_ns = OP.unpack_from(buf, off)
    if kind >= len(OP_KINDS):
        raise ValidationError(_REC, f"{where}.kind", kind, f"unknown kind code (0..{len(OP_KINDS) - 1})")
    if r16 or r32:
        raise ValidationError(_REC, f"{where}.reserved", (r16, r32), "not zero")
    if n_samples > N_LAST:
        raise ValidationError(_REC, f"{where}.n_samples", n_samples, f"over L={N_LAST}")
    if wc > wr:
        raise ValidationError(_REC, f"{where}.wc", wc, f"above wr {wr}")
    if seq > cl:
        raise ValidationError(_REC, f"{where}.seq", seq, f"above cl {cl}")
    if n_samples == 0 and n_ns:
        raise ValidationError(_REC, f"{where}.n_ns", n_ns, "set with no samples")
    return OpStats(kind=OP_KINDS[kind], cl=cl, wr=wr, wc=wc, seq=seq, td_ns=td_ns, n_ns=n_ns,
                   n_samples=n_samples)
