"""The one processing path that the Faust agents, the in-process engine and replay share.

    raw bytes ─► decode ─► job's detectors (observe, advance) ─► Diagnoses ─► guard ─► commands
        └─ WireError / detector crash ─► DeadLetter (raw bytes + reason), counted

Each input kind (logs, telemetry, ccl) has an :class:`InputProcessor` holding one set of
detectors per job. Each detector only ever sees its own topic's records, and its
event-time watermark is the newest ``ts`` of that topic for that job, so the output does
not depend on how the three topics interleave: live, replayed or read from a file, the
same records give the same diagnoses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from processors.core.base import Outputs, Rejection
from processors.core.job_clock import JobClock
from processors.settings import PipelineConfig
from schemas.codec import decode
from schemas.errors import WireError
from schemas.inventory import Inventory
from schemas.records import CCLRecord, DeadLetter, Diagnosis, LogRecord, TelemetryBatch
from schemas.topics import CCL, LOGS, TELEMETRY

INPUT_KINDS = ("logs", "telemetry", "ccl")
RECORD_TYPES: dict[str, type] = {"logs": LogRecord, "telemetry": TelemetryBatch, "ccl": CCLRecord}
TOPIC_KIND = {LOGS.name: "logs", TELEMETRY.name: "telemetry", CCL.name: "ccl"}


def input_kind(topic: str) -> str | None:
    """``aegis.logs`` (or a prefixed ``test-aegis.logs``) -> ``logs``; None if not an input."""
    if topic in TOPIC_KIND:
        return TOPIC_KIND[topic]
    for name, kind in TOPIC_KIND.items():
        if topic.endswith(name):
            return kind
    return None


def detector_names(kind: str) -> list[str]:
    """The detectors of one input kind, in the order each record passes through them."""
    return [name for name, _cls in _detector_types(kind)]


def _detector_types(kind: str) -> list[tuple[str, Any]]:
    """(name, class) of the detectors of one input kind, imported on first use."""
    if kind == "logs":
        from processors.core.decision_tree import DecisionTree

        return [("tree", DecisionTree)]
    if kind == "telemetry":
        from processors.core.telemetry_liveness import TelemetryLiveness
        from processors.core.zscore import ZScoreDetector

        return [("zscore", ZScoreDetector), ("liveness", TelemetryLiveness)]
    if kind == "ccl":
        from processors.core.alignment import AlignmentDetector
        from processors.core.tdn import TDNDetector

        return [("alignment", AlignmentDetector), ("tdn", TDNDetector)]
    raise ValueError(f"unknown input kind {kind!r}")


@dataclass(slots=True)
class Processed:
    """What one input message produced."""

    job: str | None = None
    diagnoses: list[Diagnosis] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    dead_letter: DeadLetter | None = None
    duplicate: bool = False


class InputProcessor:
    """All jobs' detectors for one input topic (Aegis Phase 1, §4.2, §5.1, §5.2)."""

    def __init__(self, kind: str, config: PipelineConfig | None = None,
                 inventory: Inventory | None = None,
                 load_state: Callable[[str], bytes | None] | None = None,
                 only: tuple[str, ...] | None = None) -> None:
        """``only`` (detector names, e.g. ``("tdn",)``) runs a subset: parallel replay."""
        if kind not in INPUT_KINDS:
            raise ValueError(f"unknown input kind {kind!r}")
        self.kind = kind
        self.record_type = RECORD_TYPES[kind]
        self.config = config or PipelineConfig()
        self.inventory = inventory
        self._types_cache: list[tuple[str, Any]] | None = None
        self._jobs: dict[str, dict[str, Any]] = {}
        self._watermark: dict[str, float] = {}
        self._clocks: dict[str, JobClock] = {}
        self._behind_s = self.config.section("input").ccl_behind_s
        self._load_state = load_state
        self._only = only
        self.counts = {"in": 0, "dead_letter": 0, "diagnoses": 0, "rejections": 0}

    # -- detectors per job -------------------------------------------------------------
    @property
    def _types(self) -> list[tuple[str, Any]]:
        if self._types_cache is None:
            types = _detector_types(self.kind)
            self._types_cache = [t for t in types if self._only is None or t[0] in self._only]
        return self._types_cache

    def _new(self, cls: Any, job: str) -> Any:
        return self.config.build(cls, job, self.inventory)

    def detectors(self, job: str) -> dict[str, Any]:
        dets = self._jobs.get(job)
        if dets is None:
            saved = self._load_state(job) if self._load_state else None
            dets = self.restore(job, saved) if saved else {n: self._new(c, job) for n, c in self._types}
            self._jobs[job] = dets
        return dets

    def jobs(self) -> list[str]:
        return sorted(self._jobs)

    # -- processing --------------------------------------------------------------------
    def handle(self, raw: bytes, *, topic: str = "", partition: int = 0, offset: int = -1) -> Processed:
        """Decode one message and run it through its job's detectors. Never raises."""
        self.counts["in"] += 1
        rec = decode(self.record_type, raw)
        if isinstance(rec, WireError):
            self.counts["dead_letter"] += 1
            return Processed(dead_letter=DeadLetter(topic, partition, offset, bytes(raw), str(rec)))
        job = rec.job or rec.host
        try:
            out = self.observe(job, rec)
        except Exception as e:  # a detector bug must not stop the worker (faust#315)
            self.counts["dead_letter"] += 1
            return Processed(job=job, dead_letter=DeadLetter(
                topic, partition, offset, bytes(raw),
                f"{self.kind} detector failed on job {job} host {rec.host}: "
                f"{type(e).__name__}: {e}", stage="process"))
        self.counts["diagnoses"] += len(out.diagnoses)
        self.counts["rejections"] += len(out.rejections)
        return Processed(job=job, diagnoses=out.diagnoses, rejections=out.rejections)

    def observe(self, job: str, rec: Any) -> Outputs:
        dets = self.detectors(job)
        clock = self._clocks.get(job)
        if clock is None:
            icfg = self.config.section("input")
            clock = self._clocks[job] = JobClock(icfg.max_future_s, icfg.lone_after_s)
        watermark = self._watermark.get(job)
        notices: list[Rejection] = []  # clock_skew: a restart, a re-timed record
        skewed = clock.restarts(rec.host, rec.ts, watermark)
        if skewed is not None and watermark is not None:
            dets = self._start_over(job)
            notices = [Rejection(self.kind, job, skewed, "clock_skew", (
                f"the job's first host set its clock to {watermark:.3f}, {watermark - rec.ts:.0f}s "
                f"ahead of host {rec.host}: the job's detectors start over at {rec.ts:.3f}"),
                watermark)]
            watermark = None
        skew = clock.check(rec.host, rec.ts, watermark)
        if skew and (watermark is None or not isinstance(rec, CCLRecord)):
            # a lone host far ahead must not move the job's clock (and blind the rest)
            return Outputs(rejections=[Rejection(self.kind, job, rec.host, "clock_skew", skew,
                                                 rec.ts)])
        if (not skew and watermark is not None and isinstance(rec, CCLRecord)
                and rec.ts < watermark - self._behind_s):
            # its host's clock stepped back, or its agent sends a backlog: refused as `late`
            # against each rank's last report, the live host looked silent during a hang
            skew = f"ts {rec.ts:.3f} is {watermark - rec.ts:.0f}s behind the job clock"
        if skew and watermark is not None:
            # a skewed host's counters still tell it reports (refused, it looked silent and
            # was isolated during another host's hang): taken at the job clock. Log lines and
            # telemetry are not: under a bulk load one partition runs minutes ahead of the
            # others, and re-timed lines delayed every XID diagnosis from 5 s to 30 s
            notices.append(Rejection(self.kind, job, rec.host, "clock_skew",
                                     f"{skew}; taken at the job clock {watermark:.3f}", rec.ts))
            rec = dataclasses.replace(rec, ts=watermark)
        now = max(self._watermark.get(job, 0.0), rec.ts)
        self._watermark[job] = now
        out = Outputs(rejections=notices)
        for det in dets.values():
            out.extend(det.observe(rec))
            out.extend(det.advance(now))
        return out

    def _start_over(self, job: str) -> dict[str, Any]:
        """The job's first host was far ahead of the others (JobClock.restarts): what its
        records built is dropped, and the job's detectors start over."""
        self._watermark.pop(job, None)
        dets = self._jobs[job] = {n: self._new(c, job) for n, c in self._types}
        return dets

    # -- state -------------------------------------------------------------------------
    def snapshot(self, job: str) -> bytes:
        """The job's detector state as msgpack bytes (for a Faust Table / changelog)."""
        dets = self._jobs.get(job, {})
        state = {"v": 1, "kind": self.kind, "watermark": self._watermark.get(job, 0.0),
                 "detectors": {n: d.snapshot() for n, d in dets.items()}}
        if job in self._clocks:
            state["clock"] = self._clocks[job].snapshot()
        return msgpack.packb(state, use_bin_type=True)

    def restore(self, job: str, data: bytes) -> dict[str, Any]:
        state = msgpack.unpackb(data, raw=False, strict_map_key=False)
        self._watermark[job] = float(state.get("watermark", 0.0))
        if isinstance(state.get("clock"), dict):
            icfg = self.config.section("input")
            self._clocks[job] = JobClock.restore(state["clock"], icfg.max_future_s,
                                                 icfg.lone_after_s)
        saved = state.get("detectors", {})
        dets: dict[str, Any] = {}
        for name, cls in self._types:
            if name in saved:
                dets[name] = self.config.restore(cls, saved[name], job, self.inventory)
            else:
                dets[name] = self._new(cls, job)
        return dets

    def flush(self, job: str) -> list[Diagnosis]:
        """End of input for one job: what its detectors that keep open windows emit when
        they close them (``flush()``), in detector order. Files only, never the live worker."""
        out: list[Diagnosis] = []
        for det in self.detectors(job).values():
            flush = getattr(det, "flush", None)
            if callable(flush):
                out.extend(flush().diagnoses)
        return out

    def forget(self, job: str) -> None:
        self._jobs.pop(job, None)
        self._watermark.pop(job, None)
        self._clocks.pop(job, None)
