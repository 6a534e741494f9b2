"""``aegis cbd``: Check Before Delivery (Aegis §6) on a batch of hosts about to be handed over.

Exit codes: 0 every host delivered; 1 a host held or a rollback asked for; 2 usage or
configuration error; 3 Kafka unreachable (agents mode). Progress goes to stderr; the report
to stdout (``--json`` for the full report with diagnoses and commands).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from producers.cbd.config import CbdConfig
    from producers.cbd.model import BatchReport
    from producers.cbd.profiles import Profile
    from producers.cbd.targets import HostSpec


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aegis cbd", description=(
        "Check Before Delivery (Aegis §6): run a check suite on every host in parallel and "
        "say deliver or hold per host; a mass failure asks for one rollback_update."))
    p.add_argument("--hosts", required=True, help=(
        "comma-separated host specs, or a file (one spec per line, or JSON): "
        "[NAME=]local | netns:NS | ssh:HOST, options addr=IP port=N env.KEY=VALUE"))
    p.add_argument("--profile", choices=("light", "full"), default="light",
                   help="light < 1 min (config + critical quick tests), full < 10 min")
    p.add_argument("--mode", choices=("direct", "agents"), default="direct",
                   help="direct: run the checks from here; agents: publish a request to "
                        "the host agents over Kafka and judge their results")
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.add_argument("--baseline", help="JSON {metric: value} (see docs/cbd.md)")
    p.add_argument("--save-baseline", metavar="FILE",
                   help="write this run's batch medians as a baseline file")
    p.add_argument("--mass-share", type=float, default=None,
                   help="share of hosts failing one check that makes it systemic (0.5)")
    p.add_argument("--config", help="CBD settings, TOML or JSON (see docs/cbd.md)")
    p.add_argument("--batch", default=None, help="batch/cluster name (target of rollback)")
    p.add_argument("--only", help="comma-separated check names to run")
    p.add_argument("--topology", help="fabric JSON for link-disjoint multi-host groups")
    p.add_argument("--max-group", type=int, default=8, help="hosts per test group (8)")
    p.add_argument("--kafka", default=os.environ.get("AEGIS_KAFKA_BOOTSTRAP"),
                   help="Kafka bootstrap for agents mode (default $AEGIS_KAFKA_BOOTSTRAP)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    from producers.cbd import profiles
    from producers.cbd.config import CbdConfig, load_baseline
    from producers.cbd.report import baseline_from_report, render_text
    from producers.cbd.targets import load_hosts
    from schemas.errors import ConfigError, ServiceUnavailable

    def progress(msg: str) -> None:
        if not a.quiet:
            print(msg, file=sys.stderr, flush=True)

    try:
        cfg = CbdConfig.load(a.config)
        if a.mass_share is not None:
            cfg.mass_share = a.mass_share
            cfg.validate("--mass-share")
        baseline = load_baseline(a.baseline)
        specs = load_hosts(a.hosts)
        profile = profiles.get(a.profile)
        if a.only:
            profile = profile.only(x.strip() for x in a.only.split(",") if x.strip())
        batch = a.batch or f"cbd-{time.strftime('%Y%m%d-%H%M%S')}"
        if a.mode == "direct":
            from producers.cbd.runner import run_cbd

            plan = None
            if a.topology:
                from producers.cbd.planner import Fabric, plan_groups

                with open(a.topology) as fh:
                    fabric = Fabric.from_wire(json.load(fh))
                plan = plan_groups([s.name for s in specs], fabric, a.max_group)
            report = run_cbd(specs, profile, cfg, baseline, batch, progress, plan=plan)
        else:
            report = _agents(a, specs, profile, cfg, baseline, batch, progress)
    except (ConfigError, ValueError, OSError) as e:
        print(f"aegis cbd: {e}", file=sys.stderr)
        return 2
    except ServiceUnavailable as e:
        print(f"aegis cbd: {e}", file=sys.stderr)
        return 3
    if a.save_baseline:
        with open(a.save_baseline, "w") as fh:
            json.dump(baseline_from_report(report), fh, indent=2)
    print(json.dumps(report.to_wire(), indent=2, default=str) if a.json else render_text(report))
    return 0 if report.verdict == "deliver" else 1


def _agents(a: argparse.Namespace, specs: list[HostSpec], profile: Profile, cfg: CbdConfig,
            baseline: dict[str, float], batch: str, progress: Callable[[str], None]
            ) -> BatchReport:
    from producers.cbd import agents
    from producers.cbd.kafka_bus import KafkaBus
    from schemas.errors import ConfigError

    if not a.kafka:
        raise ConfigError("agents mode needs --kafka BOOTSTRAP (or $AEGIS_KAFKA_BOOTSTRAP)")
    bus = KafkaBus(a.kafka)
    try:
        only = [c.name for c in profile.all_checks()] if a.only else []
        req = agents.make_request(batch, a.profile, specs, cfg, time.time(), only=only)
        group = f"cbd-coordinator-{req.id}"
        bus.poll(agents.CBD_RESULTS_TOPIC, group, 0.0)  # subscribe before anyone answers
        agents.publish_request(bus, req)
        sched = agents.schedule(req, profile)
        wait = sched.end_at - time.time() + profile.stage_budget_s["single_host"] + 30
        progress(f"[cbd] request {req.id} to {len(specs)} agent(s); waiting up to {wait:.0f}s")
        got = agents.gather_results(bus, req, wait, group)
        return agents.judge_request(req, got, baseline)
    finally:
        bus.close()
