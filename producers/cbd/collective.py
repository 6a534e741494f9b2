"""The collective test (Aegis §6 CBD multi-host stage: "collective communication").

Driver choice, recorded in the evidence of every result:

- ``nccl-tests``: every host has ``all_reduce_perf``, ``mpirun`` and GPUs. One run over the
  whole batch (bus bandwidth vs the baseline), then, to localise, 2-host runs over the ring
  pairs in two waves of disjoint pairs (``pairwise``, or whenever the batch run is bad);
- ``socket-ring``: otherwise. :mod:`producers.cbd.ring` on every host: per-link rates of
  the ring (both directions, loaded together) and a verified ring all-reduce over TCP.

A host is held when it is the common end of slow links (``analysis.localise``). A batch
whose collective fails or is slow without a localisable link fails on every host, which the
mass-failure rule turns into one systemic finding.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from producers.cbd import analysis as an
from producers.cbd import nccl_tests
from producers.cbd.model import ERROR, FAIL, PASS, CheckContext, CheckResult, na
from producers.cbd.targets import HostTarget, stop

SOCKET_RING, NCCL_TESTS = "socket-ring", "nccl-tests all_reduce_perf"


@dataclass(frozen=True)
class RingParams:
    mb: int = 8
    link_mb: int = 64
    link_cap_s: float = 0.5
    timeout_s: float = 20.0

    def argv(self, rank: int, peers: Sequence[str]) -> list[str]:
        return ["--rank", str(rank), "--peers", *peers, "--mb", str(self.mb), "--link-mb",
                str(self.link_mb), "--link-cap-s", str(self.link_cap_s), "--timeout",
                str(self.timeout_s)]


def run_ring(targets: Mapping[str, HostTarget], hosts: Sequence[str], addrs: Mapping[str, str],
             ports: Mapping[str, int], p: RingParams) -> dict[str, dict[str, Any]]:
    """Start one rank per host (rank = position in ``hosts``), wait, parse their JSON."""
    peers = [f"{addrs[h]}:{ports[h]}" for h in hosts]
    procs: dict[str, subprocess.Popen[str]] = {}
    out: dict[str, dict[str, Any]] = {}
    try:
        for r, h in enumerate(hosts):
            procs[h] = targets[h].start(targets[h].module_argv("producers.cbd.ring",
                                                               *p.argv(r, peers)))

        def wait(h: str) -> dict[str, Any]:
            try:
                so, se = procs[h].communicate(timeout=p.timeout_s * 2 + p.link_cap_s * 3 + 10)
                return dict(json.loads(so))
            except (subprocess.TimeoutExpired, ValueError) as e:
                return {"error": f"ring rank on {h} failed: {e}"}

        with ThreadPoolExecutor(len(hosts)) as ex:
            for h, res in zip(hosts, ex.map(wait, hosts), strict=True):
                out[h] = res
    finally:
        for proc in procs.values():
            stop(proc)
    return out


def judge_ring(name: str, outputs: Mapping[str, Mapping[str, Any]], hosts: Sequence[str],
               ctx: CheckContext, why: str) -> dict[str, CheckResult]:
    cfg = ctx.config
    rates = an.link_rates({"src": hosts[lk["src"]], "dst": hosts[lk["dst"]],
                           "gbps": lk.get("gbps", 0.0)}
                          for o in outputs.values() for lk in o.get("links", ()))
    slow, floor = an.slow_links(rates, cfg.link_ratio, ctx.baseline.get("link_gbps"),
                                cfg.baseline_ratio)
    n = len(hosts)
    ring_pairs = sorted({an.pair(hosts[i], hosts[(i + 1) % n]) for i in range(n)})
    suspects, unresolved = an.localise({an.pair(a, b) for a, b in slow}, ring_pairs)
    ar = {h: o.get("allreduce") or {"error": o.get("error", "no result")}
          for h, o in outputs.items()}
    busbw = min((a.get("busbw_gbps", 0.0) for a in ar.values()), default=0.0)
    failed = sorted(f"{h}: {a['error']}" for h, a in ar.items() if a.get("error"))
    wrong = sorted(h for h, a in ar.items() if a.get("correct") is False)
    base = ctx.baseline.get("busbw_gbps")
    batch_problem = ""
    if wrong:
        batch_problem = f"all-reduce gave wrong results on {', '.join(wrong)}"
    elif failed:
        batch_problem = f"all-reduce failed: {failed[0]}" + (f" (+{len(failed) - 1} more)"
                                                             if len(failed) > 1 else "")
    elif base and busbw < cfg.baseline_ratio * base:
        batch_problem = f"bus bandwidth {busbw:g} GB/s below {cfg.baseline_ratio:g} x " \
                        f"baseline {base:g} GB/s"
    common = {"driver": SOCKET_RING, "why_driver": why, "busbw_gbps": busbw,
              "algbw_gbps": min((a.get("algbw_gbps", 0.0) for a in ar.values()), default=0.0),
              "allreduce_problem": batch_problem, "suspects": suspects,
              "unresolved": [list(p) for p in unresolved], "link_floor_gbps": round(floor, 4)}
    out = {}
    for h in hosts:
        mine = {f"{a}->{b}": v for (a, b), v in rates.items() if h in (a, b)}
        ev = {**common, "links_gbps": mine}
        if h in suspects:
            bad = sorted(f"{a}->{b} {v:g}" for (a, b), v in rates.items()
                         if (a, b) in slow and h in (a, b))
            out[h] = CheckResult(name, FAIL, f"slow ring link(s) {', '.join(bad)} Gbit/s (floor "
                                 f"{floor:.3g}) -> the host common to them ({SOCKET_RING})", ev)
        elif batch_problem and not suspects:
            out[h] = CheckResult(name, FAIL, f"{batch_problem} ({SOCKET_RING})", ev)
        else:
            out[h] = CheckResult(name, PASS, f"busbw {busbw:g} GB/s, ring links above "
                                 f"{floor:.3g} Gbit/s ({SOCKET_RING})", ev)
    return out


def judge_nccl(name: str, batch_run: Mapping[str, Any], pair_runs: Mapping[an.Pair, Mapping[
        str, Any]], hosts: Sequence[str], ctx: CheckContext) -> dict[str, CheckResult]:
    """Batch busbw vs baseline; pair busbw far below the others localises a host."""
    cfg = ctx.config
    busbw = batch_run.get("max_busbw") or 0.0
    rates = {p: float(r.get("max_busbw") or 0.0) for p, r in pair_runs.items()}
    slow, floor = an.slow_links(rates, cfg.busbw_ratio, ctx.baseline.get("busbw_gbps"),
                                cfg.baseline_ratio)
    suspects, unresolved = an.localise(slow, list(rates))
    base = ctx.baseline.get("busbw_gbps")
    problem = ""
    if batch_run.get("error"):
        problem = str(batch_run["error"])
    elif batch_run.get("wrong"):
        problem = f"{batch_run['wrong']} size(s) with wrong results"
    elif base and busbw < cfg.baseline_ratio * base:
        problem = f"bus bandwidth {busbw:g} GB/s below {cfg.baseline_ratio:g} x baseline {base:g}"
    ev = {"driver": NCCL_TESTS, "busbw_gbps": busbw, "avg_busbw_gbps": batch_run.get("avg_busbw"),
          "pairs": {f"{a}<->{b}": v for (a, b), v in rates.items()}, "suspects": suspects,
          "unresolved": [list(p) for p in unresolved], "problem": problem}
    out = {}
    for h in hosts:
        if h in suspects:
            out[h] = CheckResult(name, FAIL, f"2-host all_reduce_perf pairs with {h} below "
                                 f"{floor:.3g} GB/s busbw ({NCCL_TESTS})", ev)
        elif problem and not suspects:
            out[h] = CheckResult(name, FAIL, f"{problem} ({NCCL_TESTS})", ev)
        else:
            out[h] = CheckResult(name, PASS, f"busbw {busbw:g} GB/s ({NCCL_TESTS})", ev)
    return out


_SEVERITY = {FAIL: 3, ERROR: 2, PASS: 1}


def worst(prev: CheckResult | None, new: CheckResult, group: Sequence[str]) -> CheckResult:
    """A host tested in several groups keeps its worst result (and says which group)."""
    new = CheckResult(new.check, new.status, new.reason, {**new.evidence, "group": list(group)},
                      new.duration_s)
    if prev is None or _SEVERITY.get(new.status, 0) > _SEVERITY.get(prev.status, 0):
        return new
    return prev


class CollectiveCheck:
    stage = "multi_host"
    diagnosis_kind = "slow_network"

    def __init__(self, ring: RingParams | None = None, name: str = "collective",
                 timeout_s: float = 120.0, nccl_max_bytes: str = "256M",
                 pairwise: bool = False, driver: str = "auto") -> None:
        self.ring = ring or RingParams()
        self.name = name
        self.timeout_s = timeout_s
        self.nccl_max_bytes = nccl_max_bytes
        self.pairwise = pairwise
        self.driver = driver  # auto | ring | nccl

    def run_batch(self, targets: Mapping[str, HostTarget], ctx: CheckContext
                  ) -> dict[str, CheckResult]:
        hosts = [h for h in ctx.hosts if h in targets and h in ctx.addrs]
        if len(hosts) < 2:
            return {h: na(self.name, "fewer than 2 reachable hosts with an address")
                    for h in ctx.hosts}
        ok, why = nccl_tests.usable(ctx.facts, hosts)
        if self.driver == "nccl" or (ok and self.driver == "auto"):
            res = self._nccl(targets, hosts, ctx)
        else:
            why = "forced" if self.driver == "ring" else f"nccl-tests not usable: {why}"
            res = {}
            for stage in ctx.stages(hosts):
                groups = [g for g in stage if len(g) >= 2]
                if not groups:
                    continue
                ctx.progress(f"{self.name}: {SOCKET_RING} over {len(groups)} group(s) of "
                             f"{'/'.join(str(len(g)) for g in groups)} hosts ({why})")
                with ThreadPoolExecutor(len(groups)) as ex:
                    outs = list(ex.map(lambda g: run_ring(
                        targets, g, ctx.addrs, {h: ctx.ports[h] + 1 for h in g}, self.ring),
                        groups))
                for g, o in zip(groups, outs, strict=True):
                    for h, r in judge_ring(self.name, o, g, ctx, why).items():
                        res[h] = worst(res.get(h), r, g)
        return {h: res.get(h, na(self.name, "no address or target")) for h in ctx.hosts}

    def _run_nccl(self, targets: Mapping[str, HostTarget], hosts: Sequence[str],
                  ctx: CheckContext) -> dict[str, Any]:
        cfg, first = ctx.config, ctx.facts.get(hosts[0], {})
        gpus = [(ctx.addrs[h], int((ctx.facts[h].get("nvml") or {}).get("count") or 1))
                for h in hosts]
        argv = nccl_tests.mpirun_argv(cfg.mpirun, cfg.mpirun_args, gpus, cfg.all_reduce_perf,
                                      first.get("env") or {}, max_bytes=self.nccl_max_bytes)
        r = targets[hosts[0]].run(argv, self.timeout_s / 3)
        parsed = nccl_tests.parse_output(r.stdout)
        if r.rc != 0 or not parsed["rows"]:
            parsed["error"] = f"all_reduce_perf rc={r.rc}{' timeout' if r.timed_out else ''}: " \
                              f"{r.stderr[-300:]}"
        return parsed

    def _nccl(self, targets: Mapping[str, HostTarget], hosts: Sequence[str], ctx: CheckContext
              ) -> dict[str, CheckResult]:
        ctx.progress(f"{self.name}: {NCCL_TESTS} over {len(hosts)} hosts")
        batch = self._run_nccl(targets, hosts, ctx)
        pairs: dict[an.Pair, Mapping[str, Any]] = {}
        base = ctx.baseline.get("busbw_gbps")
        bad = batch.get("error") or (base and (batch.get("max_busbw") or 0) <
                                     ctx.config.baseline_ratio * base)
        if self.pairwise or bad:
            n = len(hosts)
            ring = sorted({an.pair(hosts[i], hosts[(i + 1) % n]) for i in range(n)})
            for wave in an.bandwidth_rounds(hosts, ring):  # pairs of a wave share no host
                with ThreadPoolExecutor(len(wave)) as ex:
                    for p, res in zip(wave, ex.map(
                            lambda ab: self._run_nccl(targets, list(ab), ctx), wave), strict=True):
                        pairs[p] = res
        return judge_nccl(self.name, batch, pairs, hosts, ctx)
