"""Multi-host checks (Aegis §6 CBD stage 3, "6 min: collective communication"; Alg. 1
OfflineDiag: probe with several packet sizes, the >1 KB silent-loss case).

- :class:`ProbeMeshCheck`: UDP and TCP echo probes of several sizes (64 B up to the path
  MTU) over every pair (or the planned pairs), then TCP bandwidth in rounds where each host
  meets one partner; per-link loss by size and rate, localised to a host.
- :class:`CollectiveCheck`: nccl-tests ``all_reduce_perf`` where installed, else the socket
  ring all-reduce (:mod:`producers.cbd.ring`); the evidence names the driver that ran.

The host side of each test is a function of (target, plan) so that an agent can run its
part of a request (agents mode); the judging is pure (:mod:`producers.cbd.analysis`).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from producers.cbd import analysis as an
from producers.cbd import facts_view as fv
from producers.cbd.collective import CollectiveCheck
from producers.cbd.model import ERROR, FAIL, PASS, CheckContext, CheckResult, na
from producers.cbd.targets import HostTarget, stop

__all__ = ["CollectiveCheck", "MeshParams", "ProbeMeshCheck", "start_responder",
           "run_loss", "run_bandwidth", "judge_mesh"]

DEFAULT_SIZES = (64, 256, 512, 1024, 1280, 4096, 8192)


@dataclass(frozen=True)
class MeshParams:
    sizes: tuple[int, ...] = DEFAULT_SIZES
    exact_sizes: bool = False  # True: probe exactly ``sizes`` (no path-MTU size added)
    udp_count: int = 20
    tcp_count: int = 3
    udp_timeout_s: float = 0.3
    tcp_timeout_s: float = 0.5
    bandwidth: bool = True
    bw_pairs: str = "ring"  # ring: partners 1 and 2 apart (few rounds); mesh: the probe pairs
    bw_cap_s: float = 0.3
    bw_cap_mb: int = 32

    @property
    def slot_s(self) -> float:
        return self.bw_cap_s * 2 + 0.3

    def loss_budget_s(self, peers: int) -> float:
        """Upper bound of one prober's loss phase (its peers run in parallel): per size, the
        UDP train plus its drain wait, and one TCP timeout (a stalled stream ends the size)."""
        per_size = self.udp_count * 0.002 + self.udp_timeout_s + self.tcp_timeout_s + 0.1
        return 2.0 + per_size * (len(self.sizes) + 1) + 0.05 * peers


def path_mtu(ctx: CheckContext, a: str, b: str) -> int | None:
    """The smaller MTU of the two data interfaces (the largest packet both ends send)."""
    mtus = []
    for h, other in ((a, b), (b, a)):
        f = ctx.facts.get(h)
        if not f:
            continue
        name = fv.data_iface(f, ctx.addrs.get(h), [ctx.addrs[other]] if other in ctx.addrs
                             else [])
        n = fv.iface(f, name)
        if n and isinstance(n.get("mtu"), int):
            mtus.append(n["mtu"])
    return min(mtus) if mtus else None


def start_responder(target: HostTarget, port: int, duration_s: float, wait_s: float = 10.0
                    ) -> subprocess.Popen[str]:
    """Start ``netprobe serve`` and wait for its ``ready``; returns the process."""
    proc = target.start(target.module_argv("producers.cbd.netprobe", "serve", "--port",
                                           str(port), "--duration", str(duration_s)))
    ready = threading.Event()

    def watch() -> None:
        if proc.stdout is not None and proc.stdout.readline().strip() == "ready":
            ready.set()

    threading.Thread(target=watch, daemon=True).start()
    if not ready.wait(wait_s):
        stop(proc)
        err = proc.stderr.read() if proc.stderr else ""
        raise RuntimeError(f"probe responder on {target.name} did not start: {err[-300:]}")
    return proc


def run_loss(target: HostTarget, src: str, peers: list[tuple[str, str, int, int | None]],
             p: MeshParams) -> dict[str, Any]:
    argv = ["loss", "--src", src, "--peers",
            *(f"{n}={a}:{port}:{mtu or ''}" for n, a, port, mtu in peers),
            "--sizes", ",".join(map(str, p.sizes)), "--udp-count", str(p.udp_count),
            "--tcp-count", str(p.tcp_count), "--timeout", str(p.udp_timeout_s),
            "--tcp-timeout", str(p.tcp_timeout_s)]
    if p.exact_sizes:
        argv.append("--exact-sizes")
    r = target.run(target.module_argv("producers.cbd.netprobe", *argv),
                   p.loss_budget_s(len(peers)) + 10)
    try:
        return dict(json.loads(r.stdout))
    except ValueError:
        return {"src": src, "cells": [], "error": f"rc={r.rc}{' timeout' if r.timed_out else ''}"
                                                  f": {r.stderr[-300:]}"}


def run_bandwidth(target: HostTarget, src: str, schedule: list[list[Any]], start_at: float,
                  p: MeshParams) -> dict[str, Any]:
    if not schedule:
        return {"src": src, "links": []}
    last = max(s[0] for s in schedule)
    r = target.run(target.module_argv(
        "producers.cbd.netprobe", "bandwidth", "--src", src, "--schedule", json.dumps(schedule),
        "--start-at", f"{start_at:.3f}", "--slot-s", str(p.slot_s), "--cap-s", str(p.bw_cap_s),
        "--cap-mb", str(p.bw_cap_mb)),
        start_at - time.time() + (last + 1) * p.slot_s + 10)
    try:
        return dict(json.loads(r.stdout))
    except ValueError:
        return {"src": src, "links": [], "error": f"rc={r.rc}: {r.stderr[-300:]}"}


def schedules(rounds: list[list[an.Pair]], addrs: Mapping[str, str], ports: Mapping[str, int]
              ) -> dict[str, list[list[Any]]]:
    out: dict[str, list[list[Any]]] = {}
    for i, rnd in enumerate(rounds):
        for a, b in rnd:
            out.setdefault(a, []).append([i, b, addrs[b], ports[b]])
            out.setdefault(b, []).append([i, a, addrs[a], ports[a]])
    return out


def link_name(ctx: CheckContext, a: str, b: str) -> str:
    from processors.core.base import link_id, nic_id

    def end(h: str, other: str) -> str:
        f = ctx.facts.get(h) or {}
        dev = fv.data_iface(f, ctx.addrs.get(h), [ctx.addrs[other]] if other in ctx.addrs
                            else [])
        return nic_id(h, dev) if dev else h
    return link_id(end(a, b), end(b, a))


def judge_mesh(name: str, loss_out: Sequence[Mapping[str, Any]],
               bw_out: Sequence[Mapping[str, Any]], pairs: Sequence[an.Pair], ctx: CheckContext) -> dict[str, CheckResult]:
    """Per host: fail when localised as the common end of bad (lossy or slow) pairs."""
    cfg = ctx.config
    cells = an.loss_cells(loss_out)
    classes = {p: an.classify(cells.get(p, {}), cfg.loss_ratio, cfg.loss_min_lost)
               for p in pairs}
    rates = an.link_rates({"src": o["src"], **lk} for o in bw_out for lk in o.get("links", ())
                          if "gbps" in lk or "error" in lk)
    slow, floor = an.slow_links(rates, cfg.link_ratio, ctx.baseline.get("link_gbps"),
                                cfg.baseline_ratio)
    lossy = {p for p, (c, _) in classes.items() if c != "ok"}
    slow_pairs = {an.pair(a, b) for a, b in slow}
    suspects, unresolved = an.localise(lossy | slow_pairs, pairs)
    links: dict[str, dict[str, Any]] = {}
    for p in pairs:
        cls, bad_sizes = classes[p]
        if not cells.get(p) and not any(an.pair(a, b) == p for a, b in rates):
            cls = "untested"
        links[link_name(ctx, *p)] = {
            "pair": list(p), "class": cls, "bad_sizes": bad_sizes,
            "loss": {proto: {str(s): round(1 - r / sn, 3) if sn else None
                             for s, (sn, r) in sorted(c.items())}
                     for proto, c in cells.get(p, {}).items()},
            "gbps": {f"{a}->{b}": v for (a, b), v in rates.items() if an.pair(a, b) == p},
            "slow": p in slow_pairs}
    errors = {str(o.get("src")): o["error"] for o in [*loss_out, *bw_out] if o.get("error")}
    out = {}
    for h in ctx.hosts:
        mine = {k: v for k, v in links.items() if h in v["pair"]}
        sizes = sorted({int(s) for v in mine.values() for c in v["loss"].values() for s in c})
        ev = {"links": mine, "suspects": suspects, "unresolved": [list(p) for p in unresolved],
              "rate_floor_gbps": round(floor, 4), "sizes": sizes}
        if h in suspects:
            out[h] = CheckResult(name, FAIL, _why(h, mine, suspects), ev)
        elif h in errors:
            out[h] = CheckResult(name, ERROR, f"probe program failed: {errors[h]}", ev)
        else:
            out[h] = CheckResult(name, PASS, f"{len(mine)} link(s) clean at "
                                 f"{len(sizes)} size(s)", ev)
    return out


def _why(h: str, mine: Mapping[str, Mapping[str, Any]], suspects: list[str]) -> str:
    parts = []
    large = [v for v in mine.values() if v["class"] == "large_packet_loss"]
    if large:
        first = min(min(v["bad_sizes"]) for v in large)
        parts.append(f"large-packet loss on {len(large)}/{len(mine)} link(s): packets >= "
                     f"{first} B lost, small ones pass")
    lossy = [v for v in mine.values() if v["class"] == "loss"]
    if lossy:
        parts.append(f"loss at every size on {len(lossy)}/{len(mine)} link(s)")
    slow = [v for v in mine.values() if v["slow"]]
    if slow:
        rates = sorted(x for v in slow for x in v["gbps"].values())
        parts.append(f"slow on {len(slow)}/{len(mine)} link(s) (down to {rates[0]:g} Gbit/s)")
    common = "the host common to the bad links" if len(suspects) == 1 else \
        f"one of {len(suspects)} suspects"
    return f"{'; '.join(parts) or 'bad links'} -> {common}"


class ProbeMeshCheck:
    """Multi-size UDP/TCP probe mesh plus pairwise bandwidth; see the module docstring."""

    stage = "multi_host"
    diagnosis_kind = "slow_network"

    def __init__(self, params: MeshParams | None = None, name: str = "probe_mesh",
                 timeout_s: float = 60.0) -> None:
        self.params = params or MeshParams()
        self.name = name
        self.timeout_s = timeout_s

    def run_batch(self, targets: Mapping[str, HostTarget], ctx: CheckContext
                  ) -> dict[str, CheckResult]:
        hosts = [h for h in ctx.hosts if h in targets and h in ctx.addrs]
        if len(hosts) < 2:
            return {h: na(self.name, "fewer than 2 reachable hosts with an address")
                    for h in ctx.hosts}
        p = self.params
        pairs = an.probe_pairs(hosts, ctx.config.full_mesh_max)
        procs = {}
        t0 = time.monotonic()
        try:
            with ThreadPoolExecutor(len(hosts)) as ex:
                futs = {h: ex.submit(start_responder, targets[h], ctx.ports[h],
                                     self.timeout_s + 30) for h in hosts}
                for h, f in futs.items():
                    procs[h] = f.result()
                probers = an.assign_probers(pairs)
                ctx.progress(f"{self.name}: {len(pairs)} pair(s), responders up in "
                             f"{time.monotonic() - t0:.1f}s")
                loss_f = [ex.submit(run_loss, targets[s], s,
                                    [(d, ctx.addrs[d], ctx.ports[d], path_mtu(ctx, s, d))
                                     for d in dsts], p) for s, dsts in probers.items()]
                loss_out = [f.result() for f in loss_f]
                bw_out: list[dict[str, Any]] = []
                if p.bandwidth:
                    bw_pairs = pairs if p.bw_pairs == "mesh" else an.ring_pairs(hosts)
                    rounds = an.bandwidth_rounds(hosts, bw_pairs)
                    sched = schedules(rounds, ctx.addrs, ctx.ports)
                    start_at = time.time() + 1.0
                    ctx.progress(f"{self.name}: loss phase done, {len(rounds)} bandwidth "
                                 "round(s)")
                    bw_f = [ex.submit(run_bandwidth, targets[h], h, sched.get(h, []), start_at,
                                      p) for h in hosts]
                    bw_out = [f.result() for f in bw_f]
        except RuntimeError as e:
            return {h: CheckResult(self.name, ERROR, str(e)) for h in ctx.hosts}
        finally:
            for proc in procs.values():
                stop(proc)
        res = judge_mesh(self.name, loss_out, bw_out, pairs, ctx)
        return {h: res.get(h, na(self.name, "no address or target")) for h in ctx.hosts}

