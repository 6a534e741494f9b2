"""Agents mode: the coordinator publishes one CBD request per host on the agents' command
topic; each host agent runs its part and publishes its result; the coordinator judges.

Topics (JSON values):
- ``aegis.agent-commands`` (key = host): :class:`CbdRequest` (``type = "cbd_request"``);
- ``aegis.cbd-results`` (key = batch): :class:`CbdHostResult` (``type = "cbd_host_result"``).

Timeline of a request (epoch seconds, so agents need no further coordination):
``start_at`` every agent's probe responder is up (agents start it on receipt); the loss
phase runs from ``start_at``; the bandwidth rounds from ``start_at + loss_budget``; the
ring all-reduce from the end of the rounds; then the single-host checks. Configuration
checks are judged by the coordinator over every host's facts. :func:`schedule` computes
the timeline the same way on both sides.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from producers.cbd import analysis as an
from producers.cbd import profiles
from producers.cbd.checks_multi import (
    MeshParams,
    ProbeMeshCheck,
    judge_mesh,
    path_mtu,
    run_bandwidth,
    run_loss,
    schedules,
    start_responder,
)
from producers.cbd.collective import CollectiveCheck, RingParams, judge_ring
from producers.cbd.config import CbdConfig
from producers.cbd.model import ERROR, BatchReport, CheckContext, CheckResult
from producers.cbd.runner import collect_facts, run_host_checks
from producers.cbd.targets import HostSpec, HostTarget, LocalTarget, stop
from producers.cbd.verdict import decide

AGENT_COMMANDS_TOPIC = "aegis.agent-commands"  # schemas.topics.AGENT_COMMANDS
CBD_RESULTS_TOPIC = "aegis.cbd-results"
VERSION = 1


class Bus(Protocol):
    """The two calls CBD needs from a message bus (Kafka in production)."""

    def publish(self, topic: str, key: str, value: bytes) -> None: ...

    def poll(self, topic: str, group: str, timeout_s: float) -> list[tuple[str, bytes]]: ...


class InMemoryBus:
    """Each consumer group reads every message of a topic once, in order."""

    def __init__(self) -> None:
        self.topics: dict[str, list[tuple[str, bytes]]] = {}
        self.offsets: dict[tuple[str, str], int] = {}
        self.cv = threading.Condition()

    def publish(self, topic: str, key: str, value: bytes) -> None:
        with self.cv:
            self.topics.setdefault(topic, []).append((key, value))
            self.cv.notify_all()

    def poll(self, topic: str, group: str, timeout_s: float) -> list[tuple[str, bytes]]:
        end = time.monotonic() + timeout_s
        with self.cv:
            while True:
                msgs = self.topics.get(topic, [])
                off = self.offsets.get((topic, group), 0)
                if off < len(msgs) or (left := end - time.monotonic()) <= 0:
                    self.offsets[(topic, group)] = len(msgs)
                    return msgs[off:]
                self.cv.wait(left)


@dataclass(frozen=True)
class CbdRequest:
    id: str
    batch: str
    profile: str
    hosts: tuple[dict[str, Any], ...]  # [{"name", "addr", "port"}] in ring order
    issued_ts: float
    start_at: float
    config: dict[str, Any] = field(default_factory=dict)
    only: tuple[str, ...] = ()  # run only these checks (empty: the whole profile)
    v: int = VERSION

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.v, "type": "cbd_request", "id": self.id, "batch": self.batch,
                "profile": self.profile, "hosts": [dict(h) for h in self.hosts],
                "issued_ts": self.issued_ts, "start_at": self.start_at, "config": self.config,
                "only": list(self.only)}

    def suite(self) -> profiles.Profile:
        prof = profiles.get(self.profile)
        return prof.only(self.only) if self.only else prof

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> CbdRequest:
        if d.get("type") != "cbd_request" or d.get("v") != VERSION:
            raise ValueError(f"not a v{VERSION} cbd_request: {str(d)[:120]}")
        hosts = d.get("hosts")
        if not isinstance(hosts, list) or not all(
                isinstance(h, Mapping) and {"name", "addr", "port"} <= set(h) for h in hosts):
            raise ValueError("cbd_request.hosts: needs [{name, addr, port}]")
        return cls(str(d["id"]), str(d["batch"]), str(d["profile"]),
                   tuple(dict(h) for h in hosts), float(d["issued_ts"]), float(d["start_at"]),
                   dict(d.get("config") or {}), tuple(str(x) for x in d.get("only") or ()))

    @property
    def names(self) -> list[str]:
        return [str(h["name"]) for h in self.hosts]


@dataclass
class CbdHostResult:
    request_id: str
    batch: str
    host: str
    facts: dict[str, Any] | None
    results: list[dict[str, Any]]  # CheckResult.to_wire() of the single-host checks
    loss: dict[str, Any] | None = None
    bandwidth: dict[str, Any] | None = None
    ring: dict[str, Any] | None = None
    started_ts: float = 0.0
    finished_ts: float = 0.0
    error: str = ""
    v: int = VERSION

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.v, "type": "cbd_host_result", **{
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "v"}}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> CbdHostResult:
        if d.get("type") != "cbd_host_result" or d.get("v") != VERSION:
            raise ValueError(f"not a v{VERSION} cbd_host_result: {str(d)[:120]}")
        names = {f.name for f in dataclasses.fields(cls)} - {"v"}
        return cls(**{k: d[k] for k in names if k in d})


@dataclass(frozen=True)
class Schedule:
    loss_at: float
    bandwidth_at: float
    ring_at: float
    end_at: float


def _multi(profile: profiles.Profile) -> tuple[MeshParams, RingParams]:
    mesh = next((c.params for c in profile.batch_checks if isinstance(c, ProbeMeshCheck)),
                MeshParams())
    ring = next((c.ring for c in profile.batch_checks if isinstance(c, CollectiveCheck)),
                RingParams())
    return mesh, ring


def schedule(req: CbdRequest, profile: profiles.Profile) -> Schedule:
    mesh, ring = _multi(profile)
    names = req.names
    cfg = CbdConfig.from_mapping(req.config)
    pairs = an.probe_pairs(names, cfg.full_mesh_max)
    peers = max((len(v) for v in an.assign_probers(pairs).values()), default=0)
    rounds = an.bandwidth_rounds(names, pairs if mesh.bw_pairs == "mesh" else an.ring_pairs(names))
    bw_at = req.start_at + mesh.loss_budget_s(peers)
    ring_at = bw_at + len(rounds) * mesh.slot_s + 1.0
    return Schedule(req.start_at, bw_at, ring_at,
                    ring_at + ring.timeout_s * 2 + ring.link_cap_s * 3)


def make_request(batch: str, profile: str, hosts: Sequence[HostSpec], config: CbdConfig,
                 now: float, lead_s: float = 5.0, port: int = 29400,
                 only: Sequence[str] = ()) -> CbdRequest:
    missing = [h.name for h in hosts if not h.addr]
    if missing:
        raise ValueError(f"agents mode needs an addr for every host; missing: {missing}")
    return CbdRequest(uuid.uuid4().hex[:16], batch, profile,
                      tuple({"name": h.name, "addr": h.addr, "port": h.port or port}
                            for h in hosts), now, now + lead_s, dataclasses.asdict(config),
                      tuple(only))


def run_cbd_request(req: CbdRequest, host: str, target: HostTarget | None = None,
                    clock: Callable[[], float] = time.time) -> CbdHostResult | None:
    """The agent's part of a request (None when ``host`` is not in it): facts, responder,
    the timed network phases, then the single-host checks."""
    if host not in req.names:
        return None
    started = clock()
    cfg = CbdConfig.from_mapping(req.config)
    prof = req.suite()
    target = target or LocalTarget(HostSpec(host, "local"), cfg.python)
    addrs = {str(h["name"]): str(h["addr"]) for h in req.hosts}
    ports = {str(h["name"]): int(h["port"]) for h in req.hosts}
    facts, why = collect_facts(target, cfg, prof.stage_budget_s["facts"])
    if facts is None:
        return CbdHostResult(req.id, req.batch, host, None, [], started_ts=started,
                             finished_ts=clock(), error=why)
    ctx = CheckContext(req.batch, req.names, addrs, {host: facts}, cfg, ports=ports)
    out = CbdHostResult(req.id, req.batch, host, facts, [], started_ts=started)
    names = {c.name for c in prof.batch_checks}
    sched = schedule(req, prof)
    mesh, ring = _multi(prof)
    if "probe_mesh" in names or "collective" in names:
        proc = None
        try:
            proc = start_responder(target, ports[host], sched.end_at - clock() + 10)
            pairs = an.probe_pairs(req.names, cfg.full_mesh_max)
            mine = an.assign_probers(pairs).get(host, [])
            time.sleep(max(0.0, sched.loss_at - clock()))
            if "probe_mesh" in names:
                out.loss = run_loss(target, host, [(d, addrs[d], ports[d],
                                                    path_mtu(ctx, host, d)) for d in mine], mesh)
                bw_pairs = pairs if mesh.bw_pairs == "mesh" else an.ring_pairs(req.names)
                sched_bw = schedules(an.bandwidth_rounds(req.names, bw_pairs), addrs, ports)
                out.bandwidth = run_bandwidth(target, host, sched_bw.get(host, []),
                                              sched.bandwidth_at, mesh)
            if "collective" in names:
                time.sleep(max(0.0, sched.ring_at - clock()))
                peers = [f"{addrs[n]}:{ports[n] + 1}" for n in req.names]
                r = target.run(target.module_argv("producers.cbd.ring", *ring.argv(
                    req.names.index(host), peers)), ring.timeout_s * 2 + ring.link_cap_s * 3 + 5)
                try:
                    out.ring = dict(json.loads(r.stdout))
                except ValueError:
                    out.ring = {"error": f"ring rc={r.rc}: {r.stderr[-300:]}"}
        except RuntimeError as e:
            out.error = str(e)
        finally:
            if proc is not None:
                stop(proc)
    res = run_host_checks(prof.host_checks, target, ctx,
                           clock() + prof.stage_budget_s["single_host"])
    out.results = [r.to_wire() for r in res.values()]
    out.finished_ts = clock()
    return out


def serve_requests(bus: Bus, host: str, stop_event: threading.Event,
                   target: HostTarget | None = None, poll_s: float = 1.0) -> int:
    """Agent loop: run every request naming ``host``; returns how many it answered."""
    done = 0
    while not stop_event.is_set():
        for key, value in bus.poll(AGENT_COMMANDS_TOPIC, f"cbd-agent-{host}", poll_s):
            if key != host:
                continue
            try:
                req = CbdRequest.from_wire(json.loads(value))
            except ValueError:
                continue
            res = run_cbd_request(req, host, target)
            if res is not None:
                bus.publish(CBD_RESULTS_TOPIC, req.batch, json.dumps(res.to_wire()).encode())
                done += 1
    return done


def publish_request(bus: Bus, req: CbdRequest) -> None:
    value = json.dumps(req.to_wire()).encode()
    for name in req.names:
        bus.publish(AGENT_COMMANDS_TOPIC, name, value)


def gather_results(bus: Bus, req: CbdRequest, timeout_s: float,
                   group: str = "cbd-coordinator") -> dict[str, CbdHostResult]:
    end = time.monotonic() + timeout_s
    got: dict[str, CbdHostResult] = {}
    while len(got) < len(req.hosts) and (left := end - time.monotonic()) > 0:
        for _, value in bus.poll(CBD_RESULTS_TOPIC, group, min(left, 1.0)):
            try:
                r = CbdHostResult.from_wire(json.loads(value))
            except (ValueError, TypeError):
                continue
            if r.request_id == req.id and r.host in req.names:
                got[r.host] = r
    return got


def judge_request(req: CbdRequest, got: Mapping[str, CbdHostResult],
                  baseline: Mapping[str, float] | None = None,
                  finished_ts: float | None = None) -> BatchReport:
    """The coordinator's verdict over the agents' results (same rules as direct mode)."""
    cfg = CbdConfig.from_mapping(req.config)
    prof = req.suite()
    names = req.names
    facts = {h: r.facts for h, r in got.items() if r.facts}
    ctx = CheckContext(req.batch, names, {str(h["name"]): str(h["addr"]) for h in req.hosts},
                       facts, cfg, dict(baseline or {}),
                       ports={str(h["name"]): int(h["port"]) for h in req.hosts})
    live = [h for h in names if h in facts]
    results: dict[str, dict[str, CheckResult]] = {h: {} for h in names}
    for h in live:
        results[h].update({c.name: c.evaluate(h, ctx) for c in prof.config_checks})
        results[h].update({r["check"]: CheckResult.from_wire(r) for r in got[h].results})
    for c in prof.host_checks:
        have = {h: results[h][c.name] for h in live if c.name in results[h]}
        results.update({h: {**results[h], c.name: r} for h, r in c.compare(have, ctx).items()})
    checks = {c.name: c for c in prof.batch_checks}
    if "probe_mesh" in checks and len(live) >= 2:
        pairs = an.probe_pairs(names, cfg.full_mesh_max)
        loss = [lo for h in live if (lo := got[h].loss)]
        bw = [b for h in live if (b := got[h].bandwidth)]
        mesh = judge_mesh("probe_mesh", loss, bw, pairs, ctx)
        for h in live:
            results[h]["probe_mesh"] = mesh[h]
    if "collective" in checks and len(live) >= 2:
        ring = judge_ring("collective", {h: got[h].ring or {"error": got[h].error or "no ring"}
                                         for h in names if h in got}, names, ctx,
                          "agents mode runs the socket ring")
        for h in live:
            results[h]["collective"] = ring[h]
    for h in names:
        if h not in live:
            why = got[h].error if h in got else "no result from the host's agent"
            results[h] = {c.name: CheckResult(c.name, ERROR, why) for c in prof.all_checks()}
    kinds = {c.name: c.diagnosis_kind for c in prof.all_checks()}
    end = finished_ts if finished_ts is not None else max(
        [r.finished_ts for r in got.values()] or [req.issued_ts])
    return decide(req.batch, results, kinds, cfg, req.issued_ts, end, profile=req.profile,
                  mode="agents", wall_s=end - req.issued_ts, hosts=names)
