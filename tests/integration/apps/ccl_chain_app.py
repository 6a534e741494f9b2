"""The whole Phase-2 chain in one process, for test_ccl_chain: the built plugin driven through
the v4 ABI (the harness test's independent ctypes declarations) as four ranks of one
communicator on GPUs 0-3, a real CCLReceiver reading its datagrams, and the real alignment
and TD/N detectors fed the records. Rank 2 stops launching after 9 AllReduces while its
peers enter the 10th and wait on it (Aegis §4.2: a compute hang). Prints the diagnoses as
JSON lines. Run in its own process: the plugin reads its socket at the first init.

    python -m tests.integration.apps.ccl_chain_app SOCKET
"""

from __future__ import annotations

import ctypes as C
import os
import sys
import time

import orjson

from processors.core.alignment import AlignmentConfig, AlignmentDetector
from processors.core.tdn import TDNDetector
from producers.agent.ccl_receiver import CCLReceiver
from tests.integration.test_ccl_hooks_harness import (
    COLL,
    KERNEL_CH,
    KERNEL_CH_STOP,
    LIB,
    PROXY_OP,
    PROXY_STEP,
    RECV_WAIT,
    SEND_WAIT,
    DescrV4,
    ProfilerV4,
    StateArgsV4,
    _Coll,
    _DescrUnion,
    _KernelCh,
    _ProxyOp,
    _start,
)

RANKS, DONE, HUNG = 4, 9, 2
PEER = {0: 1, 1: 2, 2: 3, 3: 0}  # ring: each rank receives from the next


def launch(t: ProfilerV4, rank: int, seq: int, finish: bool) -> list[C.c_void_p]:
    """One AllReduce of ``rank``: send to the previous rank, receive from the next; the
    receive waits forever unless ``finish``. Returns the handles left open."""
    args, ctx = StateArgsV4(), CTX[rank]
    coll = _start(t, ctx, DescrV4(type=COLL, rank=rank, u=_DescrUnion(coll=_Coll(
        seqNumber=seq, func=b"AllReduce", nChannels=1))))
    t.stopEvent(coll)
    send = _start(t, ctx, DescrV4(type=PROXY_OP, parentObj=coll, rank=rank, u=_DescrUnion(
        proxyOp=_ProxyOp(pid=os.getpid(), peer=(rank - 1) % RANKS, nSteps=1, isSend=1))))
    step = _start(t, ctx, DescrV4(type=PROXY_STEP, parentObj=send, rank=rank))
    t.recordEventState(step, SEND_WAIT, C.byref(args))
    t.stopEvent(step)
    t.stopEvent(send)
    recv = _start(t, ctx, DescrV4(type=PROXY_OP, parentObj=coll, rank=rank, u=_DescrUnion(
        proxyOp=_ProxyOp(pid=os.getpid(), peer=PEER[rank], nSteps=1, isSend=0))))
    step = _start(t, ctx, DescrV4(type=PROXY_STEP, parentObj=recv, rank=rank))
    t.recordEventState(step, RECV_WAIT, C.byref(args))
    if not finish:
        return [step, recv]
    t.stopEvent(step)
    t.stopEvent(recv)
    ch = _start(t, ctx, DescrV4(type=KERNEL_CH, parentObj=coll, rank=rank,
                                u=_DescrUnion(kernelCh=_KernelCh(pTimer=1000 * (seq + 1)))))
    args.pTimer = 1000 * (seq + 1) + 700
    t.recordEventState(ch, KERNEL_CH_STOP, C.byref(args))
    t.stopEvent(ch)
    return []


CTX: dict[int, C.c_void_p] = {}


def main(sock: str) -> int:
    os.environ["AEGIS_CCL_SOCKET"] = sock
    os.environ["AEGIS_CCL_INTERVAL_MS"] = "50"
    table = ProfilerV4.in_dll(C.CDLL(str(LIB)), "ncclProfiler_v4")
    cfg = AlignmentConfig(stall_s=2.0, gone_s=1.0, eval_interval_s=0.2, undecided_max_s=1.0)
    alignment, tdn = AlignmentDetector("job-chain", cfg), TDNDetector("job-chain")
    out = []
    with CCLReceiver(sock, "h001", lambda: "job-chain") as rx:
        for r in range(RANKS):
            os.environ["AEGIS_CCL_LOCAL_GPU"] = str(r)  # read at each init
            ctx, mask = C.c_void_p(), C.c_int()
            assert table.init(C.byref(ctx), C.byref(mask), b"chain", 0xC4A1, 1, RANKS, r, None) == 0
            CTX[r] = ctx
        for seq in range(DONE):
            for r in range(RANKS):
                launch(table, r, seq, finish=True)
        open_handles = [h for r in range(RANKS) if r != HUNG
                        for h in launch(table, r, DONE, finish=False)]
        deadline = time.monotonic() + 8.0
        while time.monotonic() < deadline:
            rx.poll()
            rec = rx.collect(time.time())
            if rec is not None:
                for det in (alignment, tdn):
                    out += det.observe(rec).diagnoses
            time.sleep(0.05)
        for h in open_handles:
            table.stopEvent(h)
        for r in range(RANKS):
            table.finalize(CTX[r])
    for d in out:
        sys.stdout.buffer.write(orjson.dumps(d.to_wire()) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
