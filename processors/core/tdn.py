"""Procedure-aware degradation rules TD/N (Aegis §5.2) over one job's CCLRecords.

For each communicator, collective kind Ci and launch (iteration) k, every rank reports TD(i,j,k),
the op's duration, and N(i,j,k), the mean completion latency of its last L=5 work requests.
Values are buffered per (communicator, op, seq) until every rank's value is in, or until
``seq_timeout_s``; then, with at least ``min_ranks`` values and TD(i,k), N(i,k) the means
over the ranks:

- TD(i,j,k) < α·TD(i,k): Gj arrives last and waits least, slow compute (``td_short``;
  even collectives only: a Send/Recv ends when its one peer is done, an all-to-all's load
  is uneven by design);
- N(i,j,k) > β·N(i,k): Gj's work requests are slow, slow network (``n_high``); the group of
  degraded ranks is localised like RootDiag (ccl_state.localise), one rank alone names its
  NIC↔ToR link.

A rule must hold for ``persist`` consecutive evaluations spanning ``persist_window_s`` before
it fires: loose on purpose so passing congestion never isolates. A GPU that is short in one
communicator but waits on another communicator's slow rank is a victim and is not named.
One diagnosis per culprit and incident, ``event_ts`` = the first violating iteration; an
incident re-arms after ``persist`` clean evaluations. Contract: processors/core/base.py.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from processors.core.base import (
    Outputs,
    Rejection,
    check_snapshot_v1,
    gpu_id,
    host_wide,
    make_diagnosis,
)
from processors.core.ccl_state import (
    CommRoster,
    Located,
    bad_number,
    locate_group,
    open_switch,
    switch_of_most,
    tor_lookup,
)
from processors.core.tdn_config import NO_TD_OPS, TDNConfig
from processors.core.tdn_host import is_victim, short_gpus, spans_hosts
from processors.core.tdn_state import (
    NetFinding,
    OpState,
    Streak,
    join_incident,
    leave_incident,
    merged_by_comm,
)
from schemas.inventory import Inventory
from schemas.records import CCLRecord, OpCounters, RankSnapshot

_MAX_FLOAT = sys.float_info.max


def _where(snap: RankSnapshot, o: OpCounters) -> str:
    return f"comm {snap.comm} rank {snap.rank} op {o.op} seq {o.seq}"

DETECTOR = "ccl_tdn"


class TDNDetector:
    """Aegis §5.2 TD/N rules over one job's CCLRecords."""

    name = DETECTOR

    def __init__(self, job: str, config: TDNConfig | None = None,
                 inventory: Inventory | None = None) -> None:
        self.job = job
        self.cfg = cfg = config if config is not None else TDNConfig()
        self.roster = CommRoster(cfg.max_comms, cfg.max_peers)
        self.ops: dict[str, dict[str, OpState]] = {}  # comm -> op kind -> state
        self.incidents: dict[str, list[str]] = {}  # culprit key -> "comm|op|rule|rank" fired
        self.watermark = 0.0
        self.next_sweep = 0.0
        self.tor_of = tor_lookup(inventory)
        self.later: list[NetFinding] = []  # link findings of the current call (_settle)

    # ---- input ---------------------------------------------------------------------------
    def observe(self, rec: CCLRecord) -> Outputs:
        out = Outputs()
        if rec.job is not None and rec.job != self.job:
            return self._reject(out, rec.host, "wrong_job", f"record of job {rec.job}", rec.ts)
        host, ts = rec.host, rec.ts
        self.watermark = max(self.watermark, ts)
        touched: dict[tuple[str, str], OpState] = {}  # (comm, op) -> its state, in first-touch order
        learn, add, ops = self.roster.learn, self._add, self.ops
        dropped = False
        for snap in rec.ranks:
            reason, detail, evicted = learn(host, ts, snap)
            if evicted is not None:
                dropped = True
                self._drop(evicted)
                self._reject(out, host, "comm_evicted", f"comm {evicted} (max_comms)", ts)
            if reason:
                self._reject(out, host, reason, detail, ts)
                continue
            comm, by_op = snap.comm, None
            for o in snap.ops:
                td, n = o.td_us, o.n_us
                if td.__class__ is not float or n.__class__ is not float or not (
                        0.0 <= td <= _MAX_FLOAT and 0.0 <= n <= _MAX_FLOAT):
                    bad = bad_number(td) or bad_number(n)
                    if bad:
                        self._reject(out, host, bad, f"{_where(snap, o)}: td_us={td} "
                                     f"n_us={n}", ts)
                        continue
                    td, n = float(td), float(n)
                if o.seq > 0:
                    if by_op is None:  # made on the first launch to compare, as before
                        by_op = ops.get(comm)
                        if by_op is None:
                            by_op = ops[comm] = {}
                    st = add(out, rec, snap, by_op, o, td, n)
                    if st is not None:
                        touched[(comm, o.op)] = st
        timeout = self.cfg.seq_timeout_s
        for (comm, op), seen in touched.items():
            # only an eviction above removes state during observe: look it up again then
            st = ops.get(comm, {}).get(op) if dropped else seen
            if st is not None and self.watermark - st.oldest >= timeout:
                self._expire(out, comm, op, st)
        return self._settle(out.extend(self._tick(ts)))

    def _add(self, out: Outputs, rec: CCLRecord, snap: RankSnapshot,
             by_op: dict[str, OpState], o: OpCounters, td: float, n: float) -> OpState | None:
        """Buffer one rank's TD/N of one launch (``by_op``: its communicator's ops); its
        (communicator, op) state when buffered, None when not."""
        rank, op, seq = snap.rank, o.op, o.seq
        st = by_op.get(op)
        if st is None:
            if len(by_op) >= self.cfg.max_ops:
                self._reject(out, rec.host, "too_many_ops", _where(snap, o), rec.ts)
                return None
            st = by_op[op] = OpState(snap.comm_size)
        last_seq = st.last_seq
        last = last_seq.get(rank, 0)
        if seq == last:
            return None  # the same finished launch reported again
        if seq < last:
            self._reject(out, rec.host, "seq_backwards", f"{_where(snap, o)} after seq {last}",
                         rec.ts)
            return None
        last_seq[rank] = seq
        bucket = self.cfg.seq_bucket
        if bucket != 1:
            seq //= bucket  # from here on: the comparison bucket
        pending = st.pending
        buf = pending.get(seq)
        if buf is None:
            if seq == last // bucket:
                return None  # a later launch of a bucket this rank already gave a value to
            if seq <= st.done_upto:
                self._reject(out, rec.host, "late", f"{_where(snap, o)}: iteration already "
                             "evaluated", rec.ts)
                return None
            if len(pending) >= self.cfg.max_pending_seqs:
                old = min(pending)
                del pending[old]
                st.done_upto = max(st.done_upto, old)
                st.reckon_oldest()
                self._reject(out, rec.host, "seq_buffer_full",
                             f"comm {snap.comm} op {op}: dropped iteration {old}", rec.ts)
            # the job clock (newest record time) when its first value came: an iteration
            # opened by a host whose clock is behind must not time out before the others'
            # values arrive (3 s of skew made every iteration expire: TD/N saw nothing)
            ts = self.watermark
            buf = pending[seq] = (ts, {}, {})
            if ts < st.oldest:
                st.oldest = ts
        tds = buf[1]
        tds[rank] = td
        buf[2][rank] = n
        if len(tds) >= st.size:
            self._close_upto(out, snap.comm, op, st, seq)
        return st

    def advance(self, now: float) -> Outputs:
        self.watermark = max(self.watermark, now)
        return self._settle(self._tick(now))

    def _tick(self, now: float) -> Outputs:
        out = Outputs()
        if self.watermark < self.next_sweep:
            return out
        self.next_sweep = self.watermark + self.cfg.sweep_interval_s
        for comm in self.roster.stale(self.watermark - self.cfg.forget_s):
            self._drop(comm)
        timeout = self.cfg.seq_timeout_s
        for comm, by_op in sorted(self.ops.items()):
            for op, st in sorted(by_op.items()):
                if st.pending and self.watermark - st.oldest >= timeout:  # else none is due
                    self._expire(out, comm, op, st)
        return out

    def _expire(self, out: Outputs, comm: str, op: str, st: OpState) -> None:
        due = [s for s, b in st.pending.items() if self.watermark - b[0] >= self.cfg.seq_timeout_s]
        if due:
            self._close_upto(out, comm, op, st, max(due))

    def _close_upto(self, out: Outputs, comm: str, op: str, st: OpState, seq: int) -> None:
        """Evaluate every buffered iteration up to ``seq``, oldest first (streaks are ordered)."""
        for s in sorted(k for k in st.pending if k <= seq):
            ts, td, n = st.pending.pop(s)
            self._evaluate(out, comm, op, st, s, ts, td, n)
        st.reckon_oldest()
        st.done_upto = max(st.done_upto, seq)

    # ---- the two rules -------------------------------------------------------------------
    def _evaluate(self, out: Outputs, comm: str, op: str, st: OpState, seq: int, ts: float,
                  td: dict[int, float], n: dict[int, float]) -> None:
        cfg = self.cfg
        alpha, beta, persist = cfg.alpha, cfg.beta, cfg.persist
        for rule, values in (("td_short", td), ("n_high", n)):
            if rule == "td_short" and op.lower() in NO_TD_OPS:
                continue  # a send/recv waits on its one peer; an all-to-all's load is uneven
            vals = {r: v for r, v in values.items() if v > 0}
            if len(vals) < 2:
                continue
            # a communicator below min_ranks (tp=2) never names a culprit itself, but its
            # streaks say who waits on whom there: the victim test of the other ones
            small = len(vals) < cfg.min_ranks
            mean = sum(vals.values()) / len(vals)
            streaks = st.streaks[rule]
            short = rule == "td_short"
            # many arrive last: two populations, not a straggler; nobody violates this time
            if short:
                late = [r for r, v in vals.items() if v < alpha * mean]
                mixed = len(late) > max(1, int(cfg.max_slow_share * len(vals))) or (
                    len(late) > cfg.max_slow_hosts and spans_hosts(
                        self.roster, comm, late, cfg.max_slow_hosts, cfg.max_slow_host_share))
            ranks = sorted(vals)
            hot = False  # a rank reached ``persist`` violations: the firing pass is needed
            for r in ranks:
                ratio = vals[r] / mean
                s = streaks.get(r)
                if s is None:
                    s = streaks[r] = Streak()
                if (ratio < alpha and not mixed) if short else ratio > beta:
                    if s.count == 0:
                        s.first_seq, s.first_ts = seq, ts
                    s.count, s.clean = s.count + 1, 0
                    hot = hot or s.count >= persist
                else:
                    s.count, s.clean = 0, s.clean + 1
                    if s.fired and s.clean >= persist:
                        leave_incident(self.incidents, f"{comm}|{op}|{rule}|{r}", s)
            if not hot or small:
                continue
            for r in ranks:
                s = streaks[r]
                if not s.fired and s.count >= persist and ts - s.first_ts >= cfg.persist_window_s:
                    if short:
                        self._slow_compute(out, comm, op, st, r, vals[r], mean, ts)
                    else:
                        self._slow_network(out, comm, op, st, vals, mean, ts)

    def _slow_compute(self, out: Outputs, comm: str, op: str, st: OpState, rank: int,
                      td: float, mean: float, ts: float) -> None:
        m = self.roster.place(comm, rank)
        if m is None or is_victim(self.roster, self.ops, comm, m.host, m.gpu):
            return
        s = st.streaks["td_short"][rank]
        tid, host_key = f"{comm}|{op}|td_short|{rank}", f"slow_compute|{m.host}"
        if m.gpu >= 0 and host_key in self.incidents:  # its host was named: the same incident
            join_incident(self.incidents, host_key, tid, s)
            return
        gpus, short = short_gpus(self.roster, self.ops, m.host) if m.gpu >= 0 else ([], [])
        whole = host_wide(len(short), len(gpus), self.cfg.host_rollup_share)
        # gpu -1: the plugin could not tell which GPU; the culprit is somewhere on the host
        gid = gpu_id(m.host, m.gpu) if m.gpu >= 0 and not whole else m.host
        action = "isolate_gpu" if gid != m.host else "isolate_host"
        named = [gpu_id(m.host, g) for g in short] if whole else [gid] if m.gpu >= 0 else []
        if join_incident(self.incidents, f"slow_compute|{gid}", tid, s):
            ev = {"actions": [[action, gid]], "comm": comm, "op": op, "rank": rank,
                  "first_seq": s.first_seq * self.cfg.seq_bucket, "td_us": td, "td_mean_us": mean,
                  "ratio": td / mean, "alpha": self.cfg.alpha, "persist": self.cfg.persist,
                  "violations": s.count}
            if whole:
                ev |= {"short_gpus": named, "host_gpus": len(gpus)}
            what = (f"{m.host} ({len(short)} of its {len(gpus)} GPUs short together)"
                    if whole else gid)
            out.diagnoses.append(make_diagnosis(
                job=self.job, kind="slow_compute", detector=DETECTOR, rule="td_short",
                event_ts=s.first_ts, detected_ts=ts, hosts=[m.host], gpus=named, evidence=ev,
                confidence=0.8,
                summary=f"{what} finishes {op} in {td / mean:.2f}x the communicator's mean "
                        f"time for {s.count} iterations: it arrives last (slow compute)"))

    def _slow_network(self, out: Outputs, comm: str, op: str, st: OpState,
                      vals: dict[int, float], mean: float, ts: float) -> None:
        streaks = st.streaks["n_high"]
        group = sorted(r for r, x in streaks.items() if x.count >= max(1, self.cfg.persist // 2))
        if not group or any(f.st is st and f.group == group for f in self.later):
            return  # no group, or one this call already found (each of its ranks asks again)
        cfg = self.cfg
        loc, links, hosts, nics, switch = self._locate(comm, group, st.size)
        if not links:
            return
        ev = {"actions": [["run_netdiag", t] for t in ([switch.tor] if switch else links)],
              "comm": comm, "op": op, "localised": "switch" if switch is not None else loc.how,
              "suspect_nics": nics, "degraded_ranks": group,
              "n_us": {str(r): vals[r] for r in group if r in vals}, "n_mean_us": mean,
              "beta": cfg.beta, "window_wrs": cfg.window_wrs,
              "persist": cfg.persist, "pairs": [list(p) for p in loc.pairs[:32]]}
        found = NetFinding(comm, op, st, group, loc, links, hosts, switch, ev, ts)
        if switch is None:  # another op of this call may name its switch: _settle
            self.later.append(found)
        else:
            self._raise_network(out, found)

    def _locate(self, comm: str, group: list[int], size: int) -> Located:
        cfg = self.cfg
        return locate_group(self.roster, self.tor_of, comm, group, size, cfg.max_links,
                            cfg.switch_min_hosts, cfg.switch_min_share)

    def _settle(self, out: Outputs) -> Outputs:
        """Raise the link findings of this call once every op in it was evaluated, whatever
        the ops' order: a ToR named takes in the groups beside it, and the groups one
        communicator's ops showed together may name the ToR they share."""
        if not self.later:
            return out
        later, self.later = self.later, []
        live = [f for f in later if self.ops.get(f.comm, {}).get(f.op) is f.st]  # not dropped
        for found in merged_by_comm(live, self._locate):
            for f in found:
                self._raise_network(out, f)
        return out

    def _raise_network(self, out: Outputs, f: NetFinding) -> None:
        comm, op, group, switch, loc, links = f.comm, f.op, f.group, f.switch, f.loc, f.links
        streaks = f.st.streaks["n_high"]
        key = "slow_network|" + (switch.tor if switch is not None else ",".join(links))
        tor = switch_of_most(loc, self.roster, comm, self.tor_of) if switch is None else None
        if tor is not None and "slow_network|" + tor in self.incidents:
            key = "slow_network|" + tor  # fewer of its hosts seen in another op: that switch
        elif switch is None:  # a ToR named before, whose hosts and neighbours hold the group
            key = open_switch(self.incidents, group, self.roster, comm, self.tor_of) or key
        new = False
        for r in group:
            if not streaks[r].fired:
                tid = f"{comm}|{op}|n_high|{r}"
                new = join_incident(self.incidents, key, tid, streaks[r]) or new
        if not new:
            return
        ev = f.evidence
        if switch is not None:
            ev = ev | {"switch": switch.tor, "switch_hosts": switch.troubled_hosts,
                   "switch_behind": switch.behind}
        what = (f"ToR {switch.tor} ({switch.troubled_hosts} of the ring's {switch.behind} hosts "
                "behind it are slow)" if switch is not None else ", ".join(links))
        out.diagnoses.append(make_diagnosis(
            job=self.job, kind="slow_network", detector=DETECTOR, rule="n_high",
            event_ts=min(streaks[r].first_ts for r in group), detected_ts=f.ts, hosts=f.hosts,
            links=links, evidence=ev, confidence={"endpoint": 0.75, "ring": 0.65}.get(loc.how, 0.6),
            summary=f"work requests of {len(ev['degraded_ranks'])} rank(s) in communicator {comm} ({op}) "
                    f"take over {self.cfg.beta}x the mean; suspect {what}"))

    # ---- incidents -----------------------------------------------------------------------
    def _drop(self, comm: str) -> None:
        self.roster.forget(comm)
        self.ops.pop(comm, None)
        for key, ids in list(self.incidents.items()):
            ids[:] = [t for t in ids if not t.startswith(comm + "|")]
            if not ids:
                del self.incidents[key]

    def _reject(self, out: Outputs, host: str, reason: str, detail: str, ts: float) -> Outputs:
        out.rejections.append(Rejection(DETECTOR, self.job, host, reason, detail, ts))
        return out

    # ---- state ---------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Plain msgpack/JSON-able state."""
        ops = [st.to_wire(c, op)
               for c, by_op in sorted(self.ops.items()) for op, st in sorted(by_op.items())]
        return {"v": 1, "job": self.job, "watermark": self.watermark,
                "next_sweep": self.next_sweep, "roster": self.roster.to_wire(), "ops": ops,
                "incidents": [[k, list(v)] for k, v in sorted(self.incidents.items())]}

    @classmethod
    def restore(cls, state: Mapping[str, Any], job: str, config: TDNConfig | None = None,
                inventory: Inventory | None = None) -> TDNDetector:
        check_snapshot_v1(state, "tdn")
        det = cls(job, config, inventory)
        det.watermark, det.next_sweep = float(state["watermark"]), float(state["next_sweep"])
        det.roster = CommRoster.from_wire(state["roster"], det.cfg.max_comms, det.cfg.max_peers)
        for row in state["ops"]:
            comm, op, st = OpState.from_wire(row)
            det.ops.setdefault(comm, {})[op] = st
        det.incidents = {k: list(v) for k, v in state["incidents"]}
        return det
