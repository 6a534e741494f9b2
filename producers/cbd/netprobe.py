"""On-host probe programs: ``python -m producers.cbd.netprobe serve|loss|bandwidth``.

Aegis Alg. 1 (OfflineDiag/NetDiag): an aggregation switch silently dropped only packets
over 1 KB and 64-byte Pingmesh saw nothing, so probe with several packet sizes.

- ``serve --port P``: UDP echo and a TCP server on P (all addresses). A TCP client opens
  with one tag byte: ``E`` echo, ``B`` bulk sink (counts bytes until EOF, answers one JSON
  line ``{"bytes", "secs"}`` timed from the first to the last data byte). Prints ``ready``.
- ``loss``: from this host to each peer (in parallel), for each size: ``--udp-count``
  datagrams with Don't-Fragment set (the kernel never splits them), echoed back; and
  ``--tcp-count`` echo messages on a fresh TCP connection (a message not echoed within
  ``--tcp-timeout`` is lost, and so are the rest: a black-holed segment stalls the stream).
  ``size`` is the IP packet length: UDP payload = size - 28, TCP message = size - 40.
- ``bandwidth``: in each round of a schedule every host streams to its partner for at most
  ``--cap-s`` seconds / ``--cap-mb`` MB; both directions at once. Rounds start at
  ``--start-at + r * --slot-s`` (epoch seconds), so hosts never need to talk to agree.

Output: one JSON object on stdout. Addresses come only from the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import select
import socket
import statistics
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

IP_MTU_DISCOVER, IP_PMTUDISC_DO = 10, 2  # linux/in.h
UDP_OVERHEAD, TCP_OVERHEAD = 28, 40
_HDR = struct.Struct("!IHH")  # token, size, seq


def _bind(s: socket.socket, port: int, wait_s: float = 5.0) -> None:
    """Bind, retrying while the port is still held (the previous check's responder, killed
    a moment ago, may not be gone yet)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            s.bind(("0.0.0.0", port))
            return
        except OSError as e:
            if e.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def serve(port: int, duration_s: float) -> None:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    _bind(udp, port)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _bind(tcp, port)
    tcp.listen(64)
    threading.Thread(target=_udp_echo, args=(udp,), daemon=True).start()
    threading.Thread(target=_tcp_accept, args=(tcp,), daemon=True).start()
    print("ready", flush=True)
    time.sleep(duration_s)


def _udp_echo(s: socket.socket) -> None:
    while True:
        data, addr = s.recvfrom(65535)
        with contextlib.suppress(OSError):
            s.sendto(data, addr)


def _tcp_accept(s: socket.socket) -> None:
    while True:
        conn, _ = s.accept()
        threading.Thread(target=_tcp_conn, args=(conn,), daemon=True).start()


def _tcp_conn(conn: socket.socket) -> None:
    conn.settimeout(120)
    with conn, contextlib.suppress(OSError):
        tag = conn.recv(1)
        if tag == b"E":
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(65536):
                conn.sendall(data)
        elif tag == b"B":
            total, first, last = 0, 0.0, 0.0
            buf = bytearray(1 << 20)
            while n := conn.recv_into(buf):
                last = time.perf_counter()
                if not total:
                    first = last
                total += n
            secs = last - first
            conn.sendall(json.dumps({"bytes": total, "secs": secs}).encode() + b"\n")


def _udp_cell(dst: tuple[str, int], size: int, count: int, gap_s: float, timeout_s: float,
              token: int) -> dict[str, Any]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.connect(dst)
    s.setblocking(False)
    pad = b"\0" * max(0, size - UDP_OVERHEAD - _HDR.size)
    sent_at: dict[int, float] = {}
    rtts: list[float] = []
    err = ""

    def drain() -> None:
        while True:
            try:
                data = s.recv(65535)
            except (BlockingIOError, ConnectionRefusedError):
                return
            if len(data) >= _HDR.size:
                tok, sz, seq = _HDR.unpack_from(data)
                if tok == token and sz == size and seq in sent_at:
                    rtts.append(time.perf_counter() - sent_at.pop(seq))

    with s:
        for seq in range(count):
            try:
                s.send(_HDR.pack(token, size, seq) + pad)
                sent_at[seq] = time.perf_counter()
            except OSError as e:  # EMSGSIZE above the local MTU, ENETUNREACH...
                err = e.strerror or str(e)
                break
            _wait_readable(s, gap_s, drain)
        deadline = time.perf_counter() + timeout_s
        while sent_at and (left := deadline - time.perf_counter()) > 0:
            _wait_readable(s, left, drain)
    sent = len(rtts) + len(sent_at)
    return {"proto": "udp", "size": size, "sent": sent, "recv": len(rtts),
            "rtt_ms": round(statistics.median(rtts) * 1e3, 3) if rtts else None,
            **({"error": err} if err else {})}


def _wait_readable(s: socket.socket, seconds: float, drain: Any) -> None:
    """Drain replies as they arrive for up to ``seconds`` (RTTs stay accurate)."""
    end = time.perf_counter() + seconds
    while (left := end - time.perf_counter()) > 0:
        if select.select([s], [], [], left)[0]:
            drain()
        else:
            return


def _tcp_cell(dst: tuple[str, int], size: int, count: int, timeout_s: float) -> dict[str, Any]:
    msg = b"x" * max(1, size - TCP_OVERHEAD)
    ok, rtts, err = 0, [], ""
    try:
        with socket.create_connection(dst, timeout=timeout_s) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(b"E")
            buf = bytearray(len(msg))
            for _ in range(count):
                t0 = time.perf_counter()
                s.sendall(msg)
                got, view = 0, memoryview(buf)
                while got < len(msg):
                    s.settimeout(max(0.001, timeout_s - (time.perf_counter() - t0)))
                    n = s.recv_into(view[got:])
                    if not n:
                        raise ConnectionError("closed by the responder")
                    got += n
                rtts.append(time.perf_counter() - t0)
                ok += 1
    except (OSError, ConnectionError) as e:
        err = "timeout" if isinstance(e, TimeoutError) else (getattr(e, "strerror", None)
                                                            or str(e))
    return {"proto": "tcp", "size": size, "sent": count, "recv": ok,
            "rtt_ms": round(statistics.median(rtts) * 1e3, 3) if rtts else None,
            **({"error": err} if err else {})}


def sizes_for(base: list[int], mtu: int | None, exact: bool) -> list[int]:
    """Probe sizes for a path: ``exact`` keeps ``base`` (capped at the MTU); otherwise the
    base sizes up to the path MTU plus the MTU itself (the largest unfragmented packet)."""
    cap = mtu or 1500
    out = {s for s in base if s <= cap}
    if not exact:
        out.add(cap)
    return sorted(out)


def probe_peer(name: str, addr: str, port: int, mtu: int | None, a: argparse.Namespace,
               token: int) -> list[dict[str, Any]]:
    dst = (addr, port)
    cells = []
    warm = _udp_cell(dst, 64, 3, 0.01, 0.5, token ^ 0xFFFF)  # ARP, responder up
    for size in sizes_for(a.sizes, mtu, a.exact_sizes):
        if a.udp_count:
            cells.append(_udp_cell(dst, size, a.udp_count, a.gap_ms / 1e3, a.timeout, token))
        if a.tcp_count:
            cells.append(_tcp_cell(dst, size, a.tcp_count, a.tcp_timeout))
    for c in cells:
        c["dst"] = name
    if not warm["recv"]:
        for c in cells:
            c.setdefault("note", "no reply to the 64 B warm-up")
    return cells


def loss(a: argparse.Namespace) -> dict[str, Any]:
    peers = [_peer(p) for p in a.peers]
    token = int(time.time() * 1000) & 0xFFFFFFFF
    with ThreadPoolExecutor(max(1, len(peers))) as ex:
        futs = [ex.submit(probe_peer, n, addr, port, mtu, a, token) for n, addr, port, mtu in peers]
        cells = [c for f in futs for c in f.result()]
    return {"src": a.src, "cells": cells}


def _peer(spec: str) -> tuple[str, str, int, int | None]:
    """``name=addr:port[:mtu]``."""
    name, _, rest = spec.partition("=")
    parts = rest.split(":")
    return name, parts[0], int(parts[1]), int(parts[2]) if len(parts) > 2 and parts[2] else None


def _stream(dst: tuple[str, int], cap_s: float, cap_bytes: int) -> dict[str, Any]:
    """Stream to a bulk sink; the rate is what the receiver got over the time from our first
    byte to its report (a lower bound that no buffering can inflate)."""
    chunk = b"\0" * (256 << 10)
    sent = 0
    try:
        with socket.create_connection(dst, timeout=max(1.0, cap_s)) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 256 << 10)
            t0 = time.perf_counter()
            s.sendall(b"B")
            s.settimeout(cap_s)
            while sent < cap_bytes and time.perf_counter() - t0 < cap_s:
                try:
                    sent += s.send(chunk)
                except TimeoutError:
                    break
            s.shutdown(socket.SHUT_WR)
            s.settimeout(max(1.0, cap_s * 2))
            reply = s.makefile().readline()
            secs = time.perf_counter() - t0
    except OSError as e:
        return {"sent": sent, "error": getattr(e, "strerror", None) or str(e)}
    try:
        doc = json.loads(reply)
    except ValueError:
        return {"sent": sent, "error": "no report from the receiver"}
    return {"sent": sent, "bytes": doc["bytes"], "secs": round(secs, 6),
            "rx_secs": round(float(doc["secs"]), 6),
            "gbps": round(doc["bytes"] * 8 / max(secs, 1e-6) / 1e9, 4)}


def bandwidth(a: argparse.Namespace) -> dict[str, Any]:
    """``--schedule`` = JSON [[round, partner_name, addr, port], ...] for this host."""
    out = []
    for rnd, partner, addr, port in json.loads(a.schedule):
        start = a.start_at + rnd * a.slot_s
        time.sleep(max(0.0, start - time.time()))
        r = _stream((addr, int(port)), a.cap_s, a.cap_mb << 20)
        out.append({"dst": partner, "round": rnd, **r})
    return {"src": a.src, "links": out}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m producers.cbd.netprobe")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--duration", type=float, default=600.0)
    lo = sub.add_parser("loss")
    lo.add_argument("--src", required=True)
    lo.add_argument("--peers", nargs="+", required=True, help="name=addr:port[:mtu]")
    lo.add_argument("--sizes", type=lambda v: [int(x) for x in v.split(",")], default=[64])
    lo.add_argument("--exact-sizes", action="store_true")
    lo.add_argument("--udp-count", type=int, default=20)
    lo.add_argument("--tcp-count", type=int, default=3)
    lo.add_argument("--gap-ms", type=float, default=1.0)
    lo.add_argument("--timeout", type=float, default=0.3)
    lo.add_argument("--tcp-timeout", type=float, default=0.5)
    bw = sub.add_parser("bandwidth")
    bw.add_argument("--src", required=True)
    bw.add_argument("--schedule", required=True)
    bw.add_argument("--start-at", type=float, required=True)
    bw.add_argument("--slot-s", type=float, default=1.0)
    bw.add_argument("--cap-s", type=float, default=0.5)
    bw.add_argument("--cap-mb", type=int, default=64)
    a = p.parse_args(argv)
    if a.cmd == "serve":
        serve(a.port, a.duration)
        return 0
    json.dump(loss(a) if a.cmd == "loss" else bandwidth(a), sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
