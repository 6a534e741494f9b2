"""The clock a Phase 1 burst is judged by, split from :mod:`processors.core.decision_tree`.

A burst of Aegis Algorithm 1 is judged ``settle_s`` after its first trigger, so that every
host's lines of the failure are in (docs/phase1.md). The tree's watermark is the newest log line of the job, so a trigger that
arrives when the watermark is already ``settle_s`` past it would be judged at once, before
the lines that follow it: one host whose clock runs a minute ahead (or one partition of the
logs topic that runs ahead under a bulk load) makes every other host's line late by that
much. An XID 48 was then judged without its host's CUDA ECC line 0.8 s after it, and only
the GPU was isolated, not the host.

Such a burst keeps the lead the watermark had over its trigger when it arrived, and is judged
by ``max(behind, watermark - lead)``: the newest line from the stream the trigger came in
(lines nearer its time than the watermark's), or the watermark moved on by the same lead.
A burst whose trigger arrived in time (the usual case) is judged by the watermark itself.
Pure and serialisable, part of the tree's checkpointed state.
"""

from __future__ import annotations

from typing import Any


class BurstClock:
    """``join`` each trigger, ``note`` every line, ``now`` to judge, ``close`` after."""

    def __init__(self) -> None:
        self.lead: float | None = None  # how far the watermark was ahead of a late trigger
        self.behind = 0.0  # the newest line since then from the trigger's own stream

    def join(self, trigger_ts: float, watermark: float, settle_s: float) -> None:
        """A trigger of the burst at ``trigger_ts``: late if the watermark was already past
        its settle time, and later still if it is further behind than the burst's first (a
        host stepped ahead opened the burst, the others' lines came after it)."""
        lead = watermark - trigger_ts
        if lead >= settle_s > 0 and (self.lead is None or lead > self.lead):
            self.lead, self.behind = lead, trigger_ts

    def note(self, ts: float, watermark: float) -> None:
        """A line at ``ts``, before it moves the watermark: it belongs to the late trigger's
        stream when it is nearer the trigger's time than the watermark's."""
        if self.lead is not None and ts < watermark - self.lead / 2 and ts > self.behind:
            self.behind = ts

    def now(self, watermark: float) -> float:
        """The time the burst is judged by."""
        if self.lead is None:
            return watermark
        return max(self.behind, watermark - self.lead)

    def close(self) -> None:
        self.lead, self.behind = None, 0.0

    def snapshot(self) -> list[float] | None:
        return None if self.lead is None else [self.lead, self.behind]

    @classmethod
    def restore(cls, state: Any) -> BurstClock:
        c = cls()
        if state:
            c.lead, c.behind = float(state[0]), float(state[1])
        return c
