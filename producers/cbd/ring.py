"""The socket ring all-reduce: the collective test's fallback driver where nccl-tests is not
installed. ``python -m producers.cbd.ring --rank R --peers ADDR:PORT ...`` (one per rank,
all started together; rank R listens on ``peers[R]``'s port).

Aegis §6 (CBD) multi-host stage, "collective communication". Two phases over TCP:

1. links: every rank streams to its ring neighbours (next and previous) at once, for at
   most ``--link-cap-s`` / ``--link-mb``; each receiver times its incoming streams from the
   first to the last byte: one rate per directed ring link, all loaded together as a ring
   collective loads them;
2. all-reduce: a ring reduce-scatter then all-gather of ``--mb`` MB of float32 (rank r
   contributes r+1 everywhere, so every element must end as n(n+1)/2). algbw = bytes /
   time, busbw = algbw * 2(n-1)/n (the nccl-tests convention), in GB/s.

A stalled stream (a black-holed link) ends at ``--timeout`` with the step that stalled
named; the JSON is printed either way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import socket
import struct
import sys
import threading
import time
from typing import Any

import numpy as np

_HDR = struct.Struct("!cH")  # tag (L link, R ring), source rank


class Listener:
    """Accepts tagged connections and hands them out by (tag, source rank)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", port))
        self.sock.listen(16)
        self.conns: dict[tuple[bytes, int], socket.socket] = {}
        self.cv = threading.Condition()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
                conn.settimeout(10)
                tag, src = _HDR.unpack(_recv_exact(conn, _HDR.size))
            except OSError:
                continue
            with self.cv:
                self.conns[(tag, src)] = conn
                self.cv.notify_all()

    def get(self, tag: bytes, src: int, deadline: float) -> socket.socket:
        with self.cv:
            while (tag, src) not in self.conns:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"rank {src} never connected ({tag.decode()})")
                self.cv.wait(left)
            return self.conns.pop((tag, src))


def _recv_exact(s: socket.socket, n: int, into: memoryview | None = None) -> bytes:
    buf = into if into is not None else memoryview(bytearray(n))
    got = 0
    while got < n:
        k = s.recv_into(buf[got:n])
        if not k:
            raise ConnectionError("peer closed the connection")
        got += k
    return bytes(buf[:n]) if into is None else b""


def connect(addr: tuple[str, int], tag: bytes, rank: int, deadline: float) -> socket.socket:
    """Connect, retrying while the peer's listener is not up yet."""
    while True:
        try:
            s = socket.create_connection(addr, timeout=2)
            s.sendall(_HDR.pack(tag, rank))
            return s
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _send_stream(s: socket.socket, cap_s: float, cap_bytes: int) -> None:
    chunk = b"\0" * (256 << 10)
    sent, t0 = 0, time.perf_counter()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 256 << 10)
    s.settimeout(cap_s)
    with contextlib.suppress(OSError), s:
        while sent < cap_bytes and time.perf_counter() - t0 < cap_s:
            sent += s.send(chunk)
        s.shutdown(socket.SHUT_WR)


def _recv_stream(s: socket.socket, window_s: float) -> dict[str, Any]:
    total, first, last = 0, 0.0, 0.0
    buf = bytearray(1 << 20)
    end = time.perf_counter() + window_s
    with s:
        try:
            while (left := end - time.perf_counter()) > 0:
                s.settimeout(left)
                n = s.recv_into(buf)
                if not n:
                    break
                last = time.perf_counter()
                first = first or last
                total += n
        except OSError:
            pass
    secs = max(last - first, 1e-6)
    return {"bytes": total, "secs": round(secs, 6),
            "gbps": round(total * 8 / secs / 1e9, 4) if total > 1 << 16 else 0.0}


def link_phase(rank: int, peers: list[tuple[str, int]], lis: Listener, a: argparse.Namespace
               ) -> list[dict[str, Any]]:
    n = len(peers)
    nbrs = sorted({(rank + 1) % n, (rank - 1) % n} - {rank})
    deadline = time.monotonic() + a.timeout
    out: list[dict[str, Any]] = []
    senders = []
    for p in nbrs:
        try:
            s = connect(peers[p], b"L", rank, deadline)
        except OSError as e:
            out.append({"src": rank, "dst": p, "error": f"connect: {e}"})
            continue
        t = threading.Thread(target=_send_stream, args=(s, a.link_cap_s, a.link_mb << 20))
        t.start()
        senders.append(t)
    results: dict[int, dict[str, Any]] = {}

    def receive(p: int) -> None:
        try:
            conn = lis.get(b"L", p, deadline)
            results[p] = {"src": p, "dst": rank, **_recv_stream(conn, a.link_cap_s * 3)}
        except (OSError, TimeoutError) as e:
            results[p] = {"src": p, "dst": rank, "bytes": 0, "gbps": 0.0, "error": str(e)}

    rt = [threading.Thread(target=receive, args=(p,)) for p in nbrs]
    for t in rt:
        t.start()
    for t in rt + senders:
        t.join()
    return out + [results[p] for p in nbrs]


def allreduce(rank: int, peers: list[tuple[str, int]], lis: Listener, a: argparse.Namespace
              ) -> dict[str, Any]:
    n = len(peers)
    deadline = time.monotonic() + a.timeout
    elems = max(n, (a.mb << 20) // 4 // n * n)
    data = np.full(elems, rank + 1, dtype=np.float32)
    chunks = np.split(data, n)
    nxt = connect(peers[(rank + 1) % n], b"R", rank, deadline)
    nxt.settimeout(max(0.01, deadline - time.monotonic()))
    prv = lis.get(b"R", (rank - 1) % n, deadline)
    outq: queue.Queue[bytes | None] = queue.Queue()
    errors: list[str] = []

    def sender() -> None:
        while (item := outq.get()) is not None:
            try:
                nxt.sendall(item)
            except OSError as e:
                errors.append(f"send to rank {(rank + 1) % n}: {e}")
                return

    st = threading.Thread(target=sender, daemon=True)
    st.start()
    tmp = np.empty_like(chunks[0])
    step, t0 = "", time.perf_counter()
    try:
        for phase in ("reduce-scatter", "all-gather"):
            for s in range(n - 1):
                step = f"{phase} step {s}"
                if phase == "reduce-scatter":
                    send_i, recv_i = (rank - s) % n, (rank - s - 1) % n
                else:
                    send_i, recv_i = (rank + 1 - s) % n, (rank - s) % n
                outq.put(chunks[send_i].tobytes())
                prv.settimeout(max(0.01, deadline - time.monotonic()))
                _recv_exact(prv, tmp.nbytes, memoryview(tmp.data).cast("B"))
                if phase == "reduce-scatter":
                    chunks[recv_i] += tmp
                else:
                    chunks[recv_i][:] = tmp
    except (OSError, ConnectionError) as e:
        return {"error": f"{step} waiting for rank {(rank - 1) % n}: "
                         f"{'timed out' if isinstance(e, TimeoutError) else e}"}
    finally:
        outq.put(None)
    secs = time.perf_counter() - t0
    st.join(timeout=max(0.1, deadline - time.monotonic()))
    nxt.close()
    prv.close()
    expect = n * (n + 1) / 2
    algbw = data.nbytes / secs / 1e9
    return {"bytes": data.nbytes, "secs": round(secs, 6), "algbw_gbps": round(algbw, 4),
            "busbw_gbps": round(algbw * 2 * (n - 1) / n, 4),
            "correct": bool(np.all(data == expect)), **({"error": errors[0]} if errors else {})}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m producers.cbd.ring")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--peers", nargs="+", required=True, help="ADDR:PORT per rank, in order")
    p.add_argument("--mb", type=int, default=8)
    p.add_argument("--link-mb", type=int, default=64)
    p.add_argument("--link-cap-s", type=float, default=0.5)
    p.add_argument("--timeout", type=float, default=20.0)
    a = p.parse_args(argv)
    peers = [(h, int(port)) for h, port in (x.rsplit(":", 1) for x in a.peers)]
    lis = Listener(peers[a.rank][1])
    out: dict[str, Any] = {"rank": a.rank, "size": len(peers)}
    out["links"] = link_phase(a.rank, peers, lis, a)
    out["allreduce"] = allreduce(a.rank, peers, lis, a)
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
