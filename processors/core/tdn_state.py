"""The TD/N detector's per-(communicator, op) state and its snapshot form (Aegis §5.2;
the rules are in processors/core/tdn.py)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from processors.core.ccl_state import Localisation, Located, SwitchSuspect


@dataclass(slots=True)
class Streak:
    """One rank's run of violations of one rule in one (communicator, op)."""

    count: int = 0  # consecutive violating evaluations
    first_seq: int = 0
    first_ts: float = 0.0
    clean: int = 0  # consecutive clean evaluations
    fired: str = ""  # incident key while fired; "" when armed

    def wire(self) -> list[Any]:
        return [self.count, self.first_seq, self.first_ts, self.clean, self.fired]


@dataclass(slots=True)
class OpState:
    size: int
    pending: dict[int, tuple[float, dict[int, float], dict[int, float]]] = field(
        default_factory=dict)  # seq -> (job clock at its first value, TD by rank, N by rank)
    oldest: float = math.inf  # least such time in ``pending`` (inf when empty)
    last_seq: dict[int, int] = field(default_factory=dict)
    done_upto: int = 0
    streaks: dict[str, dict[int, Streak]] = field(
        default_factory=lambda: {"td_short": {}, "n_high": {}})

    def reckon_oldest(self) -> None:
        """``oldest`` after removals; NaN times are never due, so they do not count."""
        self.oldest = min((b[0] for b in self.pending.values() if b[0] == b[0]), default=math.inf)

    def to_wire(self, comm: str, op: str) -> list[Any]:
        """``[comm, op, size, done_upto, last_seq, pending, streaks]``, plain msgpack/JSON."""
        return [comm, op, self.size, self.done_upto,
                [[r, s] for r, s in sorted(self.last_seq.items())],
                [[s, ts, [[r, v] for r, v in sorted(td.items())],
                  [[r, v] for r, v in sorted(n.items())]]
                 for s, (ts, td, n) in sorted(self.pending.items())],
                {rule: [[r, *x.wire()] for r, x in sorted(xs.items())]
                 for rule, xs in self.streaks.items()}]

    @classmethod
    def from_wire(cls, row: list[Any]) -> tuple[str, str, OpState]:
        """The inverse of :meth:`to_wire`: (comm, op, state)."""
        comm, op, size, done, last, pending, streaks = row
        st = cls(int(size), done_upto=int(done), last_seq={int(r): int(s) for r, s in last})
        st.pending = {int(s): (float(ts), {int(r): float(v) for r, v in td},
                               {int(r): float(v) for r, v in n})
                      for s, ts, td, n in pending}
        st.streaks = {rule: {int(r): Streak(int(c), int(fs), float(ft), int(cl), str(f))
                             for r, c, fs, ft, cl, f in xs}
                      for rule, xs in streaks.items()}
        st.reckon_oldest()
        return comm, op, st


@dataclass(slots=True)
class NetFinding:
    """A slow-network group found in one evaluation, raised at the end of the call (never
    part of a snapshot: a call always ends with none left)."""

    comm: str
    op: str
    st: OpState
    group: list[int]
    loc: Localisation
    links: list[str]
    hosts: list[str]
    switch: SwitchSuspect | None
    evidence: dict[str, Any]
    ts: float


def join_incident(incidents: dict[str, list[str]], key: str, tid: str, s: Streak) -> bool:
    """Attach fired streak ``tid`` to incident ``key``; True if the incident is new."""
    s.fired = key
    ids = incidents.get(key)
    if ids is None:
        incidents[key] = [tid]
        return True
    if tid not in ids:
        ids.append(tid)
    return False


def leave_incident(incidents: dict[str, list[str]], tid: str, s: Streak) -> None:
    """Re-arm streak ``tid``: out of its incident, which closes with its last streak."""
    ids = incidents.get(s.fired)
    if ids is not None:
        if tid in ids:
            ids.remove(tid)
        if not ids:
            del incidents[s.fired]
    s.fired = ""


def merged_by_comm(found: list[NetFinding], locate: Callable[[str, list[int], int], Located]
                   ) -> list[list[NetFinding]]:
    """One call's link findings by communicator, in order. When several ops of one
    communicator were slow together and their ranks together name a ToR (``locate``: a
    switch where each op alone saw too few of its hosts), they become that switch's
    findings: the first carries the evidence of all of them."""
    by_comm: dict[str, list[NetFinding]] = {}
    for f in found:
        by_comm.setdefault(f.comm, []).append(f)
    out = []
    for comm, fs in by_comm.items():
        ops = sorted({f.op for f in fs})
        if len(ops) > 1:
            union = sorted({r for f in fs for r in f.group})
            loc, links, hosts, nics, switch = locate(comm, union, fs[0].st.size)
            if switch is not None:
                ev = fs[0].evidence | {
                    "actions": [["run_netdiag", switch.tor]], "localised": "switch",
                    "suspect_nics": nics, "degraded_ranks": union, "pairs": [], "ops": ops}
                fs = [replace(f, loc=loc, links=links, hosts=hosts, switch=switch, evidence=ev)
                      for f in fs]
        out.append(fs)
    return out
