"""Configuration checks (Aegis §6 CBD stage 1, "< 1 min: host, GPU, NIC"; Alg. 1 ConfigCheck).

They read only the facts collected before any check runs, and compare each host with the
batch majority (identical servers in one job should agree). Each says not_applicable when
the hardware it checks is absent from the whole batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from producers.cbd import facts_view as fv
from producers.cbd.model import FAIL, PASS, CheckContext, CheckResult, na
from producers.cbd.nccl_env import env_problems
from producers.cbd.nvml_facts import HW_SLOWDOWN_MASK
from producers.cbd.targets import HostTarget


class ConfigCheck:
    """Base: pure evaluation of one host's facts against the batch's."""

    name = "config"
    stage = "config"
    timeout_s = 5.0
    diagnosis_kind = "config"

    def run(self, target: HostTarget, ctx: CheckContext) -> CheckResult:
        return self.evaluate(target.name, ctx)

    def evaluate(self, host: str, ctx: CheckContext) -> CheckResult:
        raise NotImplementedError

    def compare(self, results: Mapping[str, CheckResult], ctx: CheckContext
                ) -> dict[str, CheckResult]:
        return dict(results)

    def verdict(self, problems: list[str], evidence: dict[str, Any], ok: str) -> CheckResult:
        if problems:
            return CheckResult(self.name, FAIL, "; ".join(problems), evidence)
        return CheckResult(self.name, PASS, ok, evidence)


def _batch(ctx: CheckContext) -> dict[str, Mapping[str, Any]]:
    return {h: ctx.facts[h] for h in ctx.hosts if h in ctx.facts}


class VersionsCheck(ConfigCheck):
    """Driver, CUDA and NCCL versions agree across the batch (frequent updates, Aegis §6)."""

    name = "versions"

    @staticmethod
    def versions(facts: Mapping[str, Any]) -> dict[str, str | None]:
        nv = fv.nvml(facts)
        nccl = facts.get("nccl") or {}
        return {"driver": nv.get("driver") if nv.get("available") else None,
                "cuda": nv.get("cuda") if nv.get("available") else None,
                "nccl": nccl.get("version") if isinstance(nccl, Mapping) else None}

    def evaluate(self, host: str, ctx: CheckContext) -> CheckResult:
        batch = {h: self.versions(f) for h, f in _batch(ctx).items()}
        mine = batch.get(host) or self.versions(ctx.facts.get(host, {}))
        if not any(v for vs in batch.values() for v in vs.values()):
            return na(self.name, "no NVIDIA driver, CUDA or NCCL found on any host of the batch")
        problems: list[str] = []
        refs: dict[str, Any] = {}
        for key in ("driver", "cuda", "nccl"):
            ref, n, total = fv.mode(vs[key] for vs in batch.values())
            if ref is None:
                continue
            refs[key] = {"majority": ref, "hosts": n, "of": len(batch)}
            if mine[key] is None:
                why = fv.nvml(ctx.facts.get(host, {})).get("reason", "") if key != "nccl" else ""
                problems.append(f"no {key} version here while {total} host(s) have one "
                                f"(majority {ref}){': ' + why if why else ''}")
            elif mine[key] != ref:
                problems.append(f"{key} {mine[key]} differs from the batch majority {ref} "
                                f"({n}/{len(batch)} hosts)")
        return self.verdict(problems, {"host": mine, "batch": refs}, "versions match the batch")


class NcclEnvCheck(ConfigCheck):
    """NCCL/UCX/MLX5 environment: required and expected values, sane values, and the same
    values on every host (a mistyped NCCL_IB_HCA on one host hangs the whole job)."""

    name = "nccl_env"

    def evaluate(self, host: str, ctx: CheckContext) -> CheckResult:
        cfg = ctx.config
        batch = {h: dict(f.get("env") or {}) for h, f in _batch(ctx).items()}
        facts = ctx.facts.get(host, {})
        env = batch.get(host, dict(facts.get("env") or {}))
        problems = [f"required {k} is not set" for k in cfg.required_env if k not in env]
        problems += [f"{k}={env.get(k, '<unset>')}, expected {v}"
                     for k, v in sorted(cfg.expected_env.items()) if env.get(k) != v]
        keys = sorted({k for e in batch.values() for k in e} - set(cfg.env_may_differ))
        differ = {}
        for k in keys:
            ref, n, _ = fv.mode(e.get(k, "<unset>") for e in batch.values())
            if env.get(k, "<unset>") != ref:
                differ[k] = {"here": env.get(k, "<unset>"), "majority": ref, "hosts": n}
                problems.append(f"{k}={env.get(k, '<unset>')} here, {ref} on {n}/{len(batch)} "
                                "hosts")
        problems += env_problems(env, facts)
        return self.verdict(problems, {"env": env, "differs": differ},
                            f"{len(env)} NCCL/IB variable(s), consistent and sane")


class GpuCountCheck(ConfigCheck):
    """GPUs visible to NVML vs the expected count (config, else the batch majority)."""

    name = "gpu_count"
    diagnosis_kind = "critical_error"

    def evaluate(self, host: str, ctx: CheckContext) -> CheckResult:
        def count(f: Mapping[str, Any]) -> int:
            nv = fv.nvml(f)
            return int(nv.get("count") or 0) if nv.get("available") else 0

        batch = _batch(ctx)
        facts = ctx.facts.get(host, {})
        pci_n = len(fv.nvidia_pci_gpus(facts))
        if not any(count(f) or fv.nvidia_pci_gpus(f) for f in batch.values()):
            return na(self.name, "no NVIDIA GPU on any host of the batch (PCI and NVML)")
        expected = ctx.config.gpus_per_host or fv.mode(
            max(count(f), len(fv.nvidia_pci_gpus(f))) for f in batch.values())[0]
        nv = fv.nvml(facts)
        ev = {"nvml": count(facts), "pci": pci_n, "expected": expected}
        if not nv.get("available"):
            return CheckResult(self.name, FAIL, f"NVML unavailable ({nv.get('reason')}) with "
                               f"{pci_n} NVIDIA GPU(s) on PCI, {expected} expected", ev)
        if count(facts) < expected:
            return CheckResult(self.name, FAIL, f"{count(facts)} GPU(s) visible to NVML, "
                               f"{expected} expected", ev)
        return CheckResult(self.name, PASS, f"{count(facts)} GPU(s)", ev)


class GpuModesCheck(ConfigCheck):
    """Persistence mode, ECC mode (and no pending change), application clocks consistent
    with the batch, no hardware slowdown."""

    name = "gpu_modes"

    def evaluate(self, host: str, ctx: CheckContext) -> CheckResult:
        cfg = ctx.config
        nv = fv.nvml(ctx.facts.get(host, {}))
        if not nv.get("available"):
            return na(self.name, str(nv.get('reason') or 'NVML not available'))
        app_ref, _, _ = fv.mode(g.get("sm_app_mhz") for f in _batch(ctx).values()
                                for g in fv.nvml(f).get("gpus") or ()
                                if isinstance(g.get("sm_app_mhz"), int))
        problems, ev = [], []
        for g in nv.get("gpus") or ():
            i = g.get("index")
            ev.append({k: g.get(k) for k in ("index", "persistence", "ecc_current", "ecc_pending",
                                             "sm_clock_mhz", "sm_app_mhz", "clock_reasons")})
            if cfg.require_persistence and g.get("persistence") == 0:
                problems.append(f"gpu{i}: persistence mode off")
            if cfg.require_ecc and g.get("ecc_current") == 0:
                problems.append(f"gpu{i}: ECC disabled")
            if isinstance(g.get("ecc_pending"), int) and g.get("ecc_pending") != g.get(
                    "ecc_current"):
                problems.append(f"gpu{i}: ECC mode change pending a reboot")
            app = g.get("sm_app_mhz")
            if isinstance(app, int) and app_ref is not None and app != app_ref:
                problems.append(f"gpu{i}: application SM clock {app} MHz, batch {app_ref} MHz")
            reasons = g.get("clock_reasons")
            if isinstance(reasons, int) and reasons & HW_SLOWDOWN_MASK:
                problems.append(f"gpu{i}: hardware clock slowdown (reasons 0x{reasons:x})")
        return self.verdict(problems, {"gpus": ev}, "GPU modes and clocks as expected")


class NicLinkCheck(ConfigCheck):
    """RDMA ports ACTIVE/LinkUp at the batch's rate; the data interface up, with the batch's
    speed and MTU, and the same MTU as each peer's interface (MTU consistent along the path)."""

    name = "nic_link"
    diagnosis_kind = "critical_error"

    def evaluate(self, host: str, ctx: CheckContext) -> CheckResult:
        batch = _batch(ctx)
        facts = ctx.facts.get(host, {})
        data = {h: _data(h, ctx) for h in batch}
        mine = _data(host, ctx)
        if not facts.get("ib") and mine is None:
            return na(self.name, "no RDMA port and no interface towards the peers")
        problems: list[str] = []
        rate_ref, _, _ = fv.mode(p.get("rate_gbps") for f in batch.values()
                                 for p in f.get("ib") or ())
        for p in facts.get("ib") or ():
            port = f"{p.get('dev')}/{p.get('port')}"
            if "ACTIVE" not in str(p.get("state")):
                problems.append(f"{port}: state {p.get('state')}")
            if p.get("phys_state") and "LinkUp" not in str(p.get("phys_state")):
                problems.append(f"{port}: phys_state {p.get('phys_state')}")
            rate = p.get("rate_gbps")
            if rate is not None and rate_ref is not None and rate < rate_ref:
                problems.append(f"{port}: {rate:g} Gb/s, batch {rate_ref:g} Gb/s")
        ev: dict[str, Any] = {"ib": facts.get("ib") or [], "data_iface": mine}
        if mine is not None:
            if mine.get("operstate") not in ("up", "unknown") or mine.get("carrier") == 0:
                problems.append(f"{mine['name']}: operstate {mine.get('operstate')}, carrier "
                                f"{mine.get('carrier')}")
            mtu_ref, n, _ = fv.mode(d.get("mtu") for d in data.values() if d)
            if mtu_ref is not None and mine.get("mtu") != mtu_ref:
                problems.append(f"{mine['name']}: MTU {mine.get('mtu')}, {mtu_ref} on {n}/"
                                f"{len(batch)} hosts")
            speed_ref, _, _ = fv.mode(d.get("speed_mbps") for d in data.values() if d)
            sp = mine.get("speed_mbps")
            if sp is not None and speed_ref is not None and sp < speed_ref:
                problems.append(f"{mine['name']}: {sp} Mb/s, batch {speed_ref} Mb/s")
            paths = {p: {"here": mine.get("mtu"), "peer": d.get("mtu")}
                     for p, d in data.items() if p != host and d}
            ev["path_mtu"] = paths
            bad = sorted(p for p, m in paths.items() if m["here"] != m["peer"])
            if bad:
                problems.append(f"MTU differs along the path to {', '.join(bad)}")
        return self.verdict(problems, ev, "links up, speed and MTU consistent")


def _data(host: str, ctx: CheckContext) -> dict[str, Any] | None:
    facts = ctx.facts.get(host)
    if not facts:
        return None
    peers = [ctx.addrs[p] for p in ctx.peers(host) if p in ctx.addrs]
    name = fv.data_iface(facts, ctx.addrs.get(host), peers)
    n = fv.iface(facts, name)
    return dict(n) if n else None


class PcieLinkCheck(ConfigCheck):
    """PCIe lane degradation (Aegis §4.1 CriticalError): current link width below the
    maximum on a GPU or NIC, or NIC speed below its maximum. GPUs drop their link speed
    when idle, so GPU speed counts only with ``pcie_gpu_speed_strict``."""

    name = "pcie_link"
    diagnosis_kind = "critical_error"

    def evaluate(self, host: str, ctx: CheckContext) -> CheckResult:
        cfg = ctx.config
        devs = [p for p in ctx.facts.get(host, {}).get("pci") or ()
                if p.get("max_width") and p.get("cur_width") is not None
                and p.get("bus") not in cfg.pcie_ignore]
        if not devs:
            return na(self.name, "no GPU or NIC PCI device reports its link width")
        problems: list[str] = []
        notes: list[str] = []
        for p in devs:
            where = f"{p['kind']} {p['bus']}"
            if p["cur_width"] < p["max_width"]:
                problems.append(f"{where}: x{p['cur_width']} of x{p['max_width']} lanes")
            cur, mx = p.get("cur_speed"), p.get("max_speed")
            if cur is not None and mx is not None and cur < mx:
                msg = f"{where}: {cur:g} of {mx:g} GT/s"
                (problems if p["kind"] == "nic" or cfg.pcie_gpu_speed_strict else notes).append(
                    msg)
        ev = {"devices": devs, "notes": notes}
        return self.verdict(problems, ev, f"{len(devs)} device(s) at full width")


class RoutesCheck(ConfigCheck):
    """Container network routes: a default route, and a route to every batch peer."""

    name = "routes"

    def evaluate(self, host: str, ctx: CheckContext) -> CheckResult:
        routes = ctx.facts.get(host, {}).get("routes") or []
        problems = []
        if ctx.config.require_default_route and not any(r.get("dst") == "default"
                                                         for r in routes):
            problems.append("no default route")
        via = {}
        for p in ctx.peers(host):
            addr = ctx.addrs.get(p)
            r = fv.route_for(routes, addr) if addr else None
            via[p] = dict(r) if r else None
            if addr and r is None:
                problems.append(f"no route to {p} ({addr})")
        return self.verdict(problems, {"routes": routes, "peers": via},
                            f"default route and routes to {len(via)} peer(s)")


CONFIG_CHECKS = (VersionsCheck, NcclEnvCheck, GpuCountCheck, GpuModesCheck, NicLinkCheck,
                 PcieLinkCheck, RoutesCheck)
