"""The Aegis §5 degradation measure, from CCL progress alone.

Aegis §5: with Ts = 1.2 × the normal iteration time, degradation = Σ(Tk − Ts) over the
iterations where Tk > Ts, divided by ΣTk.

We cannot see iteration boundaries from outside the model, but we see the job's
data-parallel collective progress: the ``seq`` (launches completed) of the DP AllReduce on
every rank, sampled with every CCL snapshot. Method (docs/replay.md):

1. The *pacing communicators* are the job's communicators that span more than one host
   (data-parallel), using their ``AllReduce`` (or, without one, their busiest op). A
   communicator progresses at the pace of its slowest rank: its progress P(t) is the
   minimum over ranks of the newest ``seq`` at or before t.
2. Time is cut into buckets of ``dt`` seconds. In bucket i a communicator completed
   ΔP_i launches, so each launch took τ_i = dt / ΔP_i (∞ when ΔP_i = 0: stalled).
   The normal time per launch τ0 is the median of the *healthy mode*: the buckets whose
   τ_i is within 10% of the 5th-percentile τ (a fault that lasts most of the recording
   must not become "normal"; this needs at least ~5% healthy time).
3. A fixed number of launches makes one iteration, so iteration time scales with τ:
   Tk/T_normal = τ_i/τ0 = r_i. The job's r_i is the worst of its pacing communicators
   (the slowest one gates the iteration).
4. Over the buckets from the first progress to the last sample, the time beyond
   Ts = 1.2·T_normal is lost: lost_i = dt · max(0, 1 − 1.2 / r_i) (a whole bucket when
   stalled). This is Σ(Tk − Ts)/ΣTk of the Aegis definition, evaluated bucket by bucket.

Pure: numpy arrays in, a :class:`Degradation` out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

SLOW_FACTOR = 1.2  # Aegis §5: Ts = 1.2 × the normal iteration time


@dataclass
class Degradation:
    """Per-job result. ``ratio[i]`` = r_i (τ_i/τ0; inf when stalled, nan outside the run)."""

    job: str
    fraction: float | None  # Σ lost / Σ time over the running buckets; None: no data
    lost_s: float = 0.0
    running_s: float = 0.0
    stalled_s: float = 0.0
    slow_buckets: int = 0
    normal_launch_s: float | None = None  # τ0 of the pacing communicator(s)
    bucket_s: float = 0.0
    t0: float = 0.0
    ratio: list[float] = field(default_factory=list)
    comms: list[str] = field(default_factory=list)
    op: str = ""

    def to_wire(self) -> dict[str, object]:
        return {"job": self.job, "fraction": self.fraction, "lost_s": self.lost_s,
                "running_s": self.running_s, "stalled_s": self.stalled_s,
                "slow_buckets": self.slow_buckets, "normal_launch_s": self.normal_launch_s,
                "bucket_s": self.bucket_s, "comms": self.comms, "op": self.op}


def forward_fill(a: np.ndarray) -> np.ndarray:
    """Each row's NaNs replaced by the last value before them (leading NaNs stay)."""
    out = np.array(a, dtype=np.float64, copy=True)
    if out.size == 0:
        return out
    idx = np.where(np.isnan(out), 0, np.arange(out.shape[1])[None, :])
    np.maximum.accumulate(idx, axis=1, out=idx)
    return out[np.arange(out.shape[0])[:, None], idx]  # leading NaNs point at column 0: NaN


def progress_of(seq: np.ndarray) -> np.ndarray:
    """Communicator progress per bucket: min over ranks (rows) of the forward-filled seq;
    NaN while some rank has not reported yet and after the last bucket any rank reported
    in (the job is gone: that is downtime, not degradation)."""
    if seq.size == 0:
        return np.empty(0)
    out = forward_fill(seq).min(axis=0)
    seen = np.nonzero((~np.isnan(seq)).any(axis=0))[0]
    if seen.size:
        out[seen[-1] + 1:] = np.nan
    return out


def launch_ratio(progress: np.ndarray, bucket_s: float) -> tuple[np.ndarray, float | None]:
    """``(r, τ0)``: per bucket τ_i/τ0 (inf: no progress, nan: undefined) and τ0 in seconds."""
    n = len(progress)
    r = np.full(n, np.nan)
    if n < 2:
        return r, None
    delta = np.diff(progress)  # bucket i (1..n-1) completed delta[i-1] launches
    valid = ~np.isnan(delta)
    moving = valid & (delta > 0)
    if not moving.any():
        return r, None
    tau = np.full(n - 1, np.inf)
    tau[moving] = bucket_s / delta[moving]
    tau0 = normal_tau(tau[moving])
    first = int(np.argmax(moving))  # buckets before the first progress are start-up
    ok = valid & (np.arange(n - 1) >= first)
    r[1:][ok] = tau[ok] / tau0
    return r, tau0


def normal_tau(taus: np.ndarray) -> float:
    """Median of the fastest mode: τ within 10% of the 5th percentile."""
    fast = float(np.percentile(taus, 5))
    return float(np.median(taus[taus <= fast * 1.1]))


def measure(job: str, seqs: Mapping[str, np.ndarray], bucket_s: float, t0: float = 0.0,
            op: str = "") -> Degradation:
    """The §5 measure of one job from its pacing communicators' seq arrays
    (comm -> ranks × buckets, NaN where a rank sent nothing in a bucket)."""
    ratios, taus = [], []
    for comm in sorted(seqs):
        r, tau0 = launch_ratio(progress_of(seqs[comm]), bucket_s)
        if tau0 is not None:
            ratios.append(r)
            taus.append(tau0)
    if not ratios:
        return Degradation(job, None, bucket_s=bucket_s, t0=t0, comms=sorted(seqs), op=op)
    stack = np.vstack(ratios)
    defined = ~np.isnan(stack)
    worst = np.where(defined, stack, -np.inf).max(axis=0)
    worst[~defined.any(axis=0)] = np.nan
    running = ~np.isnan(worst)
    with np.errstate(divide="ignore", invalid="ignore"):
        lost = np.where(running, bucket_s * np.maximum(0.0, 1.0 - SLOW_FACTOR / worst), 0.0)
    run_s = float(running.sum() * bucket_s)
    return Degradation(
        job=job, fraction=(float(lost.sum()) / run_s) if run_s > 0 else None,
        lost_s=float(lost.sum()), running_s=run_s,
        stalled_s=float((np.isinf(worst) & running).sum() * bucket_s),
        slow_buckets=int((running & (worst > SLOW_FACTOR)).sum()),
        normal_launch_s=float(np.median(taus)), bucket_s=bucket_s, t0=t0,
        ratio=[float(x) for x in worst], comms=sorted(seqs), op=op)


def pacing_comms(hosts_of: Mapping[str, set[str]], ops_of: Mapping[str, Sequence[str]]
                 ) -> list[str]:
    """The job's data-parallel communicators: those spanning the most hosts (more than one),
    preferring those with an AllReduce; all of them when none spans hosts."""
    if not hosts_of:
        return []
    multi = [c for c, hs in hosts_of.items() if len(hs) > 1]
    pool = multi or list(hosts_of)
    with_ar = [c for c in pool if "AllReduce" in ops_of.get(c, ())]
    pool = with_ar or pool
    widest = max(len(hosts_of[c]) for c in pool)
    return sorted(c for c in pool if len(hosts_of[c]) == widest)


def percent(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"
