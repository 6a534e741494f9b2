"""The guard: Diagnoses (facts) in, IsolationCommands (decisions) and refusals out.

Pure and in event time: "now" is always ``diagnosis.detected_ts``, never the wall clock, so
a replay makes the same decisions, with the same command ids, as the live run.

Rules (defaults in :class:`GuardConfig`; docs/sinks.md has the rationale):
- Recommended actions come from ``diagnosis.evidence["actions"]`` = ``[[action, target], ...]``.
- Blast radius (Aegis §6, CBD: "if many hosts fail at once, roll back the recent update instead
  of isolating them all"): per job, at most ``max(job_isolation_min, ⌊pct% × job hosts⌋)``
  distinct hosts isolated (isolate_host / isolate_gpu, counted by host) within ``window_s``.
  A diagnosis that would go past it has all its isolations refused, and the guard emits ONE
  ``systemic`` Diagnosis plus ONE ``rollback_update`` (or ``run_offline_diag``) command for
  the job per window.
- Cluster rate limit: at most ``cluster_max_isolations`` distinct hosts isolated cluster-wide
  within ``cluster_window_s``.
- A diagnosis' isolations are all-or-nothing (Aegis Alg. 1 isolates both hosts of a 2-host
  DistError, never one), and its ``restart_job`` is refused when its isolations were.
- Config diagnoses never isolate (Aegis Alg. 1: ConfigCheck, not hardware), and a hang or
  DistError on a host one named, with evidence within ``explained_s`` of it, is its
  consequence: not isolated (``explained_by_config``); its restart_job goes on.
- The same diagnosis id twice gives nothing; the same action on the same target within
  ``repeat_window_s`` is refused as a repeat (three detectors reporting one fault must not
  restart the job thrice), except a restart_job whose diagnosis just isolated a new host.
- One incident, several detectors: a diagnosis detected after a command was issued, whose
  evidence began (``event_ts``) at or before it, describes the incident that command answered. The
  same action on the same target is then a repeat however late it comes (Z-score needs T =
  600 s to confirm what TD/N saw in seconds), and an isolation of a host that had itself or
  one of its GPUs isolated for the job is refused ``already_isolated`` (a hang seen after a
  GPU's crash must not escalate to its host), unless it names two or more of the host's GPUs,
  some still in the job (a host slow everywhere, after one of its GPUs was isolated).

Windows are symmetric in event time (|t - t_i| < W), so any interval of length W holds at
most the cap, whatever order late diagnoses arrive in.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from schemas.errors import ConfigError
from schemas.records import Culprits, Diagnosis, IsolationCommand, diagnosis_id
from sinks.base import GuardRefusal, SinkItem
from sinks.guard_actions import ISOLATING_ACTIONS, parse_actions, peers_down
from sinks.guard_state import GuardState

SYSTEMIC_ACTIONS = ("rollback_update", "run_offline_diag")
SNAPSHOT_VERSION = 1


@dataclass(frozen=True, slots=True)
class GuardConfig:
    """Guard policy. Times are event-time seconds."""

    job_isolation_pct: float = 10.0  # % of the job's hosts that may be isolated per window
    job_isolation_min: int = 2  # Aegis Alg. 1 isolates both hosts of a 2-host DistError
    window_s: float = 3600.0
    # O(1K) hosts see 100-230 severe failures/week (Aegis §2), ~1.4/h at peak: 20/h is ~15x.
    cluster_max_isolations: int = 20
    cluster_window_s: float = 3600.0
    systemic_action: str = "rollback_update"  # or run_offline_diag (Aegis Alg. 1 OfflineDiag)
    repeat_window_s: float = 600.0
    memory_s: float = 86400.0  # how long diagnosis ids and history are remembered
    no_isolation_kinds: tuple[str, ...] = ("config",)
    # a hang or DistError on a host that a config diagnosis named (the job's own failure:
    # OOM kill, app error, termination) with evidence within this of it is its consequence
    consequence_kinds: tuple[str, ...] = ("hang_compute", "hang_network", "dist_error")
    explained_s: float = 600.0
    # hosts a diagnosis shows down (evidence "hosts_down": no line, no agent heartbeat) may be
    # isolated past the job's blast radius, and do not count towards it: they do no work
    # isolated or not (a rack's power). The cluster rate limit still holds.
    down_hosts_past_cap: bool = True
    # ... and so may hosts another diagnosis showed down (telemetry_liveness' host_dark) with
    # an onset within this of the diagnosis' evidence; a run_netdiag of a link to one of
    # them is refused (endpoint_down): the dead host broke the connections, not the link
    down_window_s: float = 300.0

    def __post_init__(self) -> None:
        if not (0 <= self.job_isolation_pct <= 100) or not math.isfinite(self.job_isolation_pct):
            raise ConfigError(f"guard: job_isolation_pct={self.job_isolation_pct!r} not in [0, 100]")
        if self.job_isolation_min < 0 or self.cluster_max_isolations < 0:
            raise ConfigError("guard: job_isolation_min and cluster_max_isolations must be >= 0")
        for name in ("window_s", "cluster_window_s", "repeat_window_s", "memory_s",
                     "explained_s", "down_window_s"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ConfigError(f"guard: {name}={v!r} must be a finite number >= 0")
        if not isinstance(self.down_hosts_past_cap, bool):
            raise ConfigError(f"guard: down_hosts_past_cap={self.down_hosts_past_cap!r}: "
                              "true or false")
        if self.systemic_action not in SYSTEMIC_ACTIONS:
            raise ConfigError(f"guard: systemic_action={self.systemic_action!r} "
                              f"not one of {list(SYSTEMIC_ACTIONS)}")
        need = 2 * max(self.window_s, self.cluster_window_s, self.repeat_window_s)
        if self.memory_s < need:
            raise ConfigError(f"guard: memory_s={self.memory_s} must be >= 2x the longest "
                              f"window ({need})")

    def job_cap(self, job_hosts: int) -> int:
        """Most distinct hosts of one job that may be isolated per window."""
        return max(self.job_isolation_min, math.floor(self.job_isolation_pct * job_hosts / 100))


@dataclass(frozen=True, slots=True)
class GuardDecision:
    """What the guard made of one diagnosis."""

    commands: tuple[IsolationCommand, ...] = ()
    refusals: tuple[GuardRefusal, ...] = ()
    diagnoses: tuple[Diagnosis, ...] = ()  # systemic diagnoses raised by the guard
    duplicate: bool = False  # the diagnosis id was seen before

    def items(self) -> list[SinkItem]:
        """All outputs in sink order: raised diagnoses, commands, refusals."""
        return [*self.diagnoses, *self.commands, *self.refusals]


def host_of(target: str) -> str:
    """``h0017/gpu3`` -> ``h0017``; ``h0017`` -> ``h0017``."""
    return target.split("/", 1)[0]


class Guard:
    """Blast-radius and rate-limit policy between detectors and remediation (pure).

    ``job_hosts(job) -> int`` gives a job's host count (0 = unknown: the cap is then
    ``job_isolation_min``); :meth:`set_job_size` overrides it per job.
    """

    def __init__(self, config: GuardConfig | None = None,
                 job_hosts: Callable[[str], int] | None = None) -> None:
        self.config = config or GuardConfig()
        self._job_hosts = job_hosts
        self._sizes: dict[str, int] = {}
        self._s = GuardState()

    # -- job sizes ---------------------------------------------------------------------------
    def set_job_size(self, job: str, hosts: int) -> None:
        self._sizes[job] = int(hosts)

    def job_size(self, job: str) -> int:
        if job in self._sizes:
            return self._sizes[job]
        return int(self._job_hosts(job)) if self._job_hosts else 0

    # -- the decision ------------------------------------------------------------------------
    def decide(self, d: Diagnosis) -> GuardDecision:
        """Turn one diagnosis into commands, refusals and (maybe) a systemic diagnosis."""
        s = self._s
        if d.id in s.seen:
            return GuardDecision(duplicate=True)
        t = float(d.detected_ts)
        s.seen[d.id] = t
        if t > s.watermark:
            s.watermark = t
            if t - s.pruned_at >= self.config.memory_s / 8:
                self._prune()
        refusals: list[GuardRefusal] = []
        commands: list[IsolationCommand] = []
        raised: list[Diagnosis] = []

        def refuse(action: str, target: str, reason: str, detail: str = "") -> None:
            refusals.append(GuardRefusal(d.id, action, target, reason, d.job, detail, t))

        s.note_dark(d)
        isolations, others = parse_actions(d, refuse)
        down = self._down(d)
        if d.kind in self.config.no_isolation_kinds:
            for h in d.culprits.hosts:
                s.explained[(d.job, h)] = float(d.event_ts)
        isolation_refused = False
        if isolations and d.kind in self.config.no_isolation_kinds:
            for a, tgt in isolations:
                refuse(a, tgt, "config_no_isolation",
                       f"{d.kind} diagnoses are fixed by configuration, not by isolating hardware")
            isolation_refused = True
        elif isolations:
            for a, tgt, prev in self._answered(d, t, isolations):
                refuse(a, tgt, "already_isolated",
                       f"host {prev[1]} had an isolation at event time {prev[0]:.3f}, after this "
                       f"diagnosis' evidence began ({float(d.event_ts):.3f}): the same incident")
                isolations.remove((a, tgt))
            for a, tgt, ts in self._explained(d, isolations):
                refuse(a, tgt, "explained_by_config",
                       f"a config diagnosis named host {host_of(tgt)} at event time {ts:.3f} "
                       f"(the job's own failure, not its hardware): this {d.kind} follows it")
                isolations.remove((a, tgt))
            if (gone := peers_down(d, down)) and isolations:
                for a, tgt in isolations:
                    refuse(a, tgt, "peers_down", f"every failed connection of {host_of(tgt)} "
                           f"was to a host shown down ({', '.join(gone)}): it reported them")
                isolations, isolation_refused = [], True
        if isolations and d.kind not in self.config.no_isolation_kinds:
            verdict = self._check_caps(d, t, isolations, down)
            if verdict is not None:
                reason, detail = verdict
                for a, tgt in isolations:
                    refuse(a, tgt, reason, detail)
                isolation_refused = True
                s.named[d.job] = max(t, s.named.get(d.job, t))  # localised, though not isolated
                if reason == "blast_radius":
                    raised_cmd = self._systemic(d, t, isolations, detail)
                    if raised_cmd is not None:
                        raised.append(raised_cmd[0])
                        commands.append(raised_cmd[1])
            else:
                for a, tgt in isolations:
                    if self._issue(d, t, a, tgt, commands, refuse):
                        bisect.insort(s.isolations, (t, d.job, host_of(tgt)))
                        if host_of(tgt) in down:
                            s.down[(d.job, host_of(tgt))] = t
        isolated_now = any(c.action in ISOLATING_ACTIONS for c in commands)
        for a, tgt in others:
            if a == "run_offline_diag" and self._localised(d.job, t):
                refuse(a, tgt, "already_localised",
                       "another detector already named the culprit of this job within the "
                       "window; offline diagnosis is the fallback when nothing else fits")
                continue
            if a == "run_netdiag" and (gone := sorted(down & {host_of(x) for x in tgt.split("<->")})):
                refuse(a, tgt, "endpoint_down",
                       f"host {', '.join(gone)} of the link is down (no telemetry or heartbeat): "
                       "its connections failed with it, the link is no suspect")
                continue
            if a == "restart_job" and isolation_refused:
                refuse(a, tgt, "follows_refused_isolation",
                       "not restarting onto hosts the guard refused to isolate")
                continue
            # A job that just lost a host must restart even if it restarted minutes ago.
            self._issue(d, t, a, tgt, commands, refuse,
                        check_repeat=not (a == "restart_job" and isolated_now))
        return GuardDecision(tuple(commands), tuple(refusals), tuple(raised))

    def _answered(self, d: Diagnosis, t: float, isolations: list[tuple[str, str]]
                  ) -> list[tuple[str, str, tuple[float, str]]]:
        """Isolations on hosts this job already isolated (the host or one of its GPUs) after
        this diagnosis' evidence began, with (when, which host) of that earlier isolation."""
        since = float(d.event_ts)
        earlier: dict[str, tuple[float, str]] = {}
        for ts, job, h in self._isolations_near(t, self.config.window_s):
            if job == d.job and since <= ts <= t:  # an isolation that came first, in event time
                earlier.setdefault(h, (ts, h))
        return [(a, tgt, earlier[host_of(tgt)]) for a, tgt in isolations
                if host_of(tgt) in earlier and not self._escalates(d, a, tgt)]

    def _explained(self, d: Diagnosis, isolations: list[tuple[str, str]]
                   ) -> list[tuple[str, str, float]]:
        """Isolations a hang or DistError asks for on a host whose failure a config diagnosis
        already explained (an OOM kill: the peers then hang on it, silent): its consequence."""
        if d.kind not in self.config.consequence_kinds:
            return []
        out = []
        for a, tgt in isolations:
            ts = self._s.explained.get((d.job, host_of(tgt)))
            if ts is not None and abs(float(d.event_ts) - ts) <= self.config.explained_s:
                out.append((a, tgt, ts))
        return out

    def _escalates(self, d: Diagnosis, action: str, target: str) -> bool:
        """An isolate_host whose diagnosis names two or more GPUs of the host, some of them
        still in the job (Z-score's host roll-up after TD/N isolated the first): the host is
        the culprit, so the earlier GPU isolation did not answer it."""
        host = host_of(target)
        gpus = [g for g in d.culprits.gpus if host_of(g) == host]
        if action != "isolate_host" or len(gpus) < 2 or (
                d.job, "isolate_host", host) in self._s.issued:
            return False
        return any((d.job, "isolate_gpu", g) not in self._s.issued for g in gpus)

    def _localised(self, job: str, t: float) -> bool:
        """Aegis Alg. 1: OfflineDiag is the fallback. A job whose culprit was isolated, sent to
        NetDiag, or named but refused isolation by a cap (the cluster budget, the blast radius)
        within ``window_s`` does not also need all its hosts taken out."""
        w = self.config.window_s
        if any(j == job and abs(ts - t) <= w for ts, j, _ in self._s.isolations):
            return True
        if job in self._s.named and abs(self._s.named[job] - t) <= w:
            return True  # named, but a cap refused the isolation: taking every host out is worse
        return any(j == job and a == "run_netdiag" and abs(ts - t) <= w
                   for (j, a, _), ts in self._s.issued.items())

    def _check_caps(self, d: Diagnosis, t: float, isolations: list[tuple[str, str]],
                    down: set[str]) -> tuple[str, str] | None:
        """None when the isolations fit both caps (hosts ``down`` past the job's), else
        (reason, detail)."""
        cfg = self.config
        wanted = {host_of(tgt) for _, tgt in isolations}
        job_hosts = {h for _, job, h in self._isolations_near(t, cfg.window_s) if job == d.job}
        job_hosts -= {h for (job, h) in self._s.down if job == d.job}
        new = wanted - job_hosts - down
        size = self.job_size(d.job)
        cap = cfg.job_cap(size)
        if len(job_hosts) + len(new) > cap:
            return "blast_radius", (
                f"job {d.job}: {len(job_hosts)} host(s) isolated within {cfg.window_s:g}s "
                f"and {len(new)} more requested, over the cap of {cap} = max("
                f"{cfg.job_isolation_min}, {cfg.job_isolation_pct:g}% of {size or 'unknown'} hosts)")
        cluster = {h for _, _, h in self._isolations_near(t, cfg.cluster_window_s)}
        new_c = wanted - cluster
        if len(cluster) + len(new_c) > cfg.cluster_max_isolations:
            return "cluster_rate_limit", (
                f"{len(cluster)} host(s) isolated cluster-wide within {cfg.cluster_window_s:g}s "
                f"and {len(new_c)} more requested, over the limit of {cfg.cluster_max_isolations}")
        return None

    def _down(self, d: Diagnosis) -> set[str]:
        """The hosts the diagnosis, or another one near its evidence's start, shows down,
        when the policy lets them past the cap."""
        if not self.config.down_hosts_past_cap:
            return set()
        v = d.evidence.get("hosts_down") if isinstance(d.evidence, Mapping) else None
        mine = {h for h in v if isinstance(h, str)} if isinstance(v, list | tuple) else set()
        return mine | self._s.dark_near(d.job, float(d.event_ts), self.config.down_window_s)

    def _isolations_near(self, t: float, window: float) -> list[tuple[float, str, str]]:
        """Accepted isolations with |ts - t| < window (the list is kept sorted by ts)."""
        iso = self._s.isolations
        lo = bisect.bisect_right(iso, t - window, key=lambda x: x[0])
        hi = bisect.bisect_left(iso, t + window, key=lambda x: x[0])
        return iso[lo:hi]

    def _issue(self, d: Diagnosis, t: float, action: str, target: str,
               commands: list[IsolationCommand], refuse: Callable[..., None],
               check_repeat: bool = True) -> bool:
        key = (d.job, action, target)
        last = self._s.issued.get(key)
        if check_repeat and last is not None and (abs(last - t) < self.config.repeat_window_s
                                                  or float(d.event_ts) <= last <= t):
            refuse(action, target, "repeat",
                   f"{action} {target} already issued at event time {last:.3f}"
                   + ("" if abs(last - t) < self.config.repeat_window_s else
                      f", after this diagnosis' evidence began ({float(d.event_ts):.3f})"))
            return False
        self._s.issued[key] = t
        rule = d.evidence.get("rule", "") if isinstance(d.evidence, Mapping) else ""
        reason = f"{d.kind} by {d.detector}" + (f" ({rule})" if rule else "")
        if d.summary:
            reason += f": {d.summary}"
        commands.append(IsolationCommand(
            id=IsolationCommand.make_id(d.id, action, target), job=d.job, action=action,
            target=target, reason=reason[:4096], diagnosis_id=d.id, issued_at=t))
        return True

    def _systemic(self, d: Diagnosis, t: float, isolations: list[tuple[str, str]], detail: str
                  ) -> tuple[Diagnosis, IsolationCommand] | None:
        """One systemic diagnosis + one rollback/offline command per job per window."""
        cfg, s = self.config, self._s
        last = s.systemic.get(d.job)
        if last is not None and abs(last - t) < cfg.window_s:
            return None
        s.systemic[d.job] = t
        hosts = sorted({h for _, job, h in self._isolations_near(t, cfg.window_s) if job == d.job}
                       | {host_of(tgt) for _, tgt in isolations})
        culprits = Culprits(hosts=tuple(hosts))
        rule = "guard_blast_radius"
        did = diagnosis_id(d.job, "systemic", culprits, rule, d.event_ts)
        action = cfg.systemic_action
        summary = (f"{detail}; the failure looks systemic, so {action} for job {d.job} "
                   f"instead of isolating more hosts (Aegis §6 CBD: mass failure means roll back)")
        diag = Diagnosis(
            id=did, job=d.job, kind="systemic", culprits=culprits,
            evidence={"rule": rule, "trigger": d.id, "trigger_kind": d.kind,
                      "cap": cfg.job_cap(self.job_size(d.job)), "job_hosts": self.job_size(d.job),
                      "window_s": cfg.window_s, "pct": cfg.job_isolation_pct,
                      "actions": [[action, d.job]]},
            confidence=0.6, event_ts=float(d.event_ts), detected_ts=t, detector="guard",
            summary=summary[:4096])
        s.seen[did] = t  # feeding it back must not act twice
        s.issued[(d.job, action, d.job)] = t
        cmd = IsolationCommand(id=IsolationCommand.make_id(did, action, d.job), job=d.job,
                               action=action, target=d.job, reason=summary[:4096],
                               diagnosis_id=did, issued_at=t)
        return diag, cmd

    def _prune(self) -> None:
        """Forget what is older than ``memory_s`` behind the watermark (run every memory_s/8
        of event time, so the cost is amortised; entries that old are outside every window)."""
        self._s.prune(self._s.watermark - self.config.memory_s)

    # -- state -------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """JSON/msgpack-ready state (sorted, so equal states give equal snapshots)."""
        return {"v": SNAPSHOT_VERSION, **self._s.to_wire(),
                "job_sizes": dict(sorted(self._sizes.items()))}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Replace the state with a :meth:`snapshot`."""
        if state.get("v") != SNAPSHOT_VERSION:
            raise ConfigError(f"guard: snapshot version {state.get('v')!r} not supported "
                              f"(reads {SNAPSHOT_VERSION})")
        self._s = GuardState.from_wire(state)
        self._sizes = {str(k): int(v) for k, v in state.get("job_sizes", {}).items()}
