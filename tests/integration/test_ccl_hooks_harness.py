"""The C plugin end to end: ``make -C ccl_hooks test`` (build with -Werror, exported symbols,
shared wire vectors, NCCL-like scenarios plain, under ASan+UBSan, TSan and valgrind), then
the built library driven through ctypes from independent declarations of the v4 and v7 ABIs
and read back by CCLReceiver. Missing tools are a failure, not a skip."""

from __future__ import annotations

import ctypes as C
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from producers.agent.ccl_receiver import CCLReceiver
from schemas.records import CCLRecord

ROOT = Path(__file__).resolve().parents[2]
HOOKS = ROOT / "ccl_hooks"
LIB = HOOKS / "build" / "libaegis_ccl_profiler.so"
TOOLS = ("make", "gcc", "nm", "valgrind")


def _require_tools() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.fail(f"ccl_hooks needs {', '.join(missing)} on PATH (apt-get install build-essential "
                    "binutils valgrind)")


def test_make_test_passes() -> None:
    _require_tools()
    proc = subprocess.run(["make", "-C", str(HOOKS), "test"], capture_output=True, text=True,
                          timeout=900, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "ccl_hooks: all tests passed" in out
    assert "warning" not in out.lower()


# -- an independent ctypes declaration of plugins/profiler/example/nccl/profiler_v4.h --------

class _Coll(C.Structure):
    _fields_ = [("seqNumber", C.c_uint64), ("func", C.c_char_p), ("sendBuff", C.c_void_p),
                ("recvBuff", C.c_void_p), ("count", C.c_size_t), ("root", C.c_int),
                ("datatype", C.c_char_p), ("nChannels", C.c_uint8), ("nWarps", C.c_uint8),
                ("algo", C.c_char_p), ("proto", C.c_char_p)]


class _P2p(C.Structure):
    _fields_ = [("func", C.c_char_p), ("buff", C.c_void_p), ("datatype", C.c_char_p),
                ("count", C.c_size_t), ("peer", C.c_int), ("nChannels", C.c_uint8)]


class _ProxyOp(C.Structure):
    _fields_ = [("pid", C.c_int), ("channelId", C.c_uint8), ("peer", C.c_int),
                ("nSteps", C.c_int), ("chunkSize", C.c_int), ("isSend", C.c_int)]


class _KernelCh(C.Structure):
    _fields_ = [("channelId", C.c_uint8), ("pTimer", C.c_uint64)]


class _NetPlugin(C.Structure):
    _fields_ = [("id", C.c_int64), ("data", C.c_void_p)]


class _DescrUnion(C.Union):
    _fields_ = [("coll", _Coll), ("p2p", _P2p), ("proxyOp", _ProxyOp), ("step", C.c_int),
                ("kernelCh", _KernelCh), ("netPlugin", _NetPlugin)]


class DescrV4(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = [("type", C.c_uint8), ("parentObj", C.c_void_p), ("rank", C.c_int),
                ("u", _DescrUnion)]


class StateArgsV4(C.Union):
    _fields_ = [("transSize", C.c_size_t), ("appendedProxyOps", C.c_int), ("data", C.c_void_p),
                ("pTimer", C.c_uint64)]


_INIT = C.CFUNCTYPE(C.c_int, C.POINTER(C.c_void_p), C.POINTER(C.c_int), C.c_char_p, C.c_uint64,
                    C.c_int, C.c_int, C.c_int, C.c_void_p)
_START = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(C.c_void_p), C.POINTER(DescrV4))
_STOP = C.CFUNCTYPE(C.c_int, C.c_void_p)
_RECORD = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int, C.POINTER(StateArgsV4))


class ProfilerV4(C.Structure):
    _fields_ = [("name", C.c_char_p), ("init", _INIT), ("startEvent", _START),
                ("stopEvent", _STOP), ("recordEventState", _RECORD), ("finalize", _STOP)]


COLL, PROXY_OP, PROXY_STEP, KERNEL_CH = 1 << 1, 1 << 3, 1 << 4, 1 << 6
SEND_WAIT, RECV_WAIT, KERNEL_CH_STOP = 9, 10, 22


def test_ctypes_layout_matches_nccl_v4() -> None:
    assert C.sizeof(DescrV4) == 104 and DescrV4.u.offset == 24
    assert _Coll.nChannels.offset == 56 and _Coll.algo.offset == 64
    assert _ProxyOp.peer.offset == 8 and _ProxyOp.isSend.offset == 20
    assert _KernelCh.pTimer.offset == 8 and C.sizeof(StateArgsV4) == 8
    assert C.sizeof(ProfilerV4) == 48 and ProfilerV4.finalize.offset == 40


def _start(t: ProfilerV4, ctx: C.c_void_p, d: DescrV4) -> C.c_void_p:
    h = C.c_void_p()
    assert t.startEvent(ctx, C.byref(h), C.byref(d)) == 0
    return h


def test_plugin_through_ctypes_to_receiver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _require_tools()
    subprocess.run(["make", "-C", str(HOOKS)], check=True, capture_output=True, timeout=300)
    sock = tmp_path / "ccl.sock"
    monkeypatch.setenv("AEGIS_CCL_SOCKET", str(sock))
    monkeypatch.setenv("AEGIS_CCL_INTERVAL_MS", "20")
    monkeypatch.setenv("AEGIS_CCL_LOCAL_GPU", "6")
    table = ProfilerV4.in_dll(C.CDLL(str(LIB)), "ncclProfiler_v4")
    assert table.name == b"aegis-ccl"
    with CCLReceiver(sock, "h001", lambda: "job-e2e") as rx:
        ctx, mask = C.c_void_p(), C.c_int()
        assert table.init(C.byref(ctx), C.byref(mask), b"e2e", 0xE2E, 1, 4, 2, None) == 0
        assert mask.value == 0x5E  # Coll | P2p | ProxyOp | ProxyStep | KernelCh
        args = StateArgsV4()
        for i in range(3):
            coll = _start(table, ctx, DescrV4(type=COLL, u=_DescrUnion(coll=_Coll(
                seqNumber=i, func=b"AllReduce", nChannels=1))))
            table.stopEvent(coll)
            op = _start(table, ctx, DescrV4(type=PROXY_OP, parentObj=coll, u=_DescrUnion(
                proxyOp=_ProxyOp(pid=os.getpid(), peer=3, nSteps=1, isSend=1))))
            step = _start(table, ctx, DescrV4(type=PROXY_STEP, parentObj=op))
            table.recordEventState(step, SEND_WAIT, C.byref(args))
            table.stopEvent(step)
            table.stopEvent(op)
            ch = _start(table, ctx, DescrV4(type=KERNEL_CH, parentObj=coll, u=_DescrUnion(
                kernelCh=_KernelCh(pTimer=1000 * (i + 1)))))
            args.pTimer = 1000 * (i + 1) + 500
            table.recordEventState(ch, KERNEL_CH_STOP, C.byref(args))
            table.stopEvent(ch)
        op = _start(table, ctx, DescrV4(type=PROXY_OP, parentObj=coll, u=_DescrUnion(
            proxyOp=_ProxyOp(pid=os.getpid(), peer=1, nSteps=1, isSend=0))))
        stuck = _start(table, ctx, DescrV4(type=PROXY_STEP, parentObj=op))
        table.recordEventState(stuck, RECV_WAIT, C.byref(args))

        rec = _wait(rx, lambda r: r.ranks[0].wr == 4)
        (rank,) = rec.ranks
        (ar,) = rank.ops
        assert (rank.comm, rank.comm_size, rank.rank, rank.gpu) == ("0000000000000e2e", 4, 2, 6)
        assert (ar.op, ar.cl, ar.wr, ar.wc, ar.seq, ar.td_us) == ("AllReduce", 3, 4, 3, 3, 0.5)
        assert rank.pending_peers == (1,) and ar.n_us > 0
        assert rec.job == "job-e2e"

        table.stopEvent(stuck)
        table.stopEvent(op)
        assert table.finalize(ctx) == 0
        rec = _wait(rx, lambda r: r.ranks[0].wc == 4)
        assert rec.ranks[0].pending_peers == ()
        assert rx.collect(time.time()) is None  # FINAL entry reported once, then gone
        assert rx.bad_count == 0


# -- v7 (NCCL 2.31 src/include/plugin/profiler/profiler_v7.h), just what a CE collective uses --
class _CeCollV7(C.Structure):
    _fields_ = [("seqNumber", C.c_uint64), ("func", C.c_char_p), ("sendBuff", C.c_void_p),
                ("recvBuff", C.c_void_p), ("count", C.c_size_t), ("root", C.c_int),
                ("datatype", C.c_char_p), ("syncStrategy", C.c_char_p),
                ("intraBatchSync", C.c_bool), ("batchSize", C.c_uint32),
                ("numBatches", C.c_uint32), ("ceSeqNum", C.c_uint32), ("stream", C.c_void_p),
                ("userTag", C.c_uint64)]


class _CollV7(C.Structure):
    _fields_ = [*_Coll._fields_, ("parentGroup", C.c_void_p), ("kernelVariant", C.c_char_p),
                ("isSymColl", C.c_bool), ("userTag", C.c_uint64)]


class _DescrUnionV7(C.Union):
    _fields_ = [("coll", _CollV7), ("ceColl", _CeCollV7)]


class DescrV7(C.Structure):
    _fields_ = [("type", C.c_uint64), ("parentObj", C.c_void_p), ("rank", C.c_int),
                ("u", _DescrUnionV7)]


_INIT7 = C.CFUNCTYPE(C.c_int, C.POINTER(C.c_void_p), C.c_uint64, C.POINTER(C.c_int), C.c_char_p,
                     C.c_int, C.c_int, C.c_int, C.c_void_p)
_START7 = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(C.c_void_p), C.POINTER(DescrV7))
_RECORD7 = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int, C.POINTER(StateArgsV4))


class ProfilerV7(C.Structure):
    _fields_ = [("name", C.c_char_p), ("init", _INIT7), ("startEvent", _START7),
                ("stopEvent", _STOP), ("recordEventState", _RECORD7), ("finalize", _STOP)]


CE_COLL = 1 << 12


def test_v7_copy_engine_collectives_count_as_launches(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL >= 2.29 runs some intra-node collectives on the copy engines and reports them as
    CeColl events only; through the v7 table each is a launch (CL), with no WR/WC and no TD."""
    _require_tools()
    assert C.sizeof(DescrV7) == 136 and _CollV7.userTag.offset == 104  # 24 + 104 = 128
    assert _CeCollV7.stream.offset == 80 and C.sizeof(ProfilerV7) == 48
    subprocess.run(["make", "-C", str(HOOKS)], check=True, capture_output=True, timeout=300)
    sock = tmp_path / "ccl.sock"
    monkeypatch.setenv("AEGIS_CCL_SOCKET", str(sock))
    monkeypatch.setenv("AEGIS_CCL_INTERVAL_MS", "20")
    table = ProfilerV7.in_dll(C.CDLL(str(LIB)), "ncclProfiler_v7")
    with CCLReceiver(sock, "h002", lambda: "job-ce") as rx:
        ctx, mask = C.c_void_p(), C.c_int()
        assert table.init(C.byref(ctx), 0xCE7, C.byref(mask), b"tp", 1, 8, 5, None) == 0
        assert mask.value == 0x5E | CE_COLL
        for i in range(4):
            d = DescrV7(type=CE_COLL)
            d.u.ceColl = _CeCollV7(seqNumber=2 * i, func=b"AllGather", count=4096,
                                   syncStrategy=b"MC", userTag=7)
            h = C.c_void_p()
            assert table.startEvent(ctx, C.byref(h), C.byref(d)) == 0 and h.value
            table.stopEvent(h)
        assert table.finalize(ctx) == 0
        rec = _wait(rx, lambda r: bool(r.ranks) and r.ranks[0].ops[0].cl == 4)
        (ag,) = rec.ranks[0].ops
        assert (ag.op, ag.cl, ag.wr, ag.wc, ag.seq, ag.td_us) == ("AllGather", 4, 0, 0, 0, 0.0)
        assert rx.bad_count == 0


def _wait(rx: CCLReceiver, ready: Callable[[CCLRecord], bool], timeout_s: float = 10.0) -> CCLRecord:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rx.poll()
        rec = rx.collect(time.time())
        if rec is not None and ready(rec):
            return rec
        time.sleep(0.01)
    pytest.fail("no matching snapshot from the plugin")
