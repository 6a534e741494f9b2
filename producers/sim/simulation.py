"""Run a simulated cluster and emit its records in event-time order, with ground truth.

``Simulation(config).run(sink)`` sends every record to ``sink.emit(topic, key, ts, record)``
(or, faster, ``sink.emit_encoded(topic, key, ts, value_bytes)`` when the sink has it);
``iter_records()`` / ``iter_encoded()`` yield the same stream. Runs are deterministic for a
seed: event time starts at ``start_ts`` and advances one interval per tick; the wall clock
only paces output when ``speed`` > 0.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from operator import itemgetter
from typing import Any, Protocol

import numpy as np

from producers.sim.fault_base import Ctx, Fault
from producers.sim.faults import CATALOGUE
from producers.sim.heartbeat import Heartbeats
from producers.sim.noise import NoiseLogs
from producers.sim.render import LOGS, Encoded, Renderer
from producers.sim.scenarios import HEALTHY, MIXED, SCENARIOS
from producers.sim.schedule import plan_faults
from producers.sim.state import LogQueue
from producers.sim.topology import IP_SITES, build_topology
from producers.sim.workload import Workload
from schemas import codec
from schemas.codec import Record
from schemas.errors import ConfigError
from schemas.inventory import Inventory
from schemas.records import CCLRecord, LogRecord, TelemetryBatch
from schemas.topics import CCL, TELEMETRY

DEFAULT_EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z
TRUTH_FORMAT = "aegis-truth"
_TOPIC, _VALUE = itemgetter(0), itemgetter(3)
_RECORD_TYPES: dict[str, type] = {TELEMETRY.name: TelemetryBatch, CCL.name: CCLRecord,
                                  LOGS: LogRecord}
_PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class Sink(Protocol):
    """Any of: ``emit_encoded_batch(list)``, ``emit_encoded(topic, key, ts, bytes)`` (the
    recording writer, the Kafka sink) or ``emit(topic, key, ts, record)``; ``flush()`` is
    called at the end when present."""

    def __getattr__(self, name: str) -> Any: ...


@dataclass
class SimConfig:
    hosts: int = 16
    hosts_per_job: int | None = 8  # None: one job over every host
    scenario: str = HEALTHY
    seed: int = 0
    duration_s: float = 900.0
    start_ts: float = DEFAULT_EPOCH
    speed: float = 0.0  # 1.0 = real time; 0 = as fast as possible
    fault_at_s: float = 120.0  # rounded to the tick grid
    fault_job: int | None = None  # None: a seeded choice among the jobs that fit
    interval_s: float = 1.0  # telemetry and CCL snapshot interval
    pp: int = 1
    hosts_per_pod: int = 32
    init_s: float = 10.0
    watchdog_s: float = 120.0  # PyTorch NCCL timeout after a hang
    ib_timeout_s: float = 20.0  # IB retry exhaustion after a peer process dies
    mixed_faults: int | None = None  # None: as many as fit in time and jobs
    mixed_spacing_s: float = 90.0
    mixed_scenarios: tuple[str, ...] | None = None  # None: the whole catalogue
    mixed_cover_all: bool = False  # the first faults cover every allowed scenario once
    noise_logs: bool = True
    heartbeat_s: float = 5.0  # agent heartbeat period per host; 0 = none
    name_prefix: str = ""  # starts every host, job and switch name (and communicator ids)
    ip_site: int | None = None  # address block 0..2047; None: derived from name_prefix

    def validate(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ConfigError(f"scenario {self.scenario!r} unknown; valid: {', '.join(SCENARIOS)}")
        if self.hosts < 1 or (self.hosts_per_job is not None and self.hosts_per_job < 1):
            raise ConfigError(f"hosts={self.hosts} hosts_per_job={self.hosts_per_job}: need >= 1")
        if self.duration_s < self.interval_s or self.interval_s <= 0:
            raise ConfigError(f"duration_s={self.duration_s} interval_s={self.interval_s} invalid")
        if self.hosts_per_pod < 1:
            raise ConfigError(f"hosts_per_pod={self.hosts_per_pod}: need >= 1")
        if self.speed < 0:
            raise ConfigError(f"speed={self.speed}: must be >= 0")
        if self.scenario not in (HEALTHY, "config_error") and not 0 <= self.fault_at_s < self.duration_s:
            raise ConfigError(f"fault_at_s={self.fault_at_s} outside the run (0..{self.duration_s})")
        if self.heartbeat_s < 0 or self.mixed_spacing_s < 0:
            raise ConfigError(f"heartbeat_s={self.heartbeat_s} mixed_spacing_s="
                              f"{self.mixed_spacing_s}: must be >= 0")
        if self.name_prefix and not _PREFIX_RE.fullmatch(self.name_prefix):
            raise ConfigError(f"name_prefix={self.name_prefix!r}: letters, digits, '.', '_' "
                              "and '-' only, starting with a letter or digit")
        if self.ip_site is not None and not 0 <= self.ip_site < IP_SITES:
            raise ConfigError(f"ip_site={self.ip_site}: must be in 0..{IP_SITES - 1}")
        if self.mixed_scenarios is not None:
            self.mixed_scenarios = tuple(self.mixed_scenarios)
            bad = [s for s in self.mixed_scenarios if s not in CATALOGUE]
            if bad or not self.mixed_scenarios:
                raise ConfigError(f"mixed_scenarios {bad or '()'}: choose among "
                                  f"{', '.join(CATALOGUE)}")


@dataclass
class SimResult:
    truth: list[dict[str, Any]]
    inventory: Inventory
    records: int = 0
    bytes: int = 0
    by_topic: dict[str, int] = field(default_factory=dict)
    sim_s: float = 0.0
    wall_s: float = 0.0


class Simulation:
    def __init__(self, config: SimConfig) -> None:
        config.validate()
        self.config = config
        self.topo = build_topology(config.hosts, config.hosts_per_job, config.pp,
                                   config.hosts_per_pod, name_prefix=config.name_prefix,
                                   ip_site=config.ip_site)
        self.inventory = self.topo.to_inventory()
        self.truth = _Run(self, noise=False).truth()  # a fresh run schedules the same faults

    @property
    def end_ts(self) -> float:
        return self.config.start_ts + self.n_ticks * self.config.interval_s

    @property
    def n_ticks(self) -> int:
        return int(round(self.config.duration_s / self.config.interval_s))

    def header_meta(self) -> dict[str, Any]:
        """Recording header meta: generator, config and inventory (never the truth)."""
        return {"generator": "aegis-sim", "scenario": self.config.scenario,
                "seed": self.config.seed, "config": asdict(self.config),
                "start_ts": self.config.start_ts, "end_ts": self.end_ts,
                "inventory": self.inventory.to_wire()}

    def truth_doc(self) -> dict[str, Any]:
        return {"format": TRUTH_FORMAT, "v": 1, "scenario": self.config.scenario,
                "seed": self.config.seed, "start_ts": self.config.start_ts,
                "end_ts": self.end_ts, "faults": self.truth}

    def iter_batches(self, progress: Callable[[float, float], None] | None = None
                     ) -> Iterator[list[Encoded]]:
        """One list per tick: its telemetry, CCL and log records, in event-time order."""
        return _Run(self).batches(progress)

    def iter_encoded(self, progress: Callable[[float, float], None] | None = None
                     ) -> Iterator[Encoded]:
        """(topic, key, ts, value_bytes) in event-time order; bytes as codec.encode makes them."""
        for batch in self.iter_batches(progress):
            yield from batch

    def iter_records(self) -> Iterator[tuple[str, str, float, Record]]:
        """(topic, key, ts, record) in event-time order, decoded from the encoded stream."""
        for topic, key, ts, value in self.iter_encoded():
            yield topic, key, ts, codec.decode_or_raise(_RECORD_TYPES[topic], value)

    def run(self, sink: Sink | Any, progress: Callable[[float, float], None] | None = None
            ) -> SimResult:
        """Send every record to ``sink``: ``emit_encoded_batch(list)`` per tick when the sink
        has it, else ``emit_encoded(topic, key, ts, bytes)``, else ``emit(..., record)``."""
        cfg = self.config
        batch_fn = getattr(sink, "emit_encoded_batch", None)
        fast = getattr(sink, "emit_encoded", None)
        res = SimResult(truth=self.truth, inventory=self.inventory)
        counts: Counter[str] = Counter()
        wall0 = time.monotonic()
        for batch in self.iter_batches(progress):
            if not batch:
                continue
            if cfg.speed > 0:  # pace output: event time advances at `speed` x wall time
                ahead = (batch[0][2] - cfg.start_ts) / cfg.speed - (time.monotonic() - wall0)
                if ahead > 0:
                    time.sleep(ahead)
            if batch_fn is not None:
                batch_fn(batch)
            elif fast is not None:
                for topic, key, ts, value in batch:
                    fast(topic, key, ts, value)
            else:
                emit = sink.emit
                for topic, key, ts, value in batch:
                    emit(topic, key, ts, codec.decode_or_raise(_RECORD_TYPES[topic], value))
            res.records += len(batch)
            res.bytes += sum(map(len, map(_VALUE, batch)))
            counts.update(map(_TOPIC, batch))
        flush = getattr(sink, "flush", None)
        if callable(flush):
            flush()
        res.by_topic = dict(counts)
        res.sim_s = self.end_ts - cfg.start_ts
        res.wall_s = time.monotonic() - wall0
        return res


class _Run:
    """One pass over the simulation: fresh state from the seed, faults scheduled up front."""

    def __init__(self, sim: Simulation, noise: bool = True) -> None:
        cfg, topo = sim.config, sim.topo
        self.sim, self.cfg, self.topo = sim, cfg, topo
        ss = np.random.SeedSequence(cfg.seed)
        w_rng, f_rng, n_rng = (np.random.default_rng(s) for s in ss.spawn(3))
        self.work = Workload(topo, w_rng, cfg.start_ts, cfg.init_s)
        self.logs = LogQueue()
        self.ctx = Ctx(topo, self.work, self.logs, cfg.start_ts, sim.end_ts, cfg.watchdog_s,
                       cfg.ib_timeout_s)
        self.faults = self._schedule(f_rng)
        for f in self.faults:
            f.setup()
        self.noise = NoiseLogs(self.ctx, n_rng) if cfg.noise_logs and noise else None
        if self.noise:
            self.noise.startup()
        self.heartbeats = (Heartbeats(len(topo.hosts), cfg.start_ts, cfg.heartbeat_s)
                           if cfg.heartbeat_s > 0 and noise else None)

    def truth(self) -> list[dict[str, Any]]:
        return [f.truth() for f in self.faults]

    def _schedule(self, rng: np.random.Generator) -> list[Fault]:
        cfg = self.cfg
        if cfg.scenario == HEALTHY:
            return []
        single = None if cfg.scenario == MIXED else cfg.scenario
        slots = plan_faults(cfg, self.topo, rng, single)
        return [self._make(k, s.scenario, s.job, s.start_ts, rng) for k, s in enumerate(slots)]

    def _make(self, k: int, name: str, job: int, at: float, rng: np.random.Generator) -> Fault:
        seed = int(rng.integers(1 << 63))
        fid = f"f{k:02d}-{name}-{self.topo.jobs[job].name}"
        return CATALOGUE[name](self.ctx, fid, job, at, np.random.default_rng(seed))

    def batches(self, progress: Callable[[float, float], None] | None
                ) -> Iterator[list[Encoded]]:
        cfg, work = self.cfg, self.work
        renderer = Renderer(self.topo)
        dt = cfg.interval_s
        total = self.sim.end_ts - cfg.start_ts
        jobs = [j.name for j in self.topo.jobs]
        names = [h.name for h in self.topo.hosts]
        host_job = self.topo.host_job
        for i in range(self.sim.n_ticks):
            t = cfg.start_ts + i * dt
            self.ctx.now = t
            work.reset_job_modifiers()
            for f in self.faults:
                f.before(t)
            work.advance_jobs(t, dt)
            if self.noise:
                self.noise.iteration_lines(t)
            a = work.generate(t)
            for f in self.faults:
                f.after(a)
            work.commit(a)
            batch = renderer.render(a)
            if self.heartbeats:
                self.heartbeats.schedule(t + dt, self.logs)
            for ll in self.logs.pop_before(t + dt):
                j = host_job[ll.host]
                rec = LogRecord(names[ll.host], ll.ts, ll.source, ll.line,
                                jobs[j] if j >= 0 else None)
                batch.append((LOGS, rec.key, rec.ts, codec.encode(rec)))
            yield batch
            if progress is not None:
                progress(t + dt - cfg.start_ts, total)
