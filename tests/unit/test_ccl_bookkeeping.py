"""Derived bookkeeping the CCL detectors keep for speed stays equal to what it summarises:
TDN's ``OpState.oldest`` (least first-report time of the buffered iterations) and
alignment's per-rank collective-kind CL (evidence), including across snapshot/restore."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest

from processors.core.alignment import AlignmentDetector
from processors.core.tdn import TDNConfig, TDNDetector
from schemas.records import CCLRecord
from tests.unit.test_alignment import JOB, SynthJob


def check_oldest(det: TDNDetector) -> None:
    for by_op in det.ops.values():
        for st in by_op.values():
            times = [b[0] for b in st.pending.values() if not math.isnan(b[0])]
            assert st.oldest == (min(times) if times else math.inf)


def shuffled_steps(job: SynthJob, steps: int, seed: int, drop: float) -> list[CCLRecord]:
    """Records of ``steps`` iterations, some hosts' reports dropped, in shuffled host order."""
    rng = np.random.default_rng(seed)
    out: list[CCLRecord] = []
    for _ in range(steps):
        recs = [r for r in job.step() if rng.random() >= drop]
        out.extend(recs[i] for i in rng.permutation(len(recs)))
    return out


@pytest.mark.parametrize("seed, drop, max_pending", [(0, 0.0, 32), (1, 0.3, 32), (2, 0.5, 3)])
def test_tdn_oldest_tracks_the_buffered_iterations(seed: int, drop: float,
                                                   max_pending: int) -> None:
    job = SynthJob(hosts=8, seed=seed)
    job.slow[(3, 2)] = 1.3
    det = TDNDetector(JOB, TDNConfig(max_pending_seqs=max_pending, seq_timeout_s=3.0))
    recs = shuffled_steps(job, 30, seed, drop)
    for i, rec in enumerate(recs):
        det.observe(rec)
        det.advance(rec.ts)
        check_oldest(det)
        if i == len(recs) // 2:
            state = msgpack.unpackb(msgpack.packb(det.snapshot()), raw=False,
                                    strict_map_key=False)
            det = TDNDetector.restore(state, JOB, det.cfg)
            check_oldest(det)


def test_alignment_evidence_ops_survive_restore() -> None:
    job, det = SynthJob(hosts=4), AlignmentDetector(JOB)
    for _ in range(5):
        for rec in job.step():
            det.observe(rec)
    state = msgpack.unpackb(msgpack.packb(det.snapshot()), raw=False, strict_map_key=False)
    twin = AlignmentDetector.restore(state, JOB)
    assert twin.snapshot() == det.snapshot()
    for comm, ranks in det.counters.items():
        for rank, c in ranks.items():
            assert c.ops == twin.counters[comm][rank].ops
            assert sum(n for _, n in c.ops) == c.cl
