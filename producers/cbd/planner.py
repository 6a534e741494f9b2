"""Topology-aware test groups: which hosts test together, and which groups run in parallel.

Aegis Alg. 1 OfflineDiag: "reproduction with a reference model on host segments grouped by
ToR, so that parallel tests don't share links"; the same plan drives CBD's multi-host stage.

Fabric model (rail-optimised, as in producers.sim.topology): NIC i of a host connects to
its rail-i ToR (``tor-p{pod}-r{i}``); every ToR has uplinks to aggregation switches (the
simulator's ``n_agg``; here every ToR connects to every ``agg-{k}``, a two-tier Clos).

**Links a test uses.** Two hosts a and b testing together on rail r use the access links
``a/nic{r}<->ToR_a[r]`` and ``b/nic{r}<->ToR_b[r]``; when ``ToR_a[r] != ToR_b[r]`` the
traffic crosses the aggregation layer, and since ECMP may hash it onto any uplink, it uses
every uplink ``ToR<->agg-k`` of both ToRs. A group may run any collective among its hosts,
so its link set is the union over all its pairs and rails (rails are tested rail-aligned:
cross-rail traffic goes over NVLink inside a host, as NCCL's PXN does).

**Share a link.** Two groups share a link when their link sets intersect. Groups in the
same stage never do, so they run in parallel without disturbing each other (they may share
a switch, whose fabric is non-blocking; they never share a cable or a switch port).

Plan: stage 0 holds the ToR segments (hosts with the same ToRs, at most ``max_group`` per
segment); then cross-ToR groups (one segment of each of two ToR buckets) so every ToR's
uplinks are exercised; groups are placed greedily into the first stage where they share
no link with the groups already there.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from processors.core.base import link_id, make_diagnosis, nic_id
from schemas.inventory import Inventory
from schemas.records import Diagnosis

LINK_RULE = ("two groups share a link when their link sets intersect; a group's links are, "
             "for every pair of its hosts and every rail r, both hosts' NIC r access links "
             "and, when their rail-r ToRs differ, every uplink of both ToRs (ECMP)")


@dataclass(frozen=True)
class Fabric:
    """``host_tors[host][r]`` = ToR of NIC r; ``uplinks[tor]`` = aggregation switches."""

    host_tors: Mapping[str, tuple[str, ...]]
    uplinks: Mapping[str, tuple[str, ...]]

    @classmethod
    def from_topology(cls, topo: Any) -> Fabric:
        """From producers.sim.topology.Topology (every ToR up to every ``agg-k``)."""
        return cls.from_inventory(topo.to_inventory(), n_agg=topo.n_agg)

    @classmethod
    def from_inventory(cls, inv: Inventory, uplinks: Mapping[str, Sequence[str]] | None = None,
                       n_agg: int = 8) -> Fabric:
        tors = {h.host: tuple(h.tor) for h in inv.hosts.values() if h.tor}
        aggs = tuple(f"agg-{k}" for k in range(n_agg))
        up = {t: tuple(uplinks[t]) if uplinks and t in uplinks else aggs
              for ts in tors.values() for t in ts}
        return cls(tors, up)

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> Fabric:
        """``{"hosts": {host: [tor per rail]}, "uplinks": {tor: [agg...]}, "n_agg": 8}``, or
        an Inventory document (``hosts`` as a list) with optional ``uplinks``/``n_agg``."""
        hosts = d.get("hosts")
        if isinstance(hosts, list):
            return cls.from_inventory(Inventory.from_wire(d), d.get("uplinks"),
                                      int(d.get("n_agg", 8)))
        if not isinstance(hosts, Mapping):
            raise ValueError("topology: 'hosts' must map host -> [ToR per rail]")
        tors = {str(h): tuple(str(t) for t in ts) for h, ts in hosts.items()}
        aggs = tuple(f"agg-{k}" for k in range(int(d.get("n_agg", 8))))
        given = d.get("uplinks") or {}
        up = {t: tuple(given.get(t, aggs)) for ts in tors.values() for t in ts}
        return cls(tors, up)

    def to_wire(self) -> dict[str, Any]:
        return {"hosts": {h: list(t) for h, t in self.host_tors.items()},
                "uplinks": {t: list(u) for t, u in self.uplinks.items()}}


def pair_links(fabric: Fabric, a: str, b: str) -> frozenset[str]:
    ta, tb = fabric.host_tors.get(a, ()), fabric.host_tors.get(b, ())
    out: set[str] = set()
    for r in range(min(len(ta), len(tb))):
        out.add(link_id(nic_id(a, r), ta[r]))
        out.add(link_id(nic_id(b, r), tb[r]))
        if ta[r] != tb[r]:
            for t in (ta[r], tb[r]):
                out.update(link_id(t, u) for u in fabric.uplinks.get(t, ()))
    return frozenset(out)


def group_links(fabric: Fabric, hosts: Iterable[str]) -> frozenset[str]:
    hs = sorted(set(hosts))
    out: set[str] = set()
    for a, b in itertools.combinations(hs, 2):
        out |= pair_links(fabric, a, b)
    return frozenset(out)


@dataclass
class TestGroup:
    id: str
    kind: str  # tor_segment | cross_tor | unplaced
    hosts: list[str]
    tors: list[str]
    links: frozenset[str] = field(default_factory=frozenset)

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "hosts": list(self.hosts),
                "tors": list(self.tors), "links": len(self.links)}


@dataclass
class Plan:
    stages: list[list[TestGroup]]
    max_group: int

    def groups(self) -> list[TestGroup]:
        return [g for s in self.stages for g in s]

    def to_wire(self) -> dict[str, Any]:
        return {"max_group": self.max_group, "link_rule": LINK_RULE,
                "stages": [[g.to_wire() for g in s] for s in self.stages]}


def _segments(hosts: list[str], max_group: int) -> list[list[str]]:
    """Split into ceil(n / max_group) segments whose sizes differ by at most one."""
    k = -(-len(hosts) // max_group)
    base, extra = divmod(len(hosts), k)
    out, i = [], 0
    for j in range(k):
        size = base + (1 if j < extra else 0)
        out.append(hosts[i:i + size])
        i += size
    return out


def plan_groups(hosts: Iterable[str], fabric: Fabric, max_group: int = 8,
                cross_tor: bool = True) -> Plan:
    if max_group < 2:
        raise ValueError(f"max_group={max_group}: a test group needs at least 2 hosts")
    buckets: dict[tuple[str, ...], list[str]] = {}
    unplaced = []
    for h in sorted(set(hosts)):
        if h in fabric.host_tors:
            buckets.setdefault(fabric.host_tors[h], []).append(h)
        else:
            unplaced.append(h)
    groups: list[TestGroup] = []
    segs: dict[tuple[str, ...], list[list[str]]] = {}
    for key in sorted(buckets):
        segs[key] = _segments(buckets[key], max_group)
        for s in segs[key]:
            groups.append(TestGroup(f"seg{len(groups)}", "tor_segment", s, sorted(set(key)),
                                    group_links(fabric, s)))
    keys = sorted(buckets)
    if cross_tor and len(keys) > 1:
        half = max(1, max_group // 2)
        pairs = [(keys[i], keys[i + 1]) for i in range(0, len(keys) - 1, 2)]
        if len(keys) % 2:
            pairs.append((keys[-1], keys[0]))
        for ka, kb in pairs:
            hs = segs[ka][0][:half] + segs[kb][0][:half]
            groups.append(TestGroup(f"cross{len(groups)}", "cross_tor", hs,
                                    sorted(set(ka) | set(kb)), group_links(fabric, hs)))
    stages: list[list[TestGroup]] = []
    used: list[set[str]] = []
    for g in groups:
        for i, u in enumerate(used):
            if not (g.links & u):
                stages[i].append(g)
                u |= g.links
                break
        else:
            stages.append([g])
            used.append(set(g.links))
    if unplaced:  # no topology known: test them alone, after everything else
        stages.append([TestGroup("unplaced", "unplaced", unplaced, [])])
    return Plan(stages, max_group)


def offline_diag_diagnosis(job: str, hosts: Iterable[str], fabric: Fabric, event_ts: float,
                           detected_ts: float, reason: str, max_group: int = 8) -> Diagnosis:
    """Aegis Alg. 1 OfflineDiag: the ``offline_needed`` Diagnosis whose ``run_offline_diag``
    action carries the plan (ToR segments, then cross-ToR groups, link-disjoint stages)."""
    hs = sorted(set(hosts))
    plan = plan_groups(hs, fabric, max_group)
    return make_diagnosis(
        job=job, kind="offline_needed", detector="cbd_planner", rule="offline_diag_plan",
        event_ts=event_ts, detected_ts=detected_ts, hosts=hs,
        evidence={"plan": plan.to_wire(), "reason": reason, "actions": [["run_offline_diag", job]]},
        confidence=0.5,
        summary=f"offline diagnosis of {len(hs)} host(s) in {len(plan.stages)} stage(s) of "
                f"link-disjoint groups: {reason}"[:4096])
