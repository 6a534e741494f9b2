"""What every detector looks like, and how a finding becomes a Diagnosis.

A detector is a small class over one job's records in event time:

- ``observe(record)`` takes one decoded record of its topic and returns the Diagnoses it
  completes, plus rejections (bad values, late samples) as :class:`Rejection` outputs;
- ``advance(now)`` moves its event-time watermark to ``now`` (the newest event time seen on
  the job's inputs) and returns the Diagnoses that time alone completes (stalls, windows);
- ``snapshot()`` returns plain msgpack/JSON-able state; ``restore(state, config)`` rebuilds it.

Time is always the records' event time (epoch seconds); nothing here reads the clock.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from schemas.errors import ConfigError
from schemas.records import Culprits, Diagnosis, diagnosis_id

if TYPE_CHECKING:
    from schemas.inventory import Inventory


@dataclass(frozen=True, slots=True)
class Rejection:
    """An input a detector refused, with the reason. Counted and surfaced, never silent."""

    detector: str
    job: str
    host: str
    reason: str  # short code: not_finite, negative_counter, late, unknown_metric, ...
    detail: str = ""
    ts: float = 0.0


@dataclass(slots=True)
class Outputs:
    """What one call into a detector produced."""

    diagnoses: list[Diagnosis] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)

    def extend(self, other: Outputs) -> Outputs:
        self.diagnoses.extend(other.diagnoses)
        self.rejections.extend(other.rejections)
        return self


class Detector(Protocol):
    name: str

    def observe(self, record: Any) -> Outputs: ...

    def advance(self, now: float) -> Outputs: ...

    def snapshot(self) -> dict[str, Any]: ...


def make_diagnosis(
    *,
    job: str,
    kind: str,
    detector: str,
    rule: str,
    event_ts: float,
    detected_ts: float,
    hosts: Iterable[str] = (),
    gpus: Iterable[str] = (),
    links: Iterable[str] = (),
    evidence: Mapping[str, Any] | None = None,
    confidence: float = 0.9,
    summary: str = "",
) -> Diagnosis:
    """Build a Diagnosis whose id is derived from job, kind, rule, culprits and ``event_ts``.

    ``event_ts`` must be a property of the fault (the first evidence's event time), so a
    replay or a restart re-derives the same id and sinks can drop the duplicate.
    """
    culprits = Culprits(tuple(sorted(set(hosts))), tuple(sorted(set(gpus))),
                        tuple(sorted(set(links))))
    ev = {"rule": rule, **(dict(evidence) if evidence else {})}
    did = diagnosis_id(job, kind, culprits, rule, event_ts)
    return Diagnosis(id=did, job=job, kind=kind, culprits=culprits, evidence=ev,
                     confidence=round(float(confidence), 4), event_ts=float(event_ts),
                     detected_ts=float(detected_ts), detector=detector, summary=summary)


def beyond_few(n: int, total: int, floor: int, share: float) -> bool:
    """More than ``max(floor, share x total)``: not "a few hosts that differ" (Aegis §5.1's
    limit) but a population of its own (a pipeline stage, a rack, a hardware mix)."""
    return n > max(floor, share * total)


def whole_pod(troubled: int, behind: int) -> bool:
    """Every one of the job's hosts behind a ToR, at least 2, troubled on it: a small pod's
    switch, though fewer hosts than a switch roll-up's ``switch_min_hosts``."""
    return 2 <= troubled == behind


def check_snapshot_v1(state: Mapping[str, Any], what: str) -> None:
    """A detector snapshot must be version 1: else a ConfigError naming ``what``."""
    if state.get("v") != 1:
        raise ConfigError(f"{what} snapshot v{state.get('v')} not readable (reads v1)")


def host_wide(slow: int, gpus: int, share: float) -> bool:
    """At least ``max(2, share x the host's GPUs)`` of them slow together: the host is the
    culprit, not one GPU (``share`` 0: never)."""
    return share > 0 and slow >= max(2, math.ceil(share * gpus))


def gpu_id(host: str, gpu: int) -> str:
    """Culprit name of a GPU: ``h017/gpu3``."""
    return f"{host}/gpu{gpu}"


def nic_id(host: str, nic: int | str) -> str:
    """Culprit name of a NIC port: ``h017/nic3`` (index) or ``h017/mlx5_3`` (device name)."""
    return f"{host}/nic{nic}" if isinstance(nic, int) else f"{host}/{nic}"


def local_id(host: str, name: str) -> str:
    """A device id without its host: ``h/nic3`` → ``nic3`` (the agent keys devices by full
    name); any other id as it is."""
    if name.startswith(host) and name[len(host):len(host) + 1] == "/":
        return name[len(host) + 1:]
    return name


def restart_actions(job: str, hosts: Container[str]) -> list[list[str]]:
    """``[["restart_job", job]]``, or none when the job key is one of ``hosts``: records
    without a job id are keyed by their host, and an idle host has no job to restart."""
    return [] if job in hosts else [["restart_job", job]]


def nic_named(inventory: Inventory | None, host: str, device: str) -> str:
    """Culprit name of a NIC a record or log line calls ``device`` (``mlx5_4``): ``h/nicN``
    with N its index in the host's listed ``nics``, as the CCL detectors count; a device
    those ``nics`` lack keeps its name (``h/mlx5_0``, a management port beside the rails);
    with no NICs listed, the digits of the name (``mlx5_3`` → ``h/nic3``)."""
    device = local_id(host, device)
    hi = inventory.hosts.get(host) if inventory is not None else None
    if hi is not None and hi.nics:
        if device in hi.nics:
            return nic_id(host, hi.nics.index(device))
        bare = [n.partition("/")[0] for n in hi.nics]  # "mlx5_4/1" lists device/port
        return nic_id(host, bare.index(device) if bare.count(device) == 1 else device)
    tail = device[5:] if device.startswith("mlx5_") else device
    return nic_id(host, int(tail)) if tail.isdigit() else nic_id(host, device)


def nic_listed(inventory: Inventory | None, host: str, device: str) -> bool:
    """False for a NIC the host's listed ``nics`` lack (a management or storage port beside
    the rails): it carries none of the job's traffic, so it is no peer of the rails. A rail
    index ``nicN`` is listed when N is below the count; no NICs listed: every NIC is."""
    hi = inventory.hosts.get(host) if inventory is not None else None
    if hi is None or not hi.nics:
        return True
    device = local_id(host, device)
    if device.startswith("nic") and device[3:].isdigit():
        return int(device[3:]) < len(hi.nics)
    return device in hi.nics or device in [n.partition("/")[0] for n in hi.nics]


def link_id(a: str, b: str) -> str:
    """Culprit name of a link between two endpoints, order-independent: ``a<->b``."""
    x, y = sorted((a, b))
    return f"{x}<->{y}"
