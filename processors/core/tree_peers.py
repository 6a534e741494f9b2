"""Who a distributed symptom connects (Aegis Alg. 1 DistError / RootDiag / NetDiag): the host
and GPU a log line's peer address or rank names, the failed connections (edges) of a burst,
the links NetDiag should check, and which end of a 2-host error is the root. Used by :class:`processors.core.decision_tree.DecisionTree`.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from processors.core.base import link_id, nic_named, whole_pod
from processors.core.root_diag import Edge
from processors.core.tree_events import (
    HOST_SIDE,
    LOCAL_HCA_RULES,
    PEER_DOWN_RULES,
    DecisionTreeConfig,
    TreeEvent,
    is_config,
)
from schemas.inventory import Inventory

_LOOPBACK = frozenset(("::1", "localhost", "0.0.0.0"))


class JobPeers:
    """Resolves peers against the inventory, the job's rank map and roster, and the hosts
    that logged under the job's key (``seen``, shared with the tree and grown by it)."""

    def __init__(self, job: str, inventory: Inventory | None, seen: set[str]) -> None:
        self.inventory = inventory
        self.job_hosts = frozenset(inventory.jobs.get(job, ())) if inventory else frozenset()
        self.ranks = inventory.ranks.get(job, {}) if inventory else {}
        self.seen = seen
        self._gpus: dict[str, set[int]] | None = None  # host -> the job's GPUs there

    def other_jobs_gpu(self, host: str, gpu: int) -> bool:
        """True when the job's rank map places it on other GPUs of ``host`` (a host shared by
        jobs): a fault of that GPU is another job's, unless it takes the whole host."""
        if not self.ranks:
            return False
        if self._gpus is None:
            self._gpus = {}
            for h, g in self.ranks.values():
                self._gpus.setdefault(h, set()).add(g)
        mine = self._gpus.get(host)
        return mine is not None and gpu >= 0 and gpu not in mine

    @property
    def members(self) -> frozenset[str] | set[str]:
        """Hosts of the job: its roster when the inventory has one, else the hosts that
        logged under its key (a host-keyed record has no job: its peers are not "of" it)."""
        return self.job_hosts or self.seen

    def host_of(self, e: TreeEvent) -> tuple[str | None, int | None]:
        """(host, GPU or None) of the other end a line names, or (None, None)."""
        if e.peer_rank is not None and e.peer_rank in self.ranks:
            return self.ranks[e.peer_rank]
        if not e.peer:
            return None, None
        if e.peer.startswith("[") and "]" in e.peer:  # [ipv6]:port
            addr = e.peer[1:e.peer.index("]")]
        else:
            addr = e.peer.rsplit(":", 1)[0] if e.peer.count(":") == 1 else e.peer
        if addr in _LOOPBACK or addr.startswith(("127.", "::ffff:127.")):
            return e.host, None  # a connection inside the host (Gloo's, the c10d store's)
        inv = self.inventory
        if inv is not None:
            host = inv.host_for_ip(addr)
            if host is not None:
                return host, inv.hosts[host].gpu_for_ip(addr)
            if addr in inv.hosts:
                return addr, None
        for name in (addr, addr.split(".")[0]):
            if name in self.job_hosts or name in self.seen:
                return name, None
        return None, None

    def own_gpu(self, e: TreeEvent) -> int | None:
        if e.rank is not None and e.rank in self.ranks and self.ranks[e.rank][0] == e.host:
            return self.ranks[e.rank][1]
        return e.gpu

    def endpoints(self, dist: Sequence[TreeEvent]) -> tuple[set[str], list[Edge], set[str]]:
        """(hosts involved, failed connections, links to peer addresses no host answers to).
        A lone reporter's unresolved peers count as involved (``?addr``)."""
        involved = {e.host for e in dist}
        edges: list[Edge] = []
        unresolved: set[str] = set()
        stray: set[str] = set()
        for e in dist:
            ph, pg = self.host_of(e)
            if ph is not None:
                involved.add(ph)
                if ph != e.host:
                    edges.append((e.ts, (e.host, self.own_gpu(e)), (ph, pg)))
            elif e.peer:
                addr = e.peer.rsplit(":", 1)[0]
                unresolved.add("?" + addr)
                stray.add(link_id(e.host, addr))
        if len(involved) == 1:
            involved |= unresolved
        return involved, sorted(edges, key=lambda x: (x[0], x[1][0], x[2][0])), stray


def suspect_links(events: Sequence[TreeEvent], edges: Sequence[Edge],
                  stray: AbstractSet[str] = frozenset(),
                  inventory: Inventory | None = None) -> list[str]:
    """Links of resolved connection errors, NICs that logged faults (named as every detector
    names them, ``base.nic_named``), and a reporter's link to a peer address outside the job
    (a connection to a host we cannot name)."""
    links = {link_id(a[0], b[0]) for _, a, b in edges} | stray
    links |= {nic_named(inventory, e.host, e.device) if e.device else e.host
              for e in events if e.cat == "nic_or_link"}
    return sorted(links)


def switch_of_nics(events: Sequence[TreeEvent], inventory: Inventory | None,
                   members: AbstractSet[str], cfg: DecisionTreeConfig) -> tuple[str, list[str]] | None:
    """Aegis §2 rail-optimised wiring: NIC i of every host of a pod meets one ToR, so NIC
    faults (link down, port errors) logged by at least ``switch_min_hosts`` hosts behind one
    ToR (or by every one of the job's hosts behind it, at least 2: a small pod), more than half
    of the hosts with NIC faults and at least ``switch_min_share`` of the job's hosts behind
    it, are that switch's: (ToR, their NIC↔ToR links), else None."""
    min_hosts, min_share = cfg.switch_min_hosts, cfg.switch_min_share
    if min_hosts < 1 or inventory is None:
        return None
    by_tor: dict[str, dict[str, str]] = {}
    faulted: set[str] = set()
    for e in events:
        if e.cat != "nic_or_link" or not e.device:
            continue
        faulted.add(e.host)
        hi, nic = inventory.hosts.get(e.host), nic_named(inventory, e.host, e.device)
        idx = nic.rpartition("/nic")[2]
        if hi is not None and idx.isdigit() and int(idx) < len(hi.tor) and hi.tor[int(idx)]:
            by_tor.setdefault(hi.tor[int(idx)], {})[e.host] = nic
    if not by_tor:
        return None
    tor, under = min(by_tor.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    behind = [h for h in members if h in inventory.hosts and tor in inventory.hosts[h].tor]
    if (len(under) < min_hosts and not whole_pod(len(under), len(behind))) or 2 * len(under) <= len(faulted) \
            or len(under) < min_share * len(behind):
        return None
    return tor, sorted(link_id(n, tor) for n in under.values())


def one_end_at_fault(events: Sequence[TreeEvent], ends: Sequence[str]) -> tuple[str, str] | None:
    """Aegis Alg. 1 isolates both ends of errors between 2 hosts, since the link between
    them cannot tell which failed. When one end has a fault of its own in the burst (a
    host-side event, or a configuration error) and the other none, that end is the root
    and the other only lost its connection to it, as when the first of a crashed host's
    peers reports before the rest: ("host" or "config", that end), else None. An async event
    of the end's own HCA (NCCL's ``Got async event : port error``) is such a fault: its port
    went down, and the other end only lost the link to it (lit-llama#380). When both ends
    have a configuration error and nothing else, the pair is ConfigCheck's too. When one
    end's scheduler or runtime says the other is down (``PEER_DOWN_RULES``), the other end
    is the root ("host")."""
    saying = [h for h in ends if any(e.host == h and e.rule in PEER_DOWN_RULES for e in events)]
    if len(saying) == 1:
        return "host", ends[1] if saying[0] == ends[0] else ends[0]
    kinds = [{"host" if e.cat in HOST_SIDE or e.rule in LOCAL_HCA_RULES else "config"
              for e in events if e.host == h and e.sev != "info"
              and (e.cat in HOST_SIDE or e.rule in LOCAL_HCA_RULES or is_config(e))}
             for h in ends]
    if kinds[0] == kinds[1] == {"config"}:  # both ends misconfigured: ConfigCheck's, not a link
        return "config", ends[0]
    if bool(kinds[0]) == bool(kinds[1]):
        return None
    k, end = (kinds[0], ends[0]) if kinds[0] else (kinds[1], ends[1])
    return ("host" if "host" in k else "config"), end
