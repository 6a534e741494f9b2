"""Aegis §4.2 ``rank_silent``: the hosts one assessment finds silent, over every stalled
communicator of the job, make one diagnosis.

Hosts that stop together (a rack's power, a switch's hosts) each sit in their own
communicators when the job has several parallel dimensions (pp=2: one DP communicator per
stage and TP rank). One diagnosis for all of them keeps their isolations one decision for
the guard (all or none past the blast-radius cap) and asks for one restart, not one per
communicator. A host already in an incident only joins it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from processors.core.base import gpu_id, make_diagnosis, restart_actions
from processors.core.ccl_state import CommRoster
from schemas.records import Diagnosis

DETECTOR = "ccl_alignment"


@dataclass(slots=True)
class SilentHosts:
    """What one assessment's silent ranks mean: a new diagnosis and the incidents it opens
    (key -> communicators), and the (key, communicator) pairs that join open incidents."""

    diagnosis: Diagnosis | None = None
    opened: dict[str, list[str]] = field(default_factory=dict)
    joined: list[tuple[str, str]] = field(default_factory=list)


def silent_hosts(job: str, roster: CommRoster, silent: Mapping[str, list[int]],
                 incidents: Mapping[str, list[str]], now: float, stall_s: float) -> SilentHosts:
    """``silent``: stalled communicator -> its silent ranks, in assessment order."""
    res = SilentHosts()
    new: dict[str, float] = {}  # host -> its last report
    where: dict[str, list[int]] = {}  # communicator -> its ranks on new hosts
    for comm, ranks in silent.items():
        mem = roster.members[comm]
        for host in sorted({mem[r].host for r in ranks}):
            key = f"host|{host}"
            if key in incidents:
                res.joined.append((key, comm))
                continue
            mine = [r for r in ranks if mem[r].host == host]
            last = min(mem[r].seen_ts for r in mine)
            new[host] = min(last, new.get(host, last))
            where.setdefault(comm, []).extend(mine)
            comms = res.opened.setdefault(key, [])
            if comm not in comms:
                comms.append(comm)
    if not new:
        return res
    hosts = sorted(new)
    since = min(new.values())
    quiet = sorted(gpu_id(h, g) for (h, g), comms in roster.by_gpu.items()
                   if h in new and all(roster.members[c][r].seen_ts <= new[h]
                                       for c, r in comms.items()))
    first, *others = where
    ev: dict[str, Any] = {
        "actions": [*(["isolate_host", h] for h in hosts), *restart_actions(job, hosts)],
        "comm": first, "ranks": sorted(where[first]),
        "silent_gpus": quiet, "silent_since": since, "stall_s": stall_s}
    if others:
        ev["other_comms"] = [{"comm": c, "ranks": sorted(where[c])} for c in others[:32]]
    if len(hosts) > 1:
        ev["silent_since_by_host"] = {h: new[h] for h in hosts}
    who = hosts[0] if len(hosts) == 1 else f"{', '.join(hosts[:-1])} and {hosts[-1]}"
    where_txt = f"communicator {first}" + (f" and {len(others)} other(s)" if others else "")
    res.diagnosis = make_diagnosis(
        job=job, kind="hang_compute", detector=DETECTOR, rule="rank_silent",
        event_ts=since, detected_ts=now, hosts=hosts, evidence=ev, confidence=0.8,
        summary=f"{who} stopped reporting CCL counters at {since:.3f} while "
                f"{'its' if len(hosts) == 1 else 'their'} peers in {where_txt} "
                "kept reporting, stalled")
    return res
