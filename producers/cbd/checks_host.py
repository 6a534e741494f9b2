"""Single-host checks (Aegis §6 CBD stage 2, "3 min": GPU kernels, NVLink, HBM, PCIe, CPU,
loading dataset/model/checkpoint) and the critical quick tests of the light profile
(Aegis §4.1 CriticalError evidence: NVML health, pending row remaps, fatal XIDs).

Health checks read the facts; benchmarks run :mod:`producers.cbd.selftest` on the host and
are judged against the baseline (``run``) and then the batch median (``compare``).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from typing import Any

from producers.cbd import facts_view as fv
from producers.cbd.model import ERROR, FAIL, PASS, CheckContext, CheckResult, na
from producers.cbd.targets import HostTarget


class HostCheck:
    name = "host"
    stage = "single_host"
    timeout_s = 10.0
    diagnosis_kind = "critical_error"

    def run(self, target: HostTarget, ctx: CheckContext) -> CheckResult:
        raise NotImplementedError

    def compare(self, results: Mapping[str, CheckResult], ctx: CheckContext
                ) -> dict[str, CheckResult]:
        return dict(results)


def _gpu_absent(facts: Mapping[str, Any]) -> str | None:
    """Why there is no GPU to check here, or None when NVIDIA GPUs are present."""
    nv = fv.nvml(facts)
    if nv.get("available") or fv.nvidia_pci_gpus(facts):
        return None
    return f"no NVIDIA GPU on PCI and {nv.get('reason') or 'NVML unavailable'}"


class NvmlHealthCheck(HostCheck):
    """Every GPU answers NVML; no lost GPU, no uncorrectable ECC since the driver loaded, no
    page retirement pending, not hot while idle."""

    name = "nvml_health"
    timeout_s = 5.0

    def __init__(self, max_idle_temp_c: int = 85) -> None:
        self.max_idle_temp_c = max_idle_temp_c

    def run(self, target: HostTarget, ctx: CheckContext) -> CheckResult:
        facts = ctx.facts.get(target.name, {})
        why = _gpu_absent(facts)
        if why:
            return na(self.name, why)
        nv = fv.nvml(facts)
        if not nv.get("available"):
            return CheckResult(self.name, FAIL, f"{len(fv.nvidia_pci_gpus(facts))} NVIDIA "
                               f"GPU(s) on PCI but {nv.get('reason')}")
        problems = ["NVML reports a GPU lost (fallen off the bus)"] if nv.get("gpu_lost") else []
        for g in nv.get("gpus") or ():
            i = g.get("index")
            if g.get("error"):
                problems.append(f"gpu{i}: {g['error']}")
            errs = [f"{k}: {v['error']}" for k, v in g.items() if fv.is_error(v)]
            problems += [f"gpu{i}: {e}" for e in errs]
            if isinstance(g.get("ecc_uncorrected_volatile"), int) and g[
                    "ecc_uncorrected_volatile"] > 0:
                problems.append(f"gpu{i}: {g['ecc_uncorrected_volatile']} uncorrectable ECC "
                                "error(s)")
            if g.get("retired_pending") in (1, True):
                problems.append(f"gpu{i}: page retirement pending (needs a reset)")
            t = g.get("temp_c")
            if isinstance(t, int) and t > self.max_idle_temp_c:
                problems.append(f"gpu{i}: {t} C before any work (limit {self.max_idle_temp_c})")
        ev = {"gpus": len(nv.get("gpus") or ()), "driver": nv.get("driver")}
        if problems:
            return CheckResult(self.name, FAIL, "; ".join(problems), ev)
        return CheckResult(self.name, PASS, f"{ev['gpus']} GPU(s) healthy", ev)


class RowRemapCheck(HostCheck):
    """Pending row remaps need a GPU reset; a remap failure means the GPU must go."""

    name = "row_remap"
    timeout_s = 5.0

    def run(self, target: HostTarget, ctx: CheckContext) -> CheckResult:
        nv = fv.nvml(ctx.facts.get(target.name, {}))
        if not nv.get("available"):
            return na(self.name, str(nv.get('reason') or 'NVML not available'))
        remaps = {g.get("index"): g.get("remap") for g in nv.get("gpus") or ()}
        known = {i: r for i, r in remaps.items() if isinstance(r, Mapping) and "pending" in r}
        if not known:
            return na(self.name, "row remapping not supported by these GPUs (pre-Ampere)")
        problems = []
        for i, r in sorted(known.items()):
            if r.get("failure"):
                problems.append(f"gpu{i}: row remap failure (no spare rows left)")
            elif r.get("pending"):
                problems.append(f"gpu{i}: row remap pending (reset the GPU)")
        ev = {"remap": {str(i): r for i, r in known.items()}}
        if problems:
            return CheckResult(self.name, FAIL, "; ".join(problems), ev)
        return CheckResult(self.name, PASS, f"no pending remap on {len(known)} GPU(s)", ev)


class XidCheck(HostCheck):
    """Fatal XIDs in the kernel log within ``xid_window_s`` (the previous user's breakage);
    fatal per the project's XID policy (Aegis Phase 1: 48/94/95/79... fatal, 63/64/92 not)."""

    name = "recent_xids"
    timeout_s = 5.0

    def run(self, target: HostTarget, ctx: CheckContext) -> CheckResult:
        from processors.core.xid_policy import default_policy

        facts = ctx.facts.get(target.name, {})
        why = _gpu_absent(facts)
        if why:
            return na(self.name, why)
        xids = facts.get("xids")
        if xids is None:
            return na(self.name, f"kernel log not readable: {facts.get('xids_reason')}")
        window = ctx.config.xid_window_s
        recent = [x for x in xids if x.get("age_s", 0) <= window]
        policy = default_policy()
        fatal = [x for x in recent if policy.is_fatal(int(x["xid"]))]
        ev = {"recent": recent[-20:], "window_s": window}
        if fatal:
            codes = sorted({(x["xid"], x["bus"]) for x in fatal})
            return CheckResult(self.name, FAIL, "fatal XID(s) within "
                               f"{window:g}s: " + ", ".join(f"{c} on {b}" for c, b in codes), ev)
        return CheckResult(self.name, PASS, f"{len(recent)} non-fatal XID(s) within "
                           f"{window:g}s" if recent else "no XID", ev)


class MeasureCheck(HostCheck):
    """Runs one selftest; fails below ``baseline_ratio`` of the baseline, then (compare)
    below ``compute_ratio`` of the batch median."""

    metric = ""  # key in the selftest output
    baseline_key = ""
    kind = ""

    def __init__(self, seconds: float = 1.0, timeout_s: float | None = None) -> None:
        self.seconds = seconds
        self.timeout_s = timeout_s or max(10.0, 10 * seconds)

    def args(self, ctx: CheckContext) -> list[str] | None:
        return [self.kind, "--seconds", str(self.seconds)]

    def run(self, target: HostTarget, ctx: CheckContext) -> CheckResult:
        args = self.args(ctx)
        if args is None:
            return na(self.name, "nothing configured to measure")
        r = target.run(target.module_argv("producers.cbd.selftest", *args), self.timeout_s)
        try:
            out = json.loads(r.stdout)
        except ValueError:
            return CheckResult(self.name, ERROR, f"selftest {self.kind} rc={r.rc}"
                               f"{' (timed out)' if r.timed_out else ''}: {r.stderr[-300:]}")
        if out.get("available") is False:
            return na(self.name, str(out.get("reason")))
        value = float(out[self.metric])
        base = ctx.baseline.get(self.baseline_key)
        ev = {**out, "baseline": base}
        if base and value < ctx.config.baseline_ratio * base:
            return CheckResult(self.name, FAIL, f"{self.metric} {value:g} below "
                               f"{ctx.config.baseline_ratio:g} x baseline {base:g}", ev)
        return CheckResult(self.name, PASS, f"{self.metric} {value:g}", ev)

    def compare(self, results: Mapping[str, CheckResult], ctx: CheckContext
                ) -> dict[str, CheckResult]:
        vals = {h: float(r.evidence[self.metric]) for h, r in results.items()
                if r.status == PASS and self.metric in r.evidence}
        if len(vals) < 3:  # a median of two says nothing about which one is slow
            return dict(results)
        med = statistics.median(vals.values())
        out = dict(results)
        for h, v in vals.items():
            if v < ctx.config.compute_ratio * med:
                r = results[h]
                out[h] = CheckResult(self.name, FAIL, f"{self.metric} {v:g} below "
                                     f"{ctx.config.compute_ratio:g} x batch median {med:g}",
                                     {**r.evidence, "batch_median": med}, r.duration_s)
        return out


class CpuCheck(MeasureCheck):
    name, kind, metric, baseline_key = "cpu_matmul", "cpu", "gflops", "cpu_gflops"
    diagnosis_kind = "slow_compute"


class MemoryCheck(MeasureCheck):
    name, kind, metric, baseline_key = "memory_bandwidth", "mem", "copy_gbps", "mem_copy_gbps"
    diagnosis_kind = "slow_compute"


class ReadSpeedCheck(MeasureCheck):
    """Checkpoint/dataset read speed; not_applicable when no ``read_paths`` are configured."""

    name, kind, metric, baseline_key = "read_speed", "read", "mbps", "read_mbps"
    diagnosis_kind = "slow_compute"

    def args(self, ctx: CheckContext) -> list[str] | None:
        if not ctx.config.read_paths:
            return None
        return ["read", *ctx.config.read_paths, "--mb", str(ctx.config.read_mb)]

    def run(self, target: HostTarget, ctx: CheckContext) -> CheckResult:
        if not ctx.config.read_paths:
            return na(self.name, "no checkpoint or dataset path configured (read_paths)")
        r = super().run(target, ctx)
        floor = ctx.config.read_min_mbps
        if r.status == PASS and floor and float(r.evidence["mbps"]) < floor:
            return CheckResult(self.name, FAIL, f"{r.evidence['mbps']} MB/s below the "
                               f"required {floor:g} MB/s", r.evidence)
        return r

    def compare(self, results: Mapping[str, CheckResult], ctx: CheckContext
                ) -> dict[str, CheckResult]:
        """Rates over less than 32 MB are mostly open/seek latency: not compared."""
        big = {h: r for h, r in results.items() if int(r.evidence.get("bytes", 0)) >= 32 << 20}
        return {**results, **super().compare(big, ctx)}


class GpuBenchCheck(MeasureCheck):
    """GPU compute, HBM, PCIe and NVLink bandwidth with torch+CUDA (only if installed)."""

    name, kind = "gpu_bench", "gpu"
    METRICS = {"tflops": "gpu_tflops", "hbm_gbps": "gpu_hbm_gbps", "pcie_gbps": "gpu_pcie_gbps",
               "nvlink_gbps": "gpu_nvlink_gbps"}

    def run(self, target: HostTarget, ctx: CheckContext) -> CheckResult:
        facts = ctx.facts.get(target.name, {})
        why = _gpu_absent(facts)
        if why:
            return na(self.name, why)
        if not facts.get("torch"):
            return na(self.name, "torch is not installed on this host (CBD never installs it)")
        r = target.run(target.module_argv("producers.cbd.selftest", "gpu", "--seconds",
                                          str(self.seconds)), self.timeout_s)
        try:
            out = json.loads(r.stdout)
        except ValueError:
            return CheckResult(self.name, ERROR, f"gpu selftest rc={r.rc}: {r.stderr[-300:]}")
        if not out.get("available"):
            return na(self.name, str(out.get("reason")))
        problems = []
        for g in out["gpus"]:
            for m, key in self.METRICS.items():
                base = ctx.baseline.get(key)
                if base and m in g and g[m] < ctx.config.baseline_ratio * base:
                    problems.append(f"gpu{g['index']} {m} {g[m]:g} < "
                                    f"{ctx.config.baseline_ratio:g} x baseline {base:g}")
        if problems:
            return CheckResult(self.name, FAIL, "; ".join(problems), out)
        return CheckResult(self.name, PASS, f"{len(out['gpus'])} GPU(s) measured", out)

    def compare(self, results: Mapping[str, CheckResult], ctx: CheckContext
                ) -> dict[str, CheckResult]:
        """A GPU below ``compute_ratio`` of the batch median of the same metric fails."""
        gpus = [(h, g) for h, r in results.items() if r.status == PASS
                for g in r.evidence.get("gpus", ())]
        out = dict(results)
        for m in self.METRICS:
            vals = [g[m] for _, g in gpus if m in g]
            if len(vals) < 3:
                continue
            med = statistics.median(vals)
            for h, g in gpus:
                if m in g and g[m] < ctx.config.compute_ratio * med:
                    prev = out[h]
                    reason = f"gpu{g['index']} {m} {g[m]:g} < {ctx.config.compute_ratio:g} x " \
                             f"batch median {med:g}"
                    out[h] = CheckResult(self.name, FAIL, reason if prev.status != FAIL else
                                         f"{prev.reason}; {reason}", prev.evidence,
                                         prev.duration_s)
        return out
