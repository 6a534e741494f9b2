"""Hang localisation by CL/WR/WC alignment (Aegis §4.2, Phase 2) over one job's CCLRecords.

Once CL has stopped advancing on every rank of a communicator for ``stall_s`` of event time:

- a rank that stopped reporting while its peers kept reporting: its host (``rank_silent``);
- ranks whose CL lags the others (CL(i,n) < CL(i,j)): computation-side hang on that GPU
  (``cl_lag``), unless the GPU is itself blocked inside another stalled communicator (then
  it is a victim, and the GPU it waits for is named instead);
- equal CL but WR ≠ WC: communication-side hang (``wr_wc_outstanding``); the sources and
  destinations of the outstanding requests are localised like RootDiag (ccl_state.localise).

Equal CL and WR == WC everywhere is a healthy idle communicator (or a finished job): never a
hang. One diagnosis per culprit and incident; an incident re-arms when one of its
communicators advances again. Contract: processors/core/base.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from processors.core.alignment_silent import silent_hosts
from processors.core.base import (
    Outputs,
    Rejection,
    check_snapshot_v1,
    gpu_id,
    make_diagnosis,
    restart_actions,
)
from processors.core.ccl_state import (
    CommRoster,
    RankCounters,
    gpu_key,
    links_for,
    localise,
    shared_switch,
    switch_of_most,
    tor_lookup,
)
from schemas.errors import ConfigError
from schemas.inventory import Inventory
from schemas.records import CCLRecord, Diagnosis, OpCounters, RankSnapshot

DETECTOR = "ccl_alignment"


@dataclass(frozen=True, slots=True)
class AlignmentConfig:
    """Parameters of the §4.2 rules; seconds of event time."""

    stall_s: float = 30.0  # no CL change on any rank this long: the communicator is stalled
    eval_interval_s: float = 1.0  # how often stalled communicators are assessed
    undecided_max_s: float = 30.0  # a lagging GPU still running elsewhere: wait this long more
    forget_s: float = 600.0  # a communicator with no report this long is dropped
    # no rank of a stalled communicator reported for this long: it is gone (the job was
    # killed or ended), not hung; hung ranks keep reporting (the plugin reports every
    # interval while stalled, the agent drops a dead process's entries within ~10 s)
    gone_s: float = 15.0
    max_comms: int = 65536  # communicators kept; the least recently seen is evicted
    max_peers: int = 64  # outstanding peers kept per rank
    max_links: int = 8  # links named in one hang_network diagnosis
    # troubled ranks on this many hosts behind one ToR (most of them, and at least
    # switch_min_share of the communicator's hosts behind it): NetDiag on the switch (0: never)
    switch_min_hosts: int = 3
    switch_min_share: float = 0.25

    def __post_init__(self) -> None:
        if self.stall_s <= 0 or self.eval_interval_s <= 0 or not 0 < self.gone_s <= self.stall_s \
                or min(self.undecided_max_s, self.forget_s) < 0 or min(
                self.max_comms, self.max_peers, self.max_links) < 1 or \
                self.switch_min_hosts < 0 or not 0 <= self.switch_min_share <= 1:
            raise ConfigError("alignment: stall_s, eval_interval_s > 0; 0 < gone_s <= stall_s; "
                              "durations >= 0; max_comms, max_peers, max_links >= 1; "
                              "switch_min_hosts >= 0, 0 <= switch_min_share <= 1")


class AlignmentDetector:
    """Aegis §4.2 CL/WR/WC alignment over one job's CCLRecords."""

    name = DETECTOR

    def __init__(self, job: str, config: AlignmentConfig | None = None,
                 inventory: Inventory | None = None) -> None:
        self.job = job
        self.cfg = cfg = config if config is not None else AlignmentConfig()
        self.roster = CommRoster(cfg.max_comms, cfg.max_peers)
        self.counters: dict[str, dict[int, RankCounters]] = {}
        self.last_change: dict[str, float] = {}  # comm -> latest CL change of any rank
        self.incidents: dict[str, list[str]] = {}  # culprit key -> communicators involved
        self.advanced: set[str] = set()  # incidents one of whose communicators advanced
        self.asserted: set[str] = set()  # incidents seen again by the current assessment
        self.watermark = 0.0
        self.next_eval = 0.0
        self.tor_of = tor_lookup(inventory)

    # ---- input ---------------------------------------------------------------------------
    def observe(self, rec: CCLRecord) -> Outputs:
        out = Outputs()
        if rec.job is not None and rec.job != self.job:
            return self._reject(out, rec.host, "wrong_job", f"record of job {rec.job}", rec.ts)
        for snap in rec.ranks:
            self._take(out, rec, snap)
        return out.extend(self._tick(rec.ts))

    def advance(self, now: float) -> Outputs:
        return self._tick(now)

    def _take(self, out: Outputs, rec: CCLRecord, snap: RankSnapshot) -> None:
        cl = wr = wc = 0
        for o in snap.ops:
            ocl, owr, owc = o.cl, o.wr, o.wc
            if ocl < 0 or owr < 0 or owc < 0:
                self._reject(out, rec.host, "negative_counter",
                             f"comm {snap.comm} rank {snap.rank} op {o.op}: CL/WR/WC "
                             f"{ocl}/{owr}/{owc}", rec.ts)
                return
            cl, wr, wc = cl + ocl, wr + owr, wc + owc
        ts, comm = rec.ts, snap.comm
        reason, detail, evicted = self.roster.learn(rec.host, ts, snap)
        if evicted is not None:
            self._drop(evicted)
            self._reject(out, rec.host, "comm_evicted", f"comm {evicted} (max_comms)", ts)
        if reason:
            self._reject(out, rec.host, reason, detail, ts)
            return
        ranks = self.counters.get(comm)
        if ranks is None:
            ranks = self.counters[comm] = {}
        old = ranks.get(snap.rank)
        if old is None or old.cl != cl:
            if old is not None and cl < old.cl:
                self._reject(out, rec.host, "counter_reset",
                             f"comm {comm} rank {snap.rank}: CL {old.cl} -> {cl}", ts)
            if old is None:
                ranks[snap.rank] = RankCounters(cl, wr, wc, ts, snap.ops)
            else:
                old.cl, old.wr, old.wc, old.changed_ts, old.src = cl, wr, wc, ts, snap.ops
            last = self.last_change.get(comm)
            if last is None or not last > ts:  # max(ts, last), NaN included
                self.last_change[comm] = ts
            if old is not None and self.incidents:
                self._rearm(comm)
        else:
            old.wr, old.wc = wr, wc

    def _rearm(self, comm: str) -> None:
        """Aegis §4.2: the communicator advances again; its incidents end at the next
        assessment that no longer sees them."""
        self.advanced.update(k for k, comms in self.incidents.items() if comm in comms)

    def _drop(self, comm: str) -> None:
        self.roster.forget(comm)
        self.counters.pop(comm, None)
        self.last_change.pop(comm, None)
        for key, comms in list(self.incidents.items()):
            if comm in comms:
                comms.remove(comm)
                if not comms:
                    del self.incidents[key]
                    self.advanced.discard(key)

    # ---- time ----------------------------------------------------------------------------
    def _tick(self, now: float) -> Outputs:
        out = Outputs()
        self.watermark = max(self.watermark, now)
        if self.watermark < self.next_eval:
            return out
        self.next_eval = self.watermark + self.cfg.eval_interval_s
        for comm in self.roster.stale(self.watermark - self.cfg.forget_s):
            self._drop(comm)
        stalled = [c for c, t in sorted(self.last_change.items())
                   if self.watermark - t >= self.cfg.stall_s and len(self.counters[c]) >= 2]
        self.asserted = set()
        if stalled:
            self._assess_all(out, stalled)
        for key in sorted(self.advanced - self.asserted):
            self.incidents.pop(key, None)
        self.advanced &= self.asserted
        return out

    def _verdict(self, comm: str) -> tuple[str, list[int]]:
        """idle | gone | silent | lag | net, with the ranks concerned."""
        cnt, mem = self.counters[comm], self.roster.members[comm]
        if len({c.cl for c in cnt.values()}) == 1 and all(c.wr == c.wc for c in cnt.values()):
            return "idle", []
        now, stall = self.watermark, self.cfg.stall_s
        newest = max(mem[r].seen_ts for r in cnt)
        if newest <= now - self.cfg.gone_s:
            return "gone", []  # nobody reports any more: job ended or killed, host gone
        silent = [r for r in cnt if mem[r].seen_ts <= now - stall and newest >= mem[r].seen_ts + stall]
        if silent:
            return "silent", sorted(silent)
        top = max(c.cl for c in cnt.values())
        lag = [r for r, c in cnt.items() if c.cl < top]
        if lag:
            return "lag", sorted(lag)
        return "net", sorted(r for r, c in cnt.items() if c.wr != c.wc)

    def _assess_all(self, out: Outputs, stalled: list[str]) -> None:
        verdicts = {c: self._verdict(c) for c in stalled}
        blocked: set[tuple[str, int | str]] = set()  # GPUs waiting inside a stalled op
        for c, (kind, ranks) in verdicts.items():
            if kind in ("silent", "lag", "net"):
                top = max(x.cl for x in self.counters[c].values())
                mem = self.roster.members[c]
                blocked.update(gpu_key(mem[r]) for r, x in self.counters[c].items()
                               if kind == "net" or (x.cl == top and r not in ranks))
        lagging: list[tuple[str, int]] = []
        silent = {c: ranks for c, (kind, ranks) in verdicts.items() if kind == "silent"}
        if silent:
            self._silent(out, silent)
        for c, (kind, ranks) in verdicts.items():
            if kind == "lag":
                lagging.extend((c, r) for r in ranks)
            elif kind == "net":
                self._network(out, c, ranks)
        if lagging:
            self._lagging(out, lagging, blocked)

    # ---- the three rules -----------------------------------------------------------------
    def _silent(self, out: Outputs, silent: dict[str, list[int]]) -> None:
        """One diagnosis for the hosts that went silent together, in every stalled
        communicator (alignment_silent); a host already in an incident only joins it."""
        found = silent_hosts(self.job, self.roster, silent, self.incidents, self.watermark,
                             self.cfg.stall_s)
        for key, comm in found.joined:
            self._emit(out, key, comm, None)
        if found.diagnosis is not None:
            out.diagnoses.append(found.diagnosis)
        for key, comms in found.opened.items():
            self.asserted.add(key)
            self.incidents[key] = comms

    def _lag_evidence(self, comm: str, rank: int, blocked: set[tuple[str, int | str]]
                      ) -> tuple[list[dict[str, Any]], float] | None:
        """(where the GPU lags, the first report of a peer ahead) or None: a victim (blocked inside
        another stalled communicator) or undecided (at the top of one not settled yet)."""
        m = self.roster.members[comm][rank]
        if gpu_key(m) in blocked:
            return None
        stalled_for = self.watermark - self.last_change[comm]
        lags, since = [], float("inf")
        comms = self.roster.comms_of(m.host, m.gpu) if m.gpu >= 0 else {comm: rank}
        for c, r in sorted(comms.items()):
            cnt = self.counters.get(c, {})
            if r not in cnt:
                continue
            top = max(x.cl for x in cnt.values())
            mine = cnt[r]
            if mine.cl < top:
                lead = max(cnt.values(), key=lambda x: x.cl)
                behind = sorted({op for op, n in lead.ops if n > dict(mine.ops).get(op, 0)})
                lags.append({"comm": c, "rank": r, "cl": mine.cl, "max_cl": top, "ops": behind,
                             "last_cl_change": mine.changed_ts})
                # first evidence: the first report of a peer ahead of it
                since = min(since, min(x.changed_ts for x in cnt.values() if x.cl > mine.cl))
            elif self.watermark - self.last_change.get(c, 0.0) < self.cfg.stall_s and \
                    stalled_for < self.cfg.stall_s + self.cfg.undecided_max_s:
                return None
        return lags, since

    def _lagging(self, out: Outputs, lagging: list[tuple[str, int]],
                 blocked: set[tuple[str, int | str]]) -> None:
        """Aegis §4.2 CL(i,n) < CL(i,j). Per host, the most specific GPUs are named: those
        lagging in the most communicators (the DP laggard whose host's TP also lags)."""
        by_host: dict[str, dict[int, tuple[str, list[dict[str, Any]], float]]] = {}
        for comm, rank in lagging:
            m = self.roster.members[comm][rank]
            if m.gpu in by_host.get(m.host, {}):
                continue
            found = self._lag_evidence(comm, rank, blocked)
            if found is not None and found[0]:
                by_host.setdefault(m.host, {})[m.gpu] = (comm, *found)
        for host, cands in sorted(by_host.items()):
            most = max(len(lags) for _, lags, _ in cands.values())
            keep = {g: v for g, v in sorted(cands.items()) if len(v[1]) == most}
            key, comm = f"host|{host}", next(iter(keep.values()))[0]
            if key in self.incidents:
                self._emit(out, key, comm, None)
                continue
            gids = [gpu_id(host, g) for g in keep if g >= 0]  # -1: the GPU is unknown
            since = min(v[2] for v in keep.values())
            stalled_for = self.watermark - min(self.last_change[v[0]] for v in keep.values())
            ev = {"actions": [["isolate_host", host], *restart_actions(self.job, (host,))],
                  "lagging_in": [x for v in keep.values() for x in v[1]][:32],
                  "less_specific": [gpu_id(host, g) for g in sorted(set(cands) - set(keep))
                                    if g >= 0],
                  "stall_s": self.cfg.stall_s, "stalled_for_s": stalled_for}
            self._emit(out, key, comm, make_diagnosis(
                job=self.job, kind="hang_compute", detector=DETECTOR, rule="cl_lag",
                event_ts=since, detected_ts=self.watermark, hosts=[host], gpus=gids,
                evidence=ev, confidence=0.9,
                summary=f"{', '.join(gids) or host} stopped launching collectives: CL behind its peers "
                        f"in {most} communicator(s), stalled {stalled_for:.0f} s"))

    def _network(self, out: Outputs, comm: str, ranks: list[int]) -> None:
        mem, cnt = self.roster.members[comm], self.counters[comm]
        loc = localise(ranks, {r: mem[r].peers for r in ranks}, self.roster.sizes[comm])
        cfg = self.cfg
        links, hosts, nics = links_for(loc, self.roster, comm, self.tor_of, cfg.max_links)
        switch = shared_switch(loc, self.roster, comm, self.tor_of, cfg.max_links,
                               cfg.switch_min_hosts, cfg.switch_min_share)
        if switch is not None:
            links, hosts, nics = switch.links, switch.hosts, switch.nics
        if not links:
            return
        nic_of = self.tor_of.nic  # the NIC each rank's GPU uses (HostInventory.nic_for_gpu)
        outstanding = [{"rank": r, "nic": nic_of(mem[r].host, mem[r].gpu), "wr": cnt[r].wr,
                        "wc": cnt[r].wc, "peers": list(mem[r].peers)} for r in ranks[:32]]
        targets = [switch.tor] if switch is not None else links
        ev = {"actions": [["run_netdiag", t] for t in targets], "comm": comm,
              "localised": "switch" if switch is not None else loc.how, "suspect_nics": nics,
              "outstanding": outstanding, "pairs": [list(p) for p in loc.pairs[:32]],
              "stall_s": self.cfg.stall_s}
        what = ", ".join(links)
        if switch is not None:
            ev |= {"switch": switch.tor, "switch_hosts": switch.troubled_hosts,
                   "switch_behind": switch.behind}
            what = (f"ToR {switch.tor} ({switch.troubled_hosts} of the communicator's "
                    f"{switch.behind} hosts behind it hold them)")
        key = "network|" + (switch.tor if switch is not None else ",".join(links))
        tor = switch_of_most(loc, self.roster, comm, self.tor_of) if switch is None else None
        if tor is not None and "network|" + tor in self.incidents:
            key = "network|" + tor  # fewer of its hosts in another communicator: that switch
        self._emit(out, key, comm, make_diagnosis(
            job=self.job, kind="hang_network", detector=DETECTOR, rule="wr_wc_outstanding",
            event_ts=min(cnt[r].changed_ts for r in ranks), detected_ts=self.watermark,
            hosts=hosts, links=links, evidence=ev,
            confidence={"endpoint": 0.85, "pair": 0.85, "ring": 0.7}.get(loc.how, 0.6),
            summary=f"communicator {comm} hangs inside a collective with {len(ranks)} rank(s) "
                    f"holding uncompleted work requests; suspect {what}"))

    def _emit(self, out: Outputs, key: str, comm: str, diag: Diagnosis | None) -> None:
        self.asserted.add(key)
        comms = self.incidents.get(key)
        if comms is None and diag is not None:
            self.incidents[key] = [comm]
            out.diagnoses.append(diag)
        elif comms is not None and comm not in comms:
            comms.append(comm)

    def _reject(self, out: Outputs, host: str, reason: str, detail: str, ts: float) -> Outputs:
        out.rejections.append(Rejection(DETECTOR, self.job, host, reason, detail, ts))
        return out

    # ---- state ---------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Plain msgpack/JSON-able state."""
        return {"v": 1, "job": self.job, "watermark": self.watermark, "next_eval": self.next_eval,
                "roster": self.roster.to_wire(),
                "counters": [[c, self.last_change[c],
                              [[r, x.cl, x.wr, x.wc, x.changed_ts, [list(o) for o in x.ops]]
                               for r, x in sorted(rs.items())]]
                             for c, rs in sorted(self.counters.items())],
                "incidents": [[k, list(v), k in self.advanced]
                              for k, v in sorted(self.incidents.items())]}

    @classmethod
    def restore(cls, state: Mapping[str, Any], job: str, config: AlignmentConfig | None = None,
                inventory: Inventory | None = None) -> AlignmentDetector:
        check_snapshot_v1(state, "alignment")
        det = cls(job, config, inventory)
        det.watermark, det.next_eval = float(state["watermark"]), float(state["next_eval"])
        det.roster = CommRoster.from_wire(state["roster"], det.cfg.max_comms, det.cfg.max_peers)
        for comm, changed, rows in state["counters"]:
            det.last_change[comm] = float(changed)
            det.counters[comm] = {int(r): RankCounters(int(cl), int(wr), int(wc), float(ts),
                                                    tuple(OpCounters(str(o), int(n), 0, 0)
                                                          for o, n in ops))
                                  for r, cl, wr, wc, ts, ops in rows}
        det.incidents = {k: list(v) for k, v, _ in state["incidents"]}
        det.advanced = {k for k, _, adv in state["incidents"] if adv}
        return det
