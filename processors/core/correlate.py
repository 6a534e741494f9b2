"""Multi-metric correlation of Z-score outliers into one Diagnosis per device.

Aegis §5.1: a device is an outlier on a metric when it stays beyond λ±2δ for T. One fault
moves several metrics of the same device (a congested NIC shows ECN marks, CNPs and
retransmits; a throttled GPU shows a low SM clock and a high temperature), so the
:class:`Correlator` waits a short moment of event time after a device's first flag, then
names the device ONCE with every flagged metric as evidence:

- NIC with an abnormal-operation metric up (ECN, retransmits, CNP sent, out-of-sequence, port
  errors; CNPs handled only support), ``nic_link_up`` low, or both
  bandwidth directions low → ``slow_network`` on ``nic<->tor``, action ``run_netdiag``;
- GPU with SM clock, tensor throughput or utilisation low → ``slow_compute`` on the GPU,
  action ``isolate_gpu``; a high temperature supports it. A GPU that is only hotter than
  its peers is not slower (a static spread of a few °C across a chassis always puts some
  GPU past λ+2δ; a throttling one shows its low clock), so temperature alone is an
  ``outlier``;
- anything else (correctable ECC alone included) → ``outlier`` with no action.

Host roll-up: when at least ``max(2, host_rollup_share × its GPUs)`` GPUs of one host are
``slow_compute`` together (a power cap, cooling, a PCIe switch, the host's CPU), the host is
the culprit: ONE ``slow_compute`` diagnosis names the host and its slow GPUs, action
``isolate_host``. Per GPU, the guard would isolate the first and refuse the rest as the same
incident, leaving the job on a host that is slow everywhere.

Switch roll-up (Aegis §2: rail-optimised wiring sends NIC i of every host of a pod to one
ToR): when NICs of at least ``switch_min_hosts`` hosts behind one ToR (or of every one of the
job's hosts behind it, at least 2: a small pod) are ``slow_network`` together, and they are at least ``switch_min_share`` of the job's hosts behind it, ONE
``slow_network`` diagnosis names the switch and its links, action ``run_netdiag`` on the
ToR; NICs behind it flagged later join it silently.

Confidence grows with the number of agreeing metrics. Pure and serialisable.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from processors.core.base import host_wide, link_id, local_id, make_diagnosis, whole_pod
from schemas.inventory import Inventory
from schemas.metrics import metrics_for
from schemas.records import Diagnosis

DETECTOR = "zscore"
RULE = "aegis_5.1_zscore"

# CNPs *handled* mark a sender throttled by congestion elsewhere on its path: they support a
# network finding on the same NIC but do not blame its own link alone.
NETWORK_SUPPORT = frozenset({"nic_cnp_handled_per_s"})
# every other abnormal-operation NIC metric (ECN, CNP sent, retransmits, out-of-seq, port errors)
NETWORK_HIGH = frozenset(m.name for m in metrics_for("nic") if m.abnormal) - NETWORK_SUPPORT
NETWORK_LOW = frozenset({"nic_link_up"})
BANDWIDTH_LOW = frozenset({"nic_tx_bps", "nic_rx_bps"})
COMPUTE_LOW = frozenset({"gpu_sm_clock_mhz", "gpu_tensor_tflops", "gpu_util_pct"})
COMPUTE_SUPPORT = frozenset({"gpu_temp_c"})  # supports a slowdown; alone it is an outlier


@dataclass(frozen=True, slots=True)
class MetricFlag:
    """One metric of one device that stayed beyond its bound for T (Aegis §5.1)."""

    device: str  # culprit name: h0017/gpu3, h0017/nic3, h0017
    device_kind: str  # gpu | nic | host
    host: str
    local: str  # the id the host reported: "3", "mlx5_3", "host"
    metric: str
    direction: str  # "high" | "low": which side of the bound
    value: float  # the device's mean over the sub-window that completed T
    mean: float  # λ over T
    std: float  # δ over T
    bound: float  # the bound it crossed
    window_s: float  # T
    sub_window_s: float  # w
    streak_start: float  # event time since which it has been beyond
    flagged_at: float  # event time (sub-window end) at which the streak reached T

    def evidence(self) -> dict[str, Any]:
        z = (self.value - self.mean) / self.std if self.std > 0 else None
        return {"value": self.value, "mean": self.mean, "std": self.std, "bound": self.bound,
                "direction": self.direction, "z": z, "window_s": self.window_s,
                "sub_window_s": self.sub_window_s, "streak_start": self.streak_start,
                "flagged_at": self.flagged_at}


def _nic_index(nics: tuple[str, ...], local: str) -> int | None:
    """The NIC's index in the host's listed ``nics``, as :func:`base.nic_named` counts: a
    listed name (``mlx5_4``, or ``mlx5_4`` for a listed ``mlx5_4/1``), a rail index
    ``nicN`` (the agent's ids), or with no NICs listed the name's digits; None if unknown."""
    if local in nics:
        return nics.index(local)
    bare = [n.partition("/")[0] for n in nics]
    if bare.count(local) == 1:
        return bare.index(local)
    if local.startswith("nic") and local[3:].isdigit():
        return int(local[3:])
    if nics:
        return None  # a port the host does not list (management, storage): no rail's ToR
    tail = local.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else None


def tor_for(inventory: Inventory | None, host: str, local: str) -> str:
    """The ToR switch a NIC connects to, from the Inventory; ``"tor"`` when unknown."""
    hi = inventory.hosts.get(host) if inventory is not None else None
    if hi is None:
        return "tor"
    idx = _nic_index(hi.nics, local_id(host, local))
    if idx is not None and 0 <= idx < len(hi.tor) and hi.tor[idx]:
        return hi.tor[idx]
    return "tor"


def classify(device_kind: str, flags: Mapping[str, MetricFlag]) -> tuple[str, list[str]]:
    """``(diagnosis kind, metrics that support it)`` for one device's flagged metrics."""
    def up(names: frozenset[str]) -> list[str]:
        return sorted(m for m in names & flags.keys() if flags[m].direction == "high")

    def down(names: frozenset[str]) -> list[str]:
        return sorted(m for m in names & flags.keys() if flags[m].direction == "low")

    if device_kind == "nic":
        bandwidth = down(BANDWIDTH_LOW)
        triggers = up(NETWORK_HIGH) + down(NETWORK_LOW)
        if triggers or len(bandwidth) == len(BANDWIDTH_LOW):
            return "slow_network", sorted(triggers + bandwidth + up(NETWORK_SUPPORT))
    if device_kind == "gpu":
        triggers = down(COMPUTE_LOW)
        if triggers:
            return "slow_compute", sorted(triggers + up(COMPUTE_SUPPORT))
    return "outlier", sorted(flags)


def confidence(kind: str, agreeing: int) -> float:
    """More agreeing metrics, more confidence; a lone outlier stays modest."""
    if kind == "outlier":
        return min(0.6, 0.45 + 0.05 * (agreeing - 1))
    return min(0.95, 0.6 + 0.1 * (agreeing - 1))


class Correlator:
    """Collects MetricFlags per device and emits one Diagnosis per device and kind.

    A device's first flag opens a wait of ``wait_s`` event seconds; flags of the same device
    that arrive (by ``flagged_at``) within it join the same diagnosis. Later flags of a device
    that was already diagnosed only produce a new diagnosis if they change its kind (an ECC
    ``outlier`` followed by a low SM clock becomes ``slow_compute``). ``release(device)`` —
    called when all of the device's incidents have ended — forgets the device.
    """

    def __init__(self, job: str, wait_s: float, inventory: Inventory | None = None,
                 host_gpus: Callable[[str], int] | None = None,
                 host_rollup_share: float = 0.0,
                 job_hosts: Callable[[], Collection[str]] | None = None,
                 switch_min_hosts: int = 0, switch_min_share: float = 0.0) -> None:
        self.job = job
        self.wait_s = float(wait_s)
        self.inventory = inventory
        self.host_gpus = host_gpus  # host -> how many of its GPUs are scored; None: no roll-up
        self.host_rollup_share = host_rollup_share  # 0: no roll-up
        self.job_hosts = job_hosts  # the job's hosts seen so far; None: no switch roll-up
        self.switch_min_hosts = switch_min_hosts  # 0: no switch roll-up
        self.switch_min_share = switch_min_share
        self._devices: dict[str, dict[str, Any]] = {}

    def add(self, flag: MetricFlag) -> None:
        d = self._devices.setdefault(flag.device, {"flags": {}, "new": [], "deadline": None,
                                                   "emitted": []})
        d["flags"][flag.metric] = flag
        if flag.metric not in d["new"]:
            d["new"].append(flag.metric)
        if d["deadline"] is None:
            d["deadline"] = flag.flagged_at + self.wait_s

    def due(self, now: float, *, inclusive: bool = True) -> list[Diagnosis]:
        """Diagnoses whose wait ended at or before ``now`` (strictly before when not
        ``inclusive``), in (deadline, device) order."""
        ready = sorted((d["deadline"], dev) for dev, d in self._devices.items()
                       if d["deadline"] is not None
                       and (d["deadline"] <= now if inclusive else d["deadline"] < now))
        out = []
        for deadline, dev in ready:
            if self._devices[dev]["deadline"] is None:
                continue  # named by its host's roll-up
            if self._under_named_switch(dev):
                continue
            diag = (self._rollup(dev, deadline) or self._switch_rollup(dev, deadline)
                    or self._emit(dev, deadline))
            if diag is not None:
                out.append(diag)
        return out

    def release(self, device: str) -> None:
        d = self._devices.get(device)
        if d is not None and d["deadline"] is None:
            del self._devices[device]

    def pending(self) -> int:
        return sum(1 for d in self._devices.values() if d["deadline"] is not None)

    def _emit(self, device: str, deadline: float) -> Diagnosis | None:
        d = self._devices[device]
        flags: dict[str, MetricFlag] = d["flags"]
        d["deadline"], d["new"] = None, []
        kind, support = classify(next(iter(flags.values())).device_kind, flags)
        if kind in d["emitted"]:
            return None
        d["emitted"].append(kind)
        return self._diagnosis(kind, support, flags, deadline)

    def _rollup(self, device: str, deadline: float) -> Diagnosis | None:
        """One diagnosis for a host whose GPUs are slow together (see the module doc)."""
        flags = self._devices[device]["flags"]
        first = next(iter(flags.values()))
        if (self.host_gpus is None or first.device_kind != "gpu"
                or classify("gpu", flags)[0] != "slow_compute"):
            return None
        host = first.host
        slow = sorted(dev for dev, d in self._devices.items()
                      if (f := next(iter(d["flags"].values()))).device_kind == "gpu"
                      and f.host == host and classify("gpu", d["flags"])[0] == "slow_compute")
        if not host_wide(len(slow), self.host_gpus(host), self.host_rollup_share):
            return None
        fresh = [g for g in slow if "slow_compute" not in self._devices[g]["emitted"]]
        for g in fresh:
            d = self._devices[g]
            d["deadline"], d["new"] = None, []
            d["emitted"].append("slow_compute")
        per = {g: self._devices[g]["flags"] for g in fresh}
        support = {g: classify("gpu", per[g])[1] for g in fresh}
        names = sorted({m for f in per.values() for m in f})
        window = first.window_s
        evidence = {"device": host, "device_kind": "gpu", "host_gpus": self.host_gpus(host),
                    "devices": {g: {"metrics": {m: per[g][m].evidence() for m in sorted(per[g])},
                                    "agreeing": support[g]} for g in fresh},
                    "agreeing": sorted({m for v in support.values() for m in v}),
                    "window_s": window, "actions": [["isolate_host", host]]}
        return make_diagnosis(
            job=self.job, kind="slow_compute", detector=DETECTOR, rule=RULE,
            event_ts=min(per[g][m].streak_start for g in fresh for m in support[g]),
            detected_ts=deadline, hosts=[host], gpus=fresh, links=[], evidence=evidence,
            confidence=confidence("slow_compute", max(len(v) for v in support.values()) + 1),
            summary=f"{host}: {len(slow)} of its {self.host_gpus(host)} GPUs slow together "
                    f"({', '.join(names)}) throughout {window:g}s (cross-device λ±2δ, Aegis "
                    "§5.1): the host, not one GPU")

    # ---- the switch roll-up ----------------------------------------------------------------
    def _slow_nic_tor(self, device: str) -> str | None:
        """The known ToR of a NIC device whose flags make it ``slow_network``, else None."""
        flags = self._devices[device]["flags"]
        first = next(iter(flags.values()))
        if first.device_kind != "nic" or classify("nic", flags)[0] != "slow_network":
            return None
        tor = tor_for(self.inventory, first.host, first.local)
        return None if tor == "tor" else tor

    def _under_named_switch(self, device: str) -> bool:
        """A slow NIC behind a switch already named: it joins that diagnosis, silently."""
        if self.switch_min_hosts < 1 or (tor := self._slow_nic_tor(device)) is None:
            return False
        mark = "switch:" + tor
        if not any(mark in d["emitted"] for d in self._devices.values()):
            return False
        d = self._devices[device]
        d["deadline"], d["new"] = None, []
        d["emitted"] += [k for k in ("slow_network", mark) if k not in d["emitted"]]
        return True

    def _switch_rollup(self, device: str, deadline: float) -> Diagnosis | None:
        """One diagnosis for a ToR whose NICs are slow together (see the module doc)."""
        if self.switch_min_hosts < 1 or self.job_hosts is None or self.inventory is None:
            return None
        tor = self._slow_nic_tor(device)
        if tor is None:
            return None
        nics = sorted(dev for dev in self._devices if self._slow_nic_tor(dev) == tor)
        hosts = sorted({next(iter(self._devices[n]["flags"].values())).host for n in nics})
        inv = self.inventory.hosts
        behind = [h for h in self.job_hosts() if h in inv and tor in inv[h].tor]
        if (len(hosts) < self.switch_min_hosts and not whole_pod(len(hosts), len(behind))) \
                or len(hosts) < self.switch_min_share * len(behind):
            return None
        per = {n: self._devices[n]["flags"] for n in nics}
        support = {n: classify("nic", per[n])[1] for n in nics}
        for n in nics:
            d = self._devices[n]
            d["deadline"], d["new"] = None, []
            d["emitted"] += [k for k in ("slow_network", "switch:" + tor) if k not in d["emitted"]]
        names = sorted({m for v in support.values() for m in v})
        window = next(iter(per[device].values())).window_s
        evidence = {"device": tor, "device_kind": "switch", "switch_hosts": len(hosts),
                    "switch_behind": len(behind),
                    "devices": {n: {"metrics": {m: per[n][m].evidence() for m in sorted(per[n])},
                                    "agreeing": support[n]} for n in nics},
                    "agreeing": names, "window_s": window, "actions": [["run_netdiag", tor]]}
        return make_diagnosis(
            job=self.job, kind="slow_network", detector=DETECTOR, rule=RULE,
            event_ts=min(per[n][m].streak_start for n in nics for m in support[n]),
            detected_ts=deadline, hosts=hosts, gpus=[], links=[link_id(n, tor) for n in nics],
            evidence=evidence, confidence=confidence("slow_network", len(names)),
            summary=f"ToR {tor}: NICs of {len(hosts)} of the job's {len(behind)} hosts behind it "
                    f"abnormal together ({', '.join(names)}) throughout {window:g}s "
                    "(cross-device λ±2δ, Aegis §5.1): the switch, not each link")

    def _diagnosis(self, kind: str, support: list[str], flags: Mapping[str, MetricFlag],
                   detected: float) -> Diagnosis:
        first = flags[support[0]]
        host, device = first.host, first.device
        links: list[str] = []
        gpus: list[str] = []
        actions: list[list[str]] = []
        if kind == "slow_network":
            links = [link_id(device, tor_for(self.inventory, host, first.local))]
            actions = [["run_netdiag", links[0]]]
        elif kind == "slow_compute":
            gpus = [device]
            actions = [["isolate_gpu", device]]
        elif first.device_kind == "gpu":
            gpus = [device]
        event_ts = min(flags[m].streak_start for m in support)
        parts = [f"{m} {flags[m].value:.4g} {'above' if flags[m].direction == 'high' else 'below'}"
                 f" {flags[m].bound:.4g}" for m in sorted(flags)]
        summary = (f"{device}: {', '.join(parts)} throughout {first.window_s:g}s "
                   f"(cross-device λ±2δ, Aegis §5.1)")
        evidence = {"device": device, "device_kind": first.device_kind,
                    "metrics": {m: flags[m].evidence() for m in sorted(flags)},
                    "agreeing": support, "window_s": first.window_s, "actions": actions}
        return make_diagnosis(job=self.job, kind=kind, detector=DETECTOR, rule=RULE,
                              event_ts=event_ts, detected_ts=detected, hosts=[host], gpus=gpus,
                              links=links, evidence=evidence,
                              confidence=confidence(kind, len(support)), summary=summary)

    def snapshot(self) -> dict[str, Any]:
        return {dev: {"flags": [asdict(f) for f in d["flags"].values()], "new": list(d["new"]),
                      "deadline": d["deadline"], "emitted": list(d["emitted"])}
                for dev, d in self._devices.items()}

    @classmethod
    def restore(cls, state: Mapping[str, Any], job: str, wait_s: float,
                inventory: Inventory | None = None,
                host_gpus: Callable[[str], int] | None = None,
                host_rollup_share: float = 0.0,
                job_hosts: Callable[[], Collection[str]] | None = None,
                switch_min_hosts: int = 0, switch_min_share: float = 0.0) -> Correlator:
        c = cls(job, wait_s, inventory, host_gpus, host_rollup_share, job_hosts,
                switch_min_hosts, switch_min_share)
        for dev, d in state.items():
            flags = {f["metric"]: MetricFlag(**f) for f in d["flags"]}
            c._devices[dev] = {"flags": flags, "new": list(d["new"]), "deadline": d["deadline"],
                               "emitted": list(d["emitted"])}
        return c
