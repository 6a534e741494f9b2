"""Classifier throughput on one core: ``python bench/classify.py [--quick]``.

The mix is what a training host's log stream looks like: mostly ordinary training output
(Megatron/DeepSpeed/HF progress lines, NCCL INFO chatter, kernel noise) with the real error
lines of ``tests/data/log_lines.jsonl`` mixed in at ``--error-share``. A trivial baseline,
``line.split()`` over the same lines, runs side by side so the figure can be compared across
machines. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from processors.core.log_classifier import classify  # noqa: E402

# Ordinary-output templates, shaped like the real `other` lines in the dataset.
TEMPLATES = (
    " iteration {i:>8}/  250000 | consumed samples: {s:>12} | elapsed time per iteration (ms): "
    "{ms:.1f} | learning rate: {lr:.3E} | global batch size:  1024 | lm loss: {loss:.6E} | "
    "loss scale: 1.0 | grad norm: {g:.3f} | number of skipped iterations:   0 | number of nan "
    "iterations:   0 |",
    "[2023-07-25 21:03:17,269] [INFO] [logging.py:96:log_dist] [Rank 0] step={i}, skipped=0, "
    "lr=[{lr:.6e}, {lr:.6e}], mom=[[0.9, 0.95], [0.9, 0.95]]",
    "[2022-03-11 02:06:58,985] [INFO] [timer.py:189:stop] 0/{i}, SamplesPerSec={ms:.6f}, "
    "MemAllocated=0.26GB, MaxMemAllocated=9.02GB",
    "{{'loss': {loss:.4f}, 'learning_rate': {lr:.6e}, 'epoch': {g:.2f}}}",
    "Epoch 0:   6%|██        | {i}/500150 [6:28:43<94:39:17,  1.37it/s, loss={loss:.3f}]",
    "node17-2:36754:36754 [6] NCCL INFO Channel {g2:02d}/0 : 0[0] -> 1[0] [send] via NET/IB/0",
    "hostname-test:983:1261 [3] NCCL INFO comm 0x557fe785f7a0 rank {g2} nranks 64 cudaDev 4 "
    "nvmlDev 4 busId 9b000 commId 0x5ae77eb5ea4ec1ee - Init COMPLETE",
    "[{t:.6f}] br-switch: port 6(eth5) entered forwarding state",
    "saving checkpoint at iteration {i} to /ckpt/iter_{i:07d}",
)


def make_lines(n: int, error_share: float, seed: int = 1) -> list[str]:
    rnd = random.Random(seed)
    errors = [json.loads(x)["line"] for x in
              (ROOT / "tests/data/log_lines.jsonl").read_text(encoding="utf-8").splitlines() if x]
    out = []
    for i in range(n):
        if rnd.random() < error_share:
            out.append(rnd.choice(errors))
        else:
            out.append(rnd.choice(TEMPLATES).format(
                i=i, s=i * 1024, ms=rnd.uniform(100, 90000), lr=rnd.uniform(1e-6, 1e-4),
                loss=rnd.uniform(1, 11), g=rnd.uniform(0, 2), g2=rnd.randrange(64),
                t=rnd.uniform(0, 1e6)))
    return out


def rate(fn, lines: list[str], repeats: int) -> float:
    best = 0.0
    for _ in range(repeats):
        t0 = time.process_time()  # CPU time of this process: one core, immune to neighbours
        for line in lines:
            fn(line)
        best = max(best, len(lines) / max(time.process_time() - t0, 1e-9))
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="50k lines x 3 repeats (a few seconds)")
    p.add_argument("--lines", type=int, default=300_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--error-share", type=float, default=0.05)
    a = p.parse_args(argv)
    n, reps = (50_000, 3) if a.quick else (a.lines, a.repeats)
    lines = make_lines(n, a.error_share)
    classify(lines[0])  # load the XID policy outside the timing
    ours = rate(classify, lines, reps)
    base = rate(str.split, lines, reps)
    print(f"lines: {n}  error share: {a.error_share:.0%}  repeats: {reps} (best of, CPU time)")
    print(f"classify:     {ours:>12,.0f} lines/s")
    print(f"line.split(): {base:>12,.0f} lines/s  (baseline, same lines)")
    print(f"ratio:        {ours / base:.3f}")
    print(json.dumps({"lines_per_s": round(ours), "baseline_split_lines_per_s": round(base),
                      "ratio": round(ours / base, 4), "lines": n, "error_share": a.error_share}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
