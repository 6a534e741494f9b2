"""Wire records, version 1. Frozen dataclasses with explicit ``to_wire``/``from_wire``.

``to_wire`` gives plain dicts/lists (msgpack or JSON ready); ``from_wire`` validates and
raises a typed :class:`~schemas.errors.WireError` naming the record, field and value.
Field meanings and units: ``docs/wire-format.md``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from schemas import _fields as f
from schemas.errors import ValidationError, VersionError
from schemas.metrics import DEVICE_KINDS

SCHEMA_VERSION = 1
LOG_SOURCES = ("kernel", "training", "nccl", "agent", "dcgm")
DIAGNOSIS_KINDS = (
    "critical_error", "dist_error", "hang_compute", "hang_network", "slow_compute",
    "slow_network", "outlier", "config", "offline_needed", "systemic", "host_dark",
)
ACTIONS = (
    "isolate_host", "isolate_gpu", "restart_job", "run_netdiag", "run_offline_diag",
    "rollback_update",
)


def _version(rec: str, d: Mapping[str, Any]) -> int:
    v = d.get("v", SCHEMA_VERSION)
    if type(v) is not int or v != SCHEMA_VERSION:  # true == 1 and 1.0 == 1 are no versions
        raise VersionError(rec, v, (SCHEMA_VERSION,))
    return SCHEMA_VERSION


@dataclass(frozen=True, slots=True)
class DeviceGroup:
    """Samples of one device kind on one host: ``values[metric][i]`` belongs to ``ids[i]``."""

    ids: tuple[str, ...]
    values: Mapping[str, tuple[float, ...]]

    def to_wire(self) -> dict[str, Any]:
        return {"ids": list(self.ids), "values": {k: list(v) for k, v in self.values.items()}}

    @classmethod
    def from_wire(cls, kind: str, d: Any) -> DeviceGroup:
        rec = f"TelemetryBatch.devices[{kind}]"
        if not isinstance(d, Mapping):
            raise ValidationError(rec, "", d, "not a mapping")
        ids = f.str_list(rec, d, "ids")
        values = f.mapping(rec, d, "values")
        out: dict[str, tuple[float, ...]] = {}
        for metric, vals in values.items():
            if not isinstance(metric, str) or not isinstance(vals, list | tuple):
                raise ValidationError(rec, f"values.{metric}", vals, "not a list of numbers")
            if len(vals) != len(ids):
                raise ValidationError(rec, f"values.{metric}", vals,
                                      f"{len(vals)} values for {len(ids)} devices")
            for x in vals:
                if isinstance(x, bool) or not isinstance(x, int | float):
                    raise ValidationError(rec, f"values.{metric}", x, "not a number")
            out[metric] = tuple(float(x) for x in vals)
        return cls(ids, out)


@dataclass(frozen=True, slots=True)
class TelemetryBatch:
    """One host's samples at one event time (Aegis §5.1 metrics; catalogue in schemas.metrics).

    Values are not range-checked here: a NaN or a negative counter is rejected, with a
    reason, by the detector that reads it, so the rest of the batch still counts.
    """

    host: str
    ts: float
    devices: Mapping[str, DeviceGroup]
    job: str | None = None
    v: int = SCHEMA_VERSION

    @property
    def key(self) -> str:
        return self.job or self.host

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.v, "host": self.host, "job": self.job, "ts": self.ts,
                "devices": {k: g.to_wire() for k, g in self.devices.items()}}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> TelemetryBatch:
        r = "TelemetryBatch"
        v = _version(r, d)
        devs = f.mapping(r, d, "devices")
        groups = {}
        for kind, g in devs.items():
            if kind not in DEVICE_KINDS:
                raise ValidationError(r, "devices", kind, f"device kind not one of {DEVICE_KINDS}")
            groups[kind] = DeviceGroup.from_wire(kind, g)
        return cls(host=f.text(r, d, "host"), ts=f.number(r, d, "ts", minimum=0),
                   devices=groups, job=f.text(r, d, "job", optional=True), v=v)


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One raw log line from a host: kernel (kmsg), training stdout/stderr, NCCL, agent, DCGM."""

    host: str
    ts: float
    source: str
    line: str
    job: str | None = None
    v: int = SCHEMA_VERSION

    @property
    def key(self) -> str:
        return self.job or self.host

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.v, "host": self.host, "job": self.job, "ts": self.ts,
                "source": self.source, "line": self.line}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> LogRecord:
        r = "LogRecord"
        v = _version(r, d)
        return cls(host=f.text(r, d, "host"), ts=f.number(r, d, "ts", minimum=0),
                   source=f.choice(r, d, "source", LOG_SOURCES),
                   line=f.text(r, d, "line", max_len=65536), job=f.text(r, d, "job", optional=True),
                   v=v)


@dataclass(frozen=True, slots=True)
class OpCounters:
    """Aegis §4.2 and §5.2 counters of one collective kind on one rank, cumulative.

    cl: collectives launched; wr: network work requests posted; wc: completed;
    seq: which launch (1-based) ``td_us`` belongs to, 0 if none finished yet;
    td_us: that op's duration; n_us: mean completion latency of the last L=5 WRs.
    """

    op: str
    cl: int
    wr: int
    wc: int
    seq: int = 0
    td_us: float = 0.0
    n_us: float = 0.0

    def to_wire(self) -> list[Any]:
        return [self.op, self.cl, self.wr, self.wc, self.seq, self.td_us, self.n_us]

    @classmethod
    def from_wire(cls, d: Any) -> OpCounters:
        r = "CCLRecord.ranks.ops"
        if not isinstance(d, list | tuple) or len(d) != 7:
            raise ValidationError(r, "", d, "not a 7-item list [op, cl, wr, wc, seq, td_us, n_us]")
        named = dict(zip(("op", "cl", "wr", "wc", "seq", "td_us", "n_us"), d, strict=True))
        return cls(op=f.text(r, named, "op", max_len=32), cl=f.integer(r, named, "cl"),
                   wr=f.integer(r, named, "wr"), wc=f.integer(r, named, "wc"),
                   seq=f.integer(r, named, "seq"), td_us=f.number(r, named, "td_us", minimum=0),
                   n_us=f.number(r, named, "n_us", minimum=0))


@dataclass(frozen=True, slots=True)
class RankSnapshot:
    """One rank of one communicator on this host (Aegis §4.2 CL/WR/WC per GPU)."""

    comm: str  # communicator hash, 16 hex digits
    comm_size: int
    rank: int
    gpu: int  # local GPU index on the host, -1 when the plugin could not tell
    ops: tuple[OpCounters, ...]
    pending_peers: tuple[int, ...] = ()  # peer ranks with posted-but-uncompleted WRs
    last_event_ts: float = 0.0  # event time of this rank's latest profiler event

    @property
    def cl(self) -> int:
        return sum(o.cl for o in self.ops)

    @property
    def wr(self) -> int:
        return sum(o.wr for o in self.ops)

    @property
    def wc(self) -> int:
        return sum(o.wc for o in self.ops)

    def to_wire(self) -> dict[str, Any]:
        return {"comm": self.comm, "size": self.comm_size, "rank": self.rank, "gpu": self.gpu,
                "ops": [o.to_wire() for o in self.ops], "pending": list(self.pending_peers),
                "last": self.last_event_ts}

    @classmethod
    def from_wire(cls, d: Any) -> RankSnapshot:
        r = "CCLRecord.ranks"
        if not isinstance(d, Mapping):
            raise ValidationError(r, "", d, "not a mapping")
        size = f.integer(r, d, "size", minimum=1)
        rank = f.integer(r, d, "rank")
        if rank >= size:
            raise ValidationError(r, "rank", rank, f"not below communicator size {size}")
        pending = f.sequence(r, d, "pending", optional=True)
        for p in pending:
            if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < size:
                raise ValidationError(r, "pending", p, f"not a rank in [0, {size})")
        return cls(comm=f.text(r, d, "comm", max_len=64), comm_size=size, rank=rank,
                   gpu=f.integer(r, d, "gpu", minimum=-1),
                   ops=tuple(OpCounters.from_wire(o) for o in f.sequence(r, d, "ops")),
                   pending_peers=tuple(pending),
                   last_event_ts=f.number(r, d, "last", optional=True, minimum=0) or 0.0)


@dataclass(frozen=True, slots=True)
class CCLRecord:
    """All ranks on one host for one snapshot interval (the ccl_hooks plugin's counters)."""

    host: str
    ts: float  # snapshot time, event time in epoch seconds
    ranks: tuple[RankSnapshot, ...]
    job: str | None = None
    v: int = SCHEMA_VERSION

    @property
    def key(self) -> str:
        return self.job or self.host

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.v, "host": self.host, "job": self.job, "ts": self.ts,
                "ranks": [r.to_wire() for r in self.ranks]}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> CCLRecord:
        r = "CCLRecord"
        v = _version(r, d)
        return cls(host=f.text(r, d, "host"), ts=f.number(r, d, "ts", minimum=0),
                   ranks=tuple(RankSnapshot.from_wire(x) for x in f.sequence(r, d, "ranks")),
                   job=f.text(r, d, "job", optional=True), v=v)


@dataclass(frozen=True, slots=True)
class Culprits:
    """What a diagnosis blames: hosts ``h017``, GPUs ``h017/gpu3``, links ``h017/nic3<->tor-r3``."""

    hosts: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    links: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, list[str]]:
        return {"hosts": list(self.hosts), "gpus": list(self.gpus), "links": list(self.links)}

    @classmethod
    def from_wire(cls, d: Any) -> Culprits:
        r = "Diagnosis.culprits"
        if not isinstance(d, Mapping):
            raise ValidationError(r, "", d, "not a mapping")
        return cls(f.str_list(r, d, "hosts"), f.str_list(r, d, "gpus"), f.str_list(r, d, "links"))


def diagnosis_id(job: str, kind: str, culprits: Culprits, rule: str, anchor_ts: float) -> str:
    """Stable id from the evidence: the same finding always hashes to the same id."""
    key = "|".join((job, kind, rule, ",".join(sorted(culprits.hosts)),
                    ",".join(sorted(culprits.gpus)), ",".join(sorted(culprits.links)),
                    f"{anchor_ts:.3f}"))
    return hashlib.sha256(key.encode()).hexdigest()[:20]


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """A detector's finding. Facts, not decisions: the guard turns them into commands."""

    id: str
    job: str
    kind: str
    culprits: Culprits
    evidence: Mapping[str, Any]  # rule, values, thresholds, window_s, lines...
    confidence: float
    event_ts: float  # event time of the first evidence
    detected_ts: float  # event time at which the detector decided
    detector: str
    summary: str = ""
    v: int = SCHEMA_VERSION

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.v, "id": self.id, "job": self.job, "kind": self.kind,
                "culprits": self.culprits.to_wire(), "evidence": dict(self.evidence),
                "confidence": self.confidence, "event_ts": self.event_ts,
                "detected_ts": self.detected_ts, "detector": self.detector,
                "summary": self.summary}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> Diagnosis:
        r = "Diagnosis"
        v = _version(r, d)
        conf = f.number(r, d, "confidence", minimum=0)
        if conf > 1:
            raise ValidationError(r, "confidence", conf, "above 1")
        return cls(id=f.text(r, d, "id"), job=f.text(r, d, "job"),
                   kind=f.choice(r, d, "kind", DIAGNOSIS_KINDS),
                   culprits=Culprits.from_wire(f.req(r, d, "culprits")),
                   evidence=f.mapping(r, d, "evidence"), confidence=conf,
                   event_ts=f.number(r, d, "event_ts", minimum=0),
                   detected_ts=f.number(r, d, "detected_ts", minimum=0),
                   detector=f.text(r, d, "detector"),
                   summary=f.text(r, d, "summary", optional=True, max_len=4096) or "", v=v)


@dataclass(frozen=True, slots=True)
class IsolationCommand:
    """A decision for remediation consumers. ``id`` = diagnosis id + action + target."""

    id: str
    job: str
    action: str
    target: str
    reason: str
    diagnosis_id: str
    issued_at: float  # event time of the deciding diagnosis, so replays are identical
    v: int = SCHEMA_VERSION

    @staticmethod
    def make_id(diagnosis_id: str, action: str, target: str) -> str:
        return f"{diagnosis_id}:{action}:{target}"

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.v, "id": self.id, "job": self.job, "action": self.action,
                "target": self.target, "reason": self.reason,
                "diagnosis_id": self.diagnosis_id, "issued_at": self.issued_at}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> IsolationCommand:
        r = "IsolationCommand"
        v = _version(r, d)
        return cls(id=f.text(r, d, "id", max_len=512), job=f.text(r, d, "job"),
                   action=f.choice(r, d, "action", ACTIONS), target=f.text(r, d, "target"),
                   reason=f.text(r, d, "reason", max_len=4096),
                   diagnosis_id=f.text(r, d, "diagnosis_id"),
                   issued_at=f.number(r, d, "issued_at", minimum=0), v=v)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Input that could not be processed: where it came from, its raw bytes and why."""

    topic: str
    partition: int
    offset: int
    raw: bytes
    error: str
    stage: str = "decode"  # decode | process | sink
    v: int = SCHEMA_VERSION
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        import base64

        return {"v": self.v, "topic": self.topic, "partition": self.partition,
                "offset": self.offset, "raw_b64": base64.b64encode(self.raw).decode(),
                "error": self.error, "stage": self.stage, "extra": dict(self.extra)}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> DeadLetter:
        import base64
        import binascii

        r = "DeadLetter"
        v = _version(r, d)
        try:
            raw = base64.b64decode(d.get("raw_b64", ""), validate=True)
        except (binascii.Error, ValueError, TypeError) as e:
            raise ValidationError(r, "raw_b64", d.get("raw_b64"), f"not base64: {e}") from e
        return cls(topic=f.text(r, d, "topic"), partition=f.integer(r, d, "partition", minimum=-1),
                   offset=f.integer(r, d, "offset", minimum=-1001), raw=raw,
                   error=f.text(r, d, "error", max_len=4096), stage=f.text(r, d, "stage"),
                   v=v, extra=f.mapping(r, d, "extra", optional=True))
