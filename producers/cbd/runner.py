"""Direct mode: run a CBD profile on every host of a batch in parallel and decide.

Aegis §6 (CBD): all checks in parallel just before hand-over. Stages, each bounded by its
budget and every check by its own timeout:

0. facts: ``python -m producers.cbd.facts`` on every host at once;
1. configuration checks (pure, over every host's facts);
2. single-host checks: all hosts at once, each host's checks one after another (they would
   disturb each other's measurements); then each check's ``compare`` over the batch;
3. multi-host checks: one after another (probe mesh, then the collective).

A host whose facts could not be collected gets ``error`` for every check. Time for
verdicts is injected (``clock``) so a test can fix it.
"""

from __future__ import annotations

import functools
import json
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from producers.cbd import facts_view as fv
from producers.cbd.config import CbdConfig
from producers.cbd.model import ERROR, BatchReport, CheckContext, CheckResult
from producers.cbd.profiles import Profile
from producers.cbd.targets import HostSpec, HostTarget, make_target
from producers.cbd.verdict import decide


def collect_facts(target: HostTarget, cfg: CbdConfig, timeout_s: float
                  ) -> tuple[dict[str, Any] | None, str]:
    argv = ["--tool", cfg.all_reduce_perf, "--tool", cfg.mpirun, "--tool", "nvidia-smi"]
    for p in cfg.env_prefixes:
        argv += ["--env-prefix", p]
    r = target.run(target.module_argv("producers.cbd.facts", *argv), timeout_s)
    try:
        return dict(json.loads(r.stdout)), ""
    except ValueError:
        return None, (f"facts collector rc={r.rc}{' (timed out)' if r.timed_out else ''}: "
                      f"{r.stderr.strip()[-300:]}")


def _guarded(check: Any, fn: Callable[[], Any], timeout_s: float) -> Any:
    """Run ``fn`` with a wall-clock limit; None when it did not finish in time."""
    box: list[Any] = []
    err: list[BaseException] = []

    def go() -> None:
        try:
            box.append(fn())
        except Exception as e:  # noqa: BLE001 - a broken check must not stop the batch
            err.append(e)

    t = threading.Thread(target=go, daemon=True, name=f"cbd-{check.name}")
    t.start()
    t.join(timeout_s)
    if err:
        raise err[0]
    return box[0] if box else None


def run_host_checks(checks: Sequence[Any], target: HostTarget, ctx: CheckContext,
                     deadline: float) -> dict[str, CheckResult]:
    out = {}
    for c in checks:
        left = deadline - time.monotonic()
        if left <= 0:
            out[c.name] = CheckResult(c.name, ERROR, "stage budget exhausted before this check")
            continue
        t0 = time.monotonic()
        limit = min(c.timeout_s, left)
        try:
            r = _guarded(c, functools.partial(c.run, target, ctx), limit)
        except Exception as e:  # noqa: BLE001
            r = CheckResult(c.name, ERROR, f"check crashed: {type(e).__name__}: {e}")
        if r is None:
            r = CheckResult(c.name, ERROR, f"timed out after {limit:.1f}s")
        out[c.name] = r.timed(time.monotonic() - t0)
    return out


def run_cbd(specs: Sequence[HostSpec], profile: Profile, config: CbdConfig | None = None,
            baseline: Mapping[str, float] | None = None, batch: str = "batch",
            progress: Callable[[str], None] = lambda _m: None,
            clock: Callable[[], float] = time.time, plan: Any = None) -> BatchReport:
    """Run ``profile`` on every host; ``plan`` (producers.cbd.planner.Plan) splits the
    multi-host tests into link-disjoint groups, stage by stage."""
    cfg = config or CbdConfig()
    t_start, started_ts = time.monotonic(), clock()
    stage_s: dict[str, float] = {}
    targets = {s.name: make_target(s, cfg.python) for s in specs}
    hosts = [s.name for s in specs]
    budget = profile.stage_budget_s

    def say(msg: str) -> None:
        progress(f"[cbd {time.monotonic() - t_start:5.1f}s] {msg}")

    # stage 0: facts
    t0 = time.monotonic()
    with ThreadPoolExecutor(max(1, len(hosts))) as ex:
        got = dict(zip(hosts, ex.map(lambda h: collect_facts(targets[h], cfg, budget["facts"]),
                                     hosts), strict=True))
    facts = {h: f for h, (f, _) in got.items() if f is not None}
    no_facts = {h: why for h, (f, why) in got.items() if f is None}
    stage_s["facts"] = time.monotonic() - t0
    say(f"facts from {len(facts)}/{len(hosts)} host(s)"
        + (f"; missing: {', '.join(sorted(no_facts))}" if no_facts else ""))
    addrs = {s.name: a for s in specs
             if (a := s.addr or (fv.first_global_ipv4(facts[s.name]) if s.name in facts
                                 else None))}
    base_port = cfg.port or random.Random().randrange(20000, 40000, 2)
    ports = {s.name: s.port or base_port for s in specs}
    ctx = CheckContext(batch=batch, hosts=hosts, addrs=addrs, facts=facts, config=cfg,
                       baseline=dict(baseline or {}), progress=say, ports=ports, plan=plan)
    results: dict[str, dict[str, CheckResult]] = {h: {} for h in hosts}
    live = [h for h in hosts if h in facts]

    # stage 1: configuration (pure over facts)
    t0 = time.monotonic()
    for h in live:
        results[h].update(run_host_checks(profile.config_checks, targets[h], ctx,
                                           time.monotonic() + budget["config"]))
    stage_s["config"] = time.monotonic() - t0
    say(f"configuration: {len(profile.config_checks)} check(s) on {len(live)} host(s)")

    # stage 2: single-host, all hosts at once
    t0 = time.monotonic()
    deadline = t0 + budget["single_host"]
    if profile.host_checks and live:
        with ThreadPoolExecutor(len(live)) as ex:
            per = dict(zip(live, ex.map(lambda h: run_host_checks(
                profile.host_checks, targets[h], ctx, deadline), live), strict=True))
        for c in profile.host_checks:
            judged = c.compare({h: per[h][c.name] for h in live}, ctx)
            for h in live:
                results[h][c.name] = judged.get(h, per[h][c.name])
    stage_s["single_host"] = time.monotonic() - t0
    say(f"single-host: {len(profile.host_checks)} check(s) in {stage_s['single_host']:.1f}s")

    # stage 3: multi-host, one check at a time
    t0 = time.monotonic()
    deadline = t0 + budget["multi_host"]
    live_targets = {h: targets[h] for h in live}
    for c in profile.batch_checks:
        limit = min(c.timeout_s, deadline - time.monotonic())
        c0 = time.monotonic()
        try:
            res = (_guarded(c, functools.partial(c.run_batch, live_targets, ctx), limit)
                   if limit > 0 else None)
        except Exception as e:  # noqa: BLE001
            res = {h: CheckResult(c.name, ERROR, f"check crashed: {type(e).__name__}: {e}")
                   for h in live}
        if res is None:
            res = {h: CheckResult(c.name, ERROR, f"timed out after {max(limit, 0):.1f}s")
                   for h in live}
        for h in live:
            results[h][c.name] = res.get(h, CheckResult(c.name, ERROR, "no result")).timed(
                time.monotonic() - c0)
        say(f"{c.name}: " + ", ".join(f"{h}={results[h][c.name].status}" for h in live))
    stage_s["multi_host"] = time.monotonic() - t0

    for h, why in no_facts.items():
        results[h] = {c.name: CheckResult(c.name, ERROR, f"no facts from the host: {why}")
                      for c in profile.all_checks()}
    kinds = {c.name: c.diagnosis_kind for c in profile.all_checks()}
    wall = time.monotonic() - t_start
    report = decide(batch, results, kinds, cfg, started_ts, started_ts + wall,
                    profile=profile.name, mode="direct", wall_s=wall, stage_s=stage_s,
                    hosts=hosts)
    report.plan = plan.to_wire() if plan is not None else None
    say(f"verdict {report.verdict}: deliver {len(report.delivered)}, hold {len(report.held)}")
    return report
