"""Per-communicator bookkeeping shared by the Phase-2 CCL detectors (Aegis §4.2, §5.2).

- :class:`CommRoster` learns who each communicator rank is (host, local GPU, and so the NIC
  that GPU uses: ``HostInventory.nic_for_gpu``, NIC i for GPU i without one) from the
  CCLRecords themselves, with the peers its outstanding work requests go to.
- :func:`localise` is RootDiag over a set of troubled ranks (Aegis Phase 1 RootDiag, §4.2
  "NetDiag on the sources and destinations of its outstanding requests"): the endpoint that is
  common to the troubled connections is the suspect; one pair is named as a pair.
- :func:`links_for` turns a localisation into link culprits (``h3/nic2<->tor-r2``);
  :func:`shared_switch` names the ToR switch when scattered troubles meet at one.

Plain state only; ``to_wire``/``from_wire`` give msgpack/JSON-able lists.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from processors.core.base import link_id, nic_id, whole_pod
from schemas.inventory import Inventory
from schemas.records import OpCounters, RankSnapshot


@dataclass(slots=True)
class Member:
    """One rank of a communicator as last reported: where it runs and whom it waits on."""

    host: str
    gpu: int
    peers: tuple[int, ...]  # peer ranks with posted-but-uncompleted WRs at the last report
    seen_ts: float  # record time of the last report


_LEARNED: tuple[str, str, None] = ("", "", None)  # learn's answer when nothing was refused or evicted


class CommRoster:
    """Rank → (host, GPU) per communicator, bounded to ``max_comms`` communicators."""

    def __init__(self, max_comms: int, max_peers: int) -> None:
        self.max_comms, self.max_peers = max_comms, max_peers
        self.sizes: dict[str, int] = {}
        self.members: dict[str, dict[int, Member]] = {}
        self.last_seen: dict[str, float] = {}
        self.by_gpu: dict[tuple[str, int], dict[str, int]] = {}  # (host, gpu) -> comm -> rank

    def learn(self, host: str, ts: float, snap: RankSnapshot) -> tuple[str, str, str | None]:
        """Record one rank's report. Returns (refusal reason or "", detail, evicted comm)."""
        comm, rank, csize = snap.comm, snap.rank, snap.comm_size
        size = self.sizes.get(comm)
        if size is not None and size != csize:
            return "comm_size_mismatch", f"comm {comm} size {csize} != {size}", None
        if not 0 <= rank < csize:
            return "rank_out_of_range", f"comm {comm} rank {rank} size {csize}", None
        members = self.members.get(comm)
        m = members.get(rank) if members is not None else None
        if m is not None and ts < m.seen_ts:
            return "late", f"comm {comm} rank {rank} at {ts} after {m.seen_ts}", None
        evicted = None
        if size is None:
            if len(self.sizes) >= self.max_comms:
                evicted = min(self.last_seen, key=lambda c: (self.last_seen[c], c))
                self.forget(evicted)
            self.sizes[comm], self.members[comm] = csize, {}
            members = self.members[comm]
        pending = snap.pending_peers
        peers = tuple(sorted({p for p in pending if p != rank}))[: self.max_peers] \
            if pending else ()
        gpu = snap.gpu
        if m is None or m.host != host or m.gpu != gpu:
            if m is not None:
                self._unindex(comm, m)
            assert members is not None
            members[rank] = Member(host, gpu, peers, ts)
            if gpu >= 0:  # an unknown GPU (-1) cannot be matched across communicators
                idx = self.by_gpu.get((host, gpu))
                if idx is None:
                    idx = self.by_gpu[(host, gpu)] = {}
                idx[comm] = rank
        else:
            m.peers = peers
            m.seen_ts = ts
        last_seen = self.last_seen
        last = last_seen.get(comm)
        if last is None or not last > ts:  # max(ts, last), NaN included
            last_seen[comm] = ts
        return _LEARNED if evicted is None else ("", "", evicted)

    def _unindex(self, comm: str, m: Member) -> None:
        idx = self.by_gpu.get((m.host, m.gpu))
        if idx is not None:
            idx.pop(comm, None)
            if not idx:
                del self.by_gpu[(m.host, m.gpu)]

    def forget(self, comm: str) -> None:
        for m in self.members.pop(comm, {}).values():
            self._unindex(comm, m)
        self.sizes.pop(comm, None)
        self.last_seen.pop(comm, None)

    def stale(self, before: float) -> list[str]:
        """Communicators with no report at or after ``before``."""
        return sorted(c for c, t in self.last_seen.items() if t < before)

    def place(self, comm: str, rank: int) -> Member | None:
        return self.members.get(comm, {}).get(rank)

    def comms_of(self, host: str, gpu: int) -> dict[str, int]:
        """Every communicator this GPU is in, with its rank there (none for gpu -1: the
        plugin could not tell which GPU, so its ranks are only known one by one)."""
        return self.by_gpu.get((host, gpu), {})

    def to_wire(self) -> list[Any]:
        return [[c, self.sizes[c], self.last_seen[c],
                 [[r, m.host, m.gpu, list(m.peers), m.seen_ts] for r, m in sorted(ms.items())]]
                for c, ms in sorted(self.members.items())]

    @classmethod
    def from_wire(cls, rows: Sequence[Any], max_comms: int, max_peers: int) -> CommRoster:
        ro = cls(max_comms, max_peers)
        for comm, size, seen, members in rows:
            ro.sizes[comm], ro.last_seen[comm], ro.members[comm] = int(size), float(seen), {}
            for r, host, gpu, peers, ts in members:
                ro.members[comm][int(r)] = Member(host, int(gpu), tuple(peers), float(ts))
                if int(gpu) >= 0:
                    ro.by_gpu.setdefault((host, int(gpu)), {})[comm] = int(r)
        return ro


@dataclass(frozen=True, slots=True)
class Localisation:
    """RootDiag's answer: ``endpoint`` (one rank common to every troubled connection, or the
    only troubled rank), ``ring`` (two ring neighbours, no peers known: the downstream one),
    ``pair`` (one connection), or ``scattered`` (no common endpoint)."""

    how: str
    suspects: tuple[int, ...]  # ranks whose NIC is suspect (endpoint; scattered w/o peers)
    pairs: tuple[tuple[int, int], ...]  # troubled connections, as sorted rank pairs


def localise(troubled: Iterable[int], peers: Mapping[int, Sequence[int]],
             ring_size: int = 0) -> Localisation:
    """Aegis RootDiag: if Gj is the root cause, connections from and to Gj are the troubled
    ones, so the rank touching every troubled connection is the suspect.

    With no peers known and exactly two troubled ranks a, a+1 (mod ``ring_size``, when given)
    the ring heuristic applies: a's requests go into a+1 and a+1's go out of it, so a+1's NIC
    is the common endpoint (``ring``; assumes the ring follows rank order)."""
    bad = sorted(set(troubled))
    pairs = sorted({(min(r, p), max(r, p)) for r in bad for p in peers.get(r, ()) if p != r})
    if not pairs:
        if len(bad) == 1:
            return Localisation("endpoint", tuple(bad), ())
        if len(bad) == 2 and ring_size > 2:
            a, b = bad
            if (b - a) % ring_size == 1:
                return Localisation("ring", (b,), ((a, b),))
            if (a - b) % ring_size == 1:
                return Localisation("ring", (a,), ((a, b),))
        return Localisation("scattered", tuple(bad), ())
    if len(pairs) == 1 and set(bad) <= set(pairs[0]):
        return Localisation("pair", (), tuple(pairs))
    nodes = sorted({n for e in pairs for n in e})
    common = [n for n in nodes if all(n in e for e in pairs)
              and all(r == n or n in peers.get(r, ()) for r in bad)]
    if len(common) == 1:
        return Localisation("endpoint", (common[0],), tuple(pairs))
    degree = {n: sum(n in e for e in pairs) for n in nodes}
    top = sorted(nodes, key=lambda n: (-degree[n], n))
    if degree[top[0]] >= 2 and degree[top[0]] > degree[top[1]] and 2 * degree[top[0]] > len(pairs):
        return Localisation("endpoint", (top[0],), tuple(pairs))
    return Localisation("scattered", tuple(r for r in bad if not peers.get(r)), tuple(pairs))


def nic_index(inventory: Inventory | None, host: str, gpu: int) -> int | None:
    """Index of the NIC that GPU ``gpu`` of ``host`` uses (``HostInventory.nic_for_gpu``);
    without an inventory entry for the host, GPU i uses NIC i (rail i)."""
    hi = inventory.hosts.get(host) if inventory is not None else None
    if hi is None:
        return gpu if gpu >= 0 else None
    return hi.nic_for_gpu(gpu)


def gpu_nic_id(inventory: Inventory | None, host: str, gpu: int) -> str:
    """Culprit name of the NIC GPU ``gpu`` uses: ``h/nic3``; ``h/nic`` when the inventory
    cannot say which of the host's NICs it is."""
    idx = nic_index(inventory, host, gpu)
    return nic_id(host, idx if idx is not None else "nic")


class NicLookup:
    """GPU → NIC and NIC → ToR from an optional Inventory. Calling it gives the ToR switch
    of the NIC GPU ``gpu`` of ``host`` uses, "tor" if unknown."""

    def __init__(self, inventory: Inventory | None) -> None:
        self.inventory = inventory

    def nic(self, host: str, gpu: int) -> str:
        return gpu_nic_id(self.inventory, host, gpu)

    def __call__(self, host: str, gpu: int) -> str:
        hi = self.inventory.hosts.get(host) if self.inventory is not None else None
        idx = hi.nic_for_gpu(gpu) if hi is not None else None
        return hi.tor[idx] if hi is not None and idx is not None and 0 <= idx < len(hi.tor) \
            and hi.tor[idx] else "tor"


def tor_lookup(inventory: Inventory | None) -> NicLookup:
    """ToR switch of the NIC GPU ``gpu`` of ``host`` uses (``HostInventory.nic_for_gpu``;
    GPU i uses NIC i without one); "tor" if unknown. Its ``nic`` names that NIC."""
    return NicLookup(inventory)


def links_for(loc: Localisation, roster: CommRoster, comm: str, tor_of: NicLookup,
              max_links: int) -> tuple[list[str], list[str], list[str]]:
    """(links, hosts, suspect NICs) for a localisation in ``comm``: a suspect rank's
    NIC↔ToR link, or the NIC↔NIC link of a troubled pair. A rank's NIC is the one its GPU
    uses (``tor_of.nic``). Unknown ranks are skipped."""
    links: list[str] = []
    hosts: set[str] = set()
    nics: list[str] = []
    nic_of = tor_of.nic
    for r in loc.suspects:
        m = roster.place(comm, r)
        if m is not None:
            nics.append(nic_of(m.host, m.gpu))
            links.append(link_id(nic_of(m.host, m.gpu), tor_of(m.host, m.gpu)))
            hosts.add(m.host)
    if loc.how in ("pair", "scattered"):
        for a, b in loc.pairs:
            ma, mb = roster.place(comm, a), roster.place(comm, b)
            known = [m for m in (ma, mb) if m is not None]
            if len(known) == 2:
                links.append(link_id(nic_of(known[0].host, known[0].gpu),
                                     nic_of(known[1].host, known[1].gpu)))
            elif known:
                links.append(link_id(nic_of(known[0].host, known[0].gpu),
                                     tor_of(known[0].host, known[0].gpu)))
            hosts.update(m.host for m in known)
    uniq = sorted(set(links))[:max_links]
    return uniq, sorted(hosts), sorted(set(nics))


@dataclass(frozen=True, slots=True)
class SwitchSuspect:
    """A ToR switch that the troubled ranks have in common: its name, the troubled links
    through it (at most ``max_links``), their hosts and NICs, and how many of the
    communicator's hosts behind it are troubled."""

    tor: str
    links: list[str]
    hosts: list[str]
    nics: list[str]
    troubled_hosts: int
    behind: int


def _top_switch(loc: Localisation, roster: CommRoster, comm: str, tor_of: NicLookup
                ) -> tuple[str, dict[str, Member], int] | None:
    """The known ToR behind which most of the troubled ranks' hosts sit: (ToR, those hosts'
    members, troubled hosts in all); None for a localisation that names one endpoint or pair."""
    if loc.how != "scattered":
        return None
    members = roster.members.get(comm, {})
    by_tor: dict[str, dict[str, Member]] = {}
    troubled: set[str] = set()
    for r in {*loc.suspects, *(r for p in loc.pairs for r in p)}:
        m = members.get(r)
        if m is None:
            continue
        troubled.add(m.host)
        tor = tor_of(m.host, m.gpu)
        if tor != "tor":
            by_tor.setdefault(tor, {}).setdefault(m.host, m)
    if not by_tor:
        return None
    tor, under = min(by_tor.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return tor, under, len(troubled)


def shared_switch(loc: Localisation, roster: CommRoster, comm: str, tor_of: NicLookup,
                  max_links: int, min_hosts: int, min_share: float) -> SwitchSuspect | None:
    """Aegis §2: rail-optimised wiring sends NIC i of every host of a pod to one ToR, so the
    scattered troubles of many ranks behind one switch point at the switch, not at each
    link. The ToR holding the most troubled hosts is the suspect when it holds at least
    ``min_hosts`` of them, more than half of all troubled hosts, and at least ``min_share``
    of the communicator's hosts behind it (two or three bad links among 32 stay links); or
    when it holds every one of the communicator's hosts behind it (2+, a small pod) and the
    only other troubled hosts are at most 2, their ring neighbours.
    Unknown ToRs ("tor": no inventory) never count. None when no switch qualifies."""
    top = _top_switch(loc, roster, comm, tor_of) if min_hosts >= 1 else None
    if top is None:
        return None
    tor, under, troubled = top
    behind = {m.host for m in roster.members.get(comm, {}).values()
              if tor_of(m.host, m.gpu) == tor}
    # a small pod: every host of the communicator behind it (2+) is troubled, and beyond them
    # at most their 2 ring neighbours, who send into it (one bad link troubles no third host)
    whole = whole_pod(len(under), len(behind)) and len(under) < troubled <= len(under) + 2
    if ((len(under) < min_hosts or 2 * len(under) <= troubled) and not whole) \
            or len(under) < min_share * len(behind):
        return None
    nics = sorted({tor_of.nic(m.host, m.gpu) for m in under.values()})
    return SwitchSuspect(tor, [link_id(n, tor) for n in nics][:max_links], sorted(under),
                         nics, len(under), len(behind))


def switch_of_most(loc: Localisation, roster: CommRoster, comm: str, tor_of: NicLookup
                   ) -> str | None:
    """The known ToR behind which more than half of the troubled hosts sit, if any: a
    smaller group of the same incident as a switch already named (another op's view of it)."""
    top = _top_switch(loc, roster, comm, tor_of)
    return top[0] if top is not None and 2 * len(top[1]) > top[2] else None


def beside_switch(group: list[int], roster: CommRoster, comm: str, tor_of: NicLookup,
                  tor: str) -> bool:
    """A troubled group another op shows after ToR ``tor`` was named: each of its ranks
    behind ``tor`` or a ring neighbour (rank ± 1) of a rank behind it, who sends into the
    slow switch. A slow switch slows those too, so while its incident is open such a group
    is that incident, not a link of its own."""
    members = roster.members.get(comm, {})
    size = roster.sizes.get(comm, 0)
    under = {r for r, m in members.items() if tor_of(m.host, m.gpu) == tor}
    if size < 3 or not under:
        return False
    near = under | {(r + d) % size for r in under for d in (-1, 1)}
    return all(r in near for r in group)


def open_switch(incidents: Iterable[str], group: list[int], roster: CommRoster, comm: str,
                tor_of: NicLookup) -> str | None:
    """The key (``slow_network|<ToR>``) of an open ToR incident beside which the whole
    group sits (``beside_switch``), if any; link incidents (``a<->b``) never match."""
    for key in sorted(incidents):
        tor = key.removeprefix("slow_network|")
        if tor != key and "<->" not in tor and "," not in tor \
                and beside_switch(group, roster, comm, tor_of, tor):
            return key
    return None


Located = tuple[Localisation, list[str], list[str], list[str], SwitchSuspect | None]


def locate_group(roster: CommRoster, tor_of: NicLookup, comm: str, group: list[int], size: int,
                 max_links: int, min_hosts: int, min_share: float) -> Located:
    """(localisation, links, hosts, suspect NICs, switch) of a troubled group of ``comm``:
    its links (``links_for``), or the ToR its hosts share (``shared_switch``) and its links."""
    peers = {} if len(group) == 1 else {r: m.peers for r in group
                                        if (m := roster.place(comm, r)) is not None}
    loc = localise(group, peers, size)
    links, hosts, nics = links_for(loc, roster, comm, tor_of, max_links)
    switch = shared_switch(loc, roster, comm, tor_of, max_links, min_hosts, min_share)
    if switch is not None:
        links, hosts, nics = switch.links, switch.hosts, switch.nics
    return loc, links, hosts, nics, switch


def bad_number(x: float) -> str:
    """Rejection reason for a duration/latency value, or "" if it is usable."""
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return "not_finite"
    return "negative" if x < 0 else ""


@dataclass(slots=True)
class RankCounters:
    """A rank's CL/WR/WC at its last CL change (the alignment detector's view, Aegis §4.2)."""

    cl: int
    wr: int
    wc: int
    changed_ts: float  # record time at which this CL value was first seen
    src: tuple[OpCounters, ...]  # the rank's counters at that time (only op and cl are read)

    @property
    def ops(self) -> tuple[tuple[str, int], ...]:
        """Per collective kind CL at the change, sorted, for evidence (sums to cl)."""
        return tuple(sorted((o.op, o.cl) for o in self.src))[:16]


def gpu_key(m: Any) -> tuple[str, int | str]:
    """A GPU's identity across communicators. Ranks whose GPU the plugin could not tell
    (gpu -1) share one key per host: any of them blocked in a stalled op makes every one of
    them a possible victim. That may miss a compute hang on such a host, but never names a
    victim (a rank waiting on another communicator) as the culprit."""
    return (m.host, m.gpu) if m.gpu >= 0 else (m.host, "?")
