"""Aegis Phase 1 decision tree (Algorithm 1) over one job's log lines, in event time.

Each line is classified (:mod:`processors.core.log_classifier`). A *trigger* (a host-side
fatal event, a fatal distributed symptom, a fatal config error, a fatal CUDA app error) opens
a burst; the burst is judged once the watermark passes ``first trigger + settle_s`` (for a
trigger that came behind it, :mod:`processors.core.tree_clock`), so the host that crashed
first is not confused with the host that reported first. The path:

    CriticalError  host-side fatal event (XID 48/79/94/95, NVLink, PCIe lanes, NIC firmware,
                   uncorrectable host memory, machine checks):
                   isolate that host (or GPU) and restart the job; symptoms elsewhere are
                   attributed to it (71% of distributed failures are not network failures).
    AppError       the job's own CUDA error (OOM, illegal access): no isolation.
    RestartApp     a non-fatal XID with policy action restart_job (NVIDIA's RESTART_APP) before
                   any distributed symptom (processors.core.tree_contained): no isolation.
    DistError      distributed symptoms between exactly 2 hosts (a line names the other end):
                   isolate both.
    RootDiag       more hosts (processors.core.root_diag): the endpoint at the centre of the
                   failed connections (most connections, or in all of the first ones) or
                   the one host with host-side evidence, or the one silent host of the job.
    ConfigCheck    the same config error on most hosts: ``config``, no isolation;
                   ``rollback_update`` only when it looks like an update (version mismatch).
    NetDiag        suspect links (failed connections, NIC events): ``run_netdiag``.
    OfflineDiag    nothing else: ``run_offline_diag`` on the job.

After a diagnosis, later symptoms are attached to the incident until ``quiet_s`` passes with
none. Benign events (correctable ECC, XID 63/64/92) never cause isolation.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from processors.core import tree_state
from processors.core.base import Outputs, Rejection, gpu_id, make_diagnosis, restart_actions
from processors.core.log_classifier import classify
from processors.core.root_diag import Edge, root_of
from processors.core.tree_clock import BurstClock
from processors.core.tree_contained import app_ecc_follows_xid, contained_xids, restart_summary
from processors.core.tree_events import (
    HOST_SIDE,
    HOST_WIDE,
    PEER_DOWN_RULES,
    UPDATE_RULES,
    DecisionTreeConfig,
    TreeEvent,
    is_config,
    is_evidence,
    is_trigger,
    names_peer,
    tree_event,
    via_store,
)
from processors.core.tree_incident import Watchdogs, absorbed, hold_until, note_watchdog, torn_down
from processors.core.tree_liveness import Liveness, explained_by_dark
from processors.core.tree_peers import JobPeers, one_end_at_fault, suspect_links, switch_of_nics
from processors.core.xid_policy import XidPolicy, default_policy
from schemas.inventory import Inventory
from schemas.records import Diagnosis, LogRecord

DETECTOR = "decision_tree"
MAX_HOLDS = 4  # offline wait, pair settle, last reporter, a dark peer: each at most once


class DecisionTree:
    """One job's Phase 1 detector: ``observe(LogRecord)``, ``advance(now)``, ``snapshot()``."""

    name = DETECTOR

    def __init__(self, job: str, config: DecisionTreeConfig | None = None,
                 inventory: Inventory | None = None, policy: XidPolicy | None = None) -> None:
        self.job = job
        self.cfg = config or DecisionTreeConfig()
        self.inventory = inventory
        self.policy = policy or default_policy()
        self.watermark = 0.0
        self.burst: list[TreeEvent] = []
        self.recent: list[TreeEvent] = []  # degraded host-side events, for lookback
        self.incident: dict[str, Any] | None = None  # {"until", "hosts", "attached"}
        self.seen_hosts: set[str] = set()
        # [first, last] "the job was stopped from outside" lines of the latest shutdown (lines
        # under quiet_s apart belong to one: each host's agent logs its own)
        self.terminated: list[float] | None = None
        self.offline_at: float | None = None  # a held burst (hold_until) is judged then
        self.watchdogs: Watchdogs = {}  # the job's recent timeout lines (teardowns)
        self.peers = JobPeers(job, inventory, self.seen_hosts)
        self.liveness = Liveness()  # agents' heartbeats: which hosts went dark
        self._dark_due: float | None = None  # set by _judge: a failed peer missed its beat
        self.clock = BurstClock()  # a burst whose trigger came late is judged by its stream

    # ---- contract ------------------------------------------------------------------------
    def observe(self, record: LogRecord) -> Outputs:
        out = Outputs()
        ts = float(record.ts)
        if not math.isfinite(ts):
            out.rejections.append(self._reject(record, "not_finite", f"ts={record.ts!r}"))
            return out
        if record.job is not None and record.job != self.job:
            out.rejections.append(self._reject(record, "wrong_job", f"job={record.job!r}"))
            return out
        if self.watermark and ts < self.watermark - self.cfg.max_lateness_s:
            out.rejections.append(self._reject(record, "late", f"ts={ts} watermark={self.watermark}"))
            return out
        self.clock.note(ts, self.watermark)
        out.extend(self.advance(ts))
        if len(self.seen_hosts) < 65536:
            self.seen_hosts.add(record.host)
        self.liveness.note(record.host, ts, record.source, record.line)
        inv = self.inventory.hosts.get(record.host) if self.inventory else None
        e = classify(record.line, record.source, inv, self.policy)
        if e.rule == "job_terminated":
            if self.terminated is None or ts > self.terminated[1] + self.cfg.quiet_s:
                self.terminated = [ts, ts]
            else:
                self.terminated = [min(ts, self.terminated[0]), max(ts, self.terminated[1])]
        elif (e.gpu is not None and e.action != "isolate_host" and e.category not in HOST_WIDE
              and self.peers.other_jobs_gpu(record.host, e.gpu)):
            pass  # a GPU of another job on a shared host: its own job's tree judges it
        elif is_trigger(e) or is_evidence(e):
            ev = tree_event(ts, record.host, e, record.line[: self.cfg.line_chars])
            self._ingest(ev, ev.sev == "fatal")
        return out

    def advance(self, now: float) -> Outputs:
        out = Outputs()
        if math.isfinite(now) and now > self.watermark:
            self.watermark = now
        if self.incident and self.watermark > max(self.incident["until"],
                                                  self.incident.get("absorb_until", 0.0)):
            self.incident = None
        start = self._burst_start()
        clock = self.clock.now(self.watermark)
        if start is not None and clock >= start + self.cfg.settle_s:
            inc = self.incident
            if inc is not None and all(self._absorbed(e) for e in self.burst):
                inc["attached"] += len(self.burst)  # the found incident's teardown
                self.burst, self.offline_at = [], None
                self.clock.close()
                return out
            if self.offline_at is not None and clock < self.offline_at:
                return out  # held: for Phase 2, for the rest of a pair's peers, for a new trigger
            at = self.offline_at if self.offline_at is not None else start + self.cfg.settle_s
            d = self._judge(self.burst, at)
            for _ in range(MAX_HOLDS):  # a verdict judged again after its hold may hold too
                hold = hold_until(d, start, self.cfg, len(self.peers.members), self._dark_due,
                                  self.burst)
                if hold is None or at >= hold:
                    break
                self.offline_at = at = hold
                if clock < hold:
                    return out
                d = self._judge(self.burst, hold)
            self.offline_at = None
            hosts = sorted({e.host for e in self.burst if e.host_fatal})
            last = max(e.ts for e in self.burst)
            absorb = last + self.cfg.absorb_s if d.kind in ("critical_error", "dist_error") \
                or d.evidence.get("rule") == "restart_app" else 0.0  # its peers then time out
            culprits = sorted(set(d.culprits.hosts) | {g.split("/")[0] for g in d.culprits.gpus})
            self.incident = {"until": last + self.cfg.quiet_s, "hosts": hosts, "attached": 0,
                             "absorb_until": absorb, "culprits": culprits}
            self.burst = []
            self.clock.close()
            out.diagnoses.append(d)
        return out

    def flush(self) -> Outputs:
        """End of input (a file): judge a burst whose settle (or offline wait) time runs past
        the last record."""
        start = self._burst_start()
        if start is None:
            return Outputs()
        self.clock.close()  # no more lines: the burst's own stream has ended too
        out = self.advance(start + self.cfg.settle_s)
        if self.offline_at is not None:
            out.extend(self.advance(self.offline_at))
        return out

    def snapshot(self) -> dict[str, Any]:
        return tree_state.to_wire(self)

    @classmethod
    def restore(cls, state: Mapping[str, Any], job: str, config: DecisionTreeConfig | None = None,
                inventory: Inventory | None = None, policy: XidPolicy | None = None) -> DecisionTree:
        t = cls(job, config, inventory, policy)
        tree_state.load(t, state, job)
        return t

    # ---- bursts ---------------------------------------------------------------------------
    def _reject(self, r: LogRecord, reason: str, detail: str) -> Rejection:
        return Rejection(DETECTOR, self.job, r.host, reason, detail, float(r.ts) if
                         math.isfinite(float(r.ts)) else 0.0)

    def _burst_start(self) -> float | None:
        starts = [e.ts for e in self.burst if e.host_fatal or e.sev == "fatal"]
        return min(starts) if starts else None

    def _ingest(self, ev: TreeEvent, trigger: bool) -> None:
        note_watchdog(self.watchdogs, ev, self.cfg.max_lateness_s + self.cfg.teardown_s)
        inc = self.incident
        if inc is not None and ev.ts <= inc["until"] and not (ev.host_fatal and ev.host not in inc["hosts"]):
            inc["until"] = max(inc["until"], ev.ts + self.cfg.quiet_s) if trigger else inc["until"]
            inc["attached"] += 1
            return
        if inc is not None and self._absorbed(ev):
            inc["attached"] += 1  # Aegis §3: a CCL timeout is a symptom of the found fault
            return
        if self.burst or trigger:
            if not self.burst:
                self.burst = [e for e in self.recent if e.ts >= ev.ts - self.cfg.lookback_s]
                self.recent = []
            if trigger:  # the clock is closed whenever the burst is empty
                self.clock.join(ev.ts, self.watermark, self.cfg.settle_s)
            if len(self.burst) < self.cfg.max_burst_events:
                self.burst.append(ev)
            if trigger and self.offline_at is not None:  # a finding while a burst is held:
                # judged once it has settled like any trigger (its peers report meanwhile)
                self.offline_at = min(self.offline_at, ev.ts + self.cfg.settle_s)
            return
        self.recent = [e for e in self.recent if e.ts >= ev.ts - self.cfg.lookback_s][-255:] + [ev]

    # ---- Algorithm 1 ----------------------------------------------------------------------
    def _judge(self, events: Sequence[TreeEvent], detected_ts: float) -> Diagnosis:
        path: list[str] = []
        self._dark_due = None
        events = app_ecc_follows_xid(events)
        crit = [e for e in events if e.host_fatal]
        if crit:
            path.append("CriticalError:hit")
            return self._critical(events, crit, path, detected_ts)
        path.append("CriticalError:miss")
        app = [e for e in events if e.cat == "cuda_app_error" and e.sev == "fatal"]
        if app:
            path.append("AppError:hit")
            return self._make("config", "app_error", events, app, path, [], detected_ts, 0.6,
                              hosts=sorted({e.host for e in app}),
                              summary=f"application error ({app[0].rule}) on "
                                      f"{len({e.host for e in app})} host(s): fix the job, no isolation")
        contained = contained_xids(events)
        if contained:
            path.append("RestartApp:hit")
            return self._make("config", "restart_app", events, contained, path,
                              restart_actions(self.job, self.seen_hosts), detected_ts, 0.6,
                              hosts=sorted({e.host for e in contained}), summary=restart_summary(contained))
        dist = [e for e in events if e.cat == "distributed_symptom"]
        start = min(e.ts for e in events)
        # stopped from outside before the errors began (a second of slack): they are its
        # shutdown. A kill that follows the errors (srun --kill-on-bad-exit after a crash)
        # does not explain them.
        if self.terminated is not None and start - self.cfg.quiet_s <= self.terminated[0] <= start + 1.0:
            path.append("Terminated:hit")
            return self._make("config", "job_terminated", events, dist or events, path, [],
                              detected_ts, 0.6, summary="the job was stopped from outside "
                              "(scheduler cancel, time limit, SIGTERM): the errors around it are "
                              "its shutdown, no isolation")
        edges: list[Edge] = []
        stray: set[str] = set()
        if dist:
            # the teardown's connection failures name aborting ranks, not the culprit; the
            # store's and rendezvous' name rank 0's host, to which every rank connects
            linked = [e for e in dist if not via_store(e) and not torn_down(
                e, self.watchdogs, self.cfg.teardown_s, self.peers.host_of)]
            involved, edges, stray = self.peers.endpoints(linked)
            members = self.peers.members
            named = sorted(h for h in involved if not h.startswith("?") and h in members)
            # Aegis Alg. 1 "errors between 2 hosts": a line must name the other end, or be a
            # connection's own failure. Timeouts name nobody; in a 2-host job both hosts log
            # them whichever one failed, so they go on to RootDiag (and Phase 2), not
            # isolate-both.
            between = any(names_peer(e) for e in linked)
            if len(named) == 1 and len(involved) == 2 and len(self.peers.job_hosts) == 2:
                named = sorted(self.peers.job_hosts)  # the unresolved end of a 2-host job's link
            # both ends must be hosts we can name: a peer outside the job (a storage server,
            # an address no inventory lists) does not make the one reporter a culprit
            own: tuple[str, str] | None = None
            if len(involved) == 2 and len(named) == 2 and between:
                own = one_end_at_fault(events, named)
                if own is None:
                    path.append(f"DistError:{len(involved)}hosts")
                    acts = [["isolate_host", h] for h in named] + restart_actions(self.job, self.seen_hosts)
                    return self._make("dist_error", "dist_error_2hosts", events, dist, path, acts,
                                      detected_ts, 0.7, hosts=named, summary=f"distributed errors "
                                      f"between {' and '.join(named)}: isolate both")
                path.append(f"DistError:2hosts:{own[0]}_evidence")
                if own[0] == "config":
                    return self._config(events, [e for e in events if is_config(e)], path,
                                        detected_ts)
            else:
                path.append(f"DistError:{len(involved)}hosts")
            dark: list[str] = []
            if edges and not own:
                lv, ends = self.liveness, {h for _, a, b in edges for h in (a[0], b[0])}
                dark = lv.dark(detected_ts, members or self.seen_hosts, self.cfg.dark_s,
                               self.cfg.dark_recent_s)
                self._dark_due = lv.due(detected_ts, ends, self.cfg.dark_s)
            if explained_by_dark(edges, dark):  # hosts down together: their live peers name some
                acts = [["isolate_host", h] for h in dark] + restart_actions(self.job, self.seen_hosts)
                key = [e for e in dist if e.host in dark or self.peers.host_of(e)[0] in dark]
                return self._make("dist_error", "root_diag", events, key, [*path, "RootDiag:dark_hosts"],
                                  acts, detected_ts, 0.8, hosts=dark, hosts_down=dark,
                                  last_heard={h: self.liveness.heard[h] for h in dark},
                                  summary=f"{', '.join(dark)} went dark (no line, no agent "
                                          "heartbeat) and the failed connections touch them")
            sw = None if own else switch_of_nics(events, self.inventory, members, self.cfg)
            if sw is not None:  # the NICs behind one ToR failed: the switch, not a host
                return self._make("hang_network", "net_diag", events, dist, [*path, "NetDiag:switch"],
                                  [["run_netdiag", sw[0]]], detected_ts, 0.6, links=sw[1][:8],
                                  summary=f"NICs of {len(sw[1])} hosts behind ToR {sw[0]} failed")
            suspects = [own[1]] if own else sorted(
                {e.host for e in events if e.cat in HOST_SIDE and e.sev == "degraded"})
            centre = root_of(edges, suspects, self.peers.job_hosts or frozenset(self.seen_hosts),
                             {e.host for e in dist if not via_store(e)}, self.cfg.root_min_share)
            if centre is not None:
                host, gpu, why = centre
                if any(e.rule in PEER_DOWN_RULES and self.peers.host_of(e)[0] == host for e in dist):
                    gpu = None  # the scheduler (or runtime) lost the whole node
                path.append(f"RootDiag:{why}")
                target = ["isolate_gpu", gpu_id(host, gpu)] if gpu is not None else ["isolate_host", host]
                key = [e for e in dist if e.host == host or self.peers.host_of(e)[0] == host] or dist
                peer_hosts = sorted({h for _, a, b in edges if host in (a[0], b[0])
                                     for h in (a[0], b[0])} - {host})  # the guard's peers_down
                return self._make("dist_error", "root_diag", events, key, path,
                                  [target, *restart_actions(self.job, self.seen_hosts)], detected_ts, 0.75,
                                  hosts=[host] if gpu is None else [],  # a GPU's fault spares its host
                                  gpus=[gpu_id(host, gpu)] if gpu is not None else [],
                                  peer_hosts=peer_hosts,
                                  summary=f"root of the failed connections: {target[1]} ({why})")
            path.append("RootDiag:miss")
        else:
            path.append("DistError:miss")
        config = [e for e in events if is_config(e)]
        if config:
            return self._config(events, config, path, detected_ts)
        path.append("ConfigCheck:miss")
        links = suspect_links(events, edges, stray, self.inventory)
        if links:
            path.append("NetDiag:hit")
            return self._make("hang_network", "net_diag", events, dist or events, path,
                              [["run_netdiag", lk] for lk in links[:8]], detected_ts, 0.5,
                              links=links[:8], summary=f"no host-side cause; {len(links)} suspect link(s)")
        path.append("NetDiag:miss")
        path.append("OfflineDiag")
        return self._make("offline_needed", "offline_diag", events, events, path,
                          [["run_offline_diag", self.job]], detected_ts, 0.3,
                          summary="no pattern in the logs: test the job's hosts offline")

    def _critical(self, events: Sequence[TreeEvent], crit: list[TreeEvent], path: list[str],
                  detected_ts: float) -> Diagnosis:
        acts: list[list[str]] = []
        hosts: list[str] = []
        gpus: list[str] = []
        for host in sorted({e.host for e in crit}):
            mine = [e for e in crit if e.host == host]
            # Aegis Alg. 1: PCIe and NVLink faults take the host (the PCIe switch pairs a GPU
            # with a NIC; NVLink joins every GPU of the host), as do NIC errors
            if any(e.action == "isolate_host" or e.gpu is None or e.cat in HOST_WIDE for e in mine):
                acts.append(["isolate_host", host])
                hosts.append(host)  # and the GPUs the lines name (XID 79 on GPU 2), as evidence
                gpus += sorted({gpu_id(host, e.gpu) for e in mine if e.gpu is not None})
            else:
                for g in sorted({e.gpu for e in mine if e.gpu is not None}):
                    acts.append(["isolate_gpu", gpu_id(host, g)])
                    gpus.append(gpu_id(host, g))
        acts += restart_actions(self.job, self.seen_hosts)
        crit_hosts = {e.host for e in crit}
        others = sum(1 for e in events if e.cat == "distributed_symptom" and e.host not in crit_hosts)
        what = crit[0].rule if len({e.rule for e in crit}) == 1 else "critical errors"
        where = sorted(set(hosts + gpus) - {g.split("/")[0] for g in gpus})  # h03/gpu2, not h03 too
        return self._make("critical_error", "critical_error", events, crit, path, acts, detected_ts,
                          0.95, hosts=hosts, gpus=gpus, attributed=others,
                          summary=f"{what} on {', '.join(where)}; {others} distributed "
                                  f"symptom(s) elsewhere attributed to it")

    def _config(self, events: Sequence[TreeEvent], config: list[TreeEvent], path: list[str],
                detected_ts: float) -> Diagnosis:
        path.append("ConfigCheck:hit")
        cfg_hosts = sorted({e.host for e in config})
        pool = self.peers.members or {e.host for e in events}  # roster, else hosts seen
        # one host is never "systemic" unless it is the whole job: one host of two with a
        # mismatched image asks for that host's check, not a rollback of the update
        systemic = len(cfg_hosts) >= max(min(2, len(pool)),
                                         math.ceil(self.cfg.config_majority * len(pool)))
        rule = Counter(e.rule for e in config).most_common(1)[0][0]
        acts = [["rollback_update", self.job]] if systemic and rule in UPDATE_RULES else []
        return self._make("config", "config_check", events, config, path, acts, detected_ts, 0.8,
                          hosts=[] if systemic else cfg_hosts, config_rule=rule, systemic=systemic,
                          summary=f"{rule} on {len(cfg_hosts)} of {len(pool)} host(s): "
                                  f"{'systemic' if systemic else 'those hosts'}; no isolation")

    def _absorbed(self, ev: TreeEvent) -> bool:
        return absorbed(ev, self.incident, self.watchdogs, self.cfg.teardown_s, self.peers.host_of)

    # ---- output ---------------------------------------------------------------------------
    def _make(self, kind: str, rule: str, events: Sequence[TreeEvent], key: Sequence[TreeEvent], path: list[str],
              actions: list[list[str]], detected_ts: float, confidence: float, *,
              hosts: Sequence[str] = (), gpus: Sequence[str] = (), links: Sequence[str] = (),
              summary: str = "", **extra: Any) -> Diagnosis:
        chosen = sorted(key, key=lambda e: (e.ts, e.host))[: self.cfg.evidence_lines]
        lines = [{"host": e.host, "ts": e.ts, "rule": e.rule, "line": e.line} for e in chosen]
        evidence = {"path": path, "lines": lines, "actions": actions, "settle_s": self.cfg.settle_s,
                    "events": len(events), "hosts_reporting": len({e.host for e in events}), **extra}
        # a timed-out operation among the key lines began before its line: so did the fault
        first = min(min(e.ts for e in events), min((e.began for e in key), default=math.inf))
        return make_diagnosis(job=self.job, kind=kind, detector=DETECTOR, rule=rule,
                              event_ts=first, detected_ts=detected_ts,
                              hosts=hosts, gpus=gpus, links=links, evidence=evidence,
                              confidence=confidence, summary=summary)
