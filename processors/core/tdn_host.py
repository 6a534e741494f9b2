"""Who is short where, for the TD/N rule (Aegis §5.2): victims, hosts, populations.

A GPU short in one communicator (it arrives last) but not short where one of its peers is
is a *victim*: it waits on that peer elsewhere (a slow GPU holds up its tensor-parallel
group, which then arrives late in its data-parallel rings). A host whose GPUs are short
together, none of them a victim (a power cap, cooling, its CPU or data loader), is the
culprit rather than any one GPU: see TDNConfig.host_rollup_share.
"""

from __future__ import annotations

from collections.abc import Mapping

from processors.core.base import beyond_few
from processors.core.ccl_state import CommRoster
from processors.core.tdn_state import OpState


def is_victim(roster: CommRoster, ops: Mapping[str, Mapping[str, OpState]], comm: str,
              host: str, gpu: int) -> bool:
    """The GPU waits, unflagged, on a flagged slow rank in another communicator."""
    for c, r in roster.comms_of(host, gpu).items():
        if c == comm:
            continue
        for st in ops.get(c, {}).values():
            streaks = st.streaks["td_short"]
            mine = streaks.get(r)
            if mine is not None and mine.count == 0 and any(
                    x.count >= 1 for rr, x in streaks.items() if rr != r):
                return True
    return False


def short_gpus(roster: CommRoster, ops: Mapping[str, Mapping[str, OpState]],
               host: str) -> tuple[list[int], list[int]]:
    """(the host's GPUs the roster knows, those short now in some communicator and a victim
    in none)."""
    gpus = sorted(g for h, g in roster.by_gpu if h == host)
    short = []
    for g in gpus:
        here = roster.comms_of(host, g)
        if any((s := st.streaks["td_short"].get(r)) is not None and s.count >= 1
               for c, r in here.items() for st in ops.get(c, {}).values()) \
                and not any(is_victim(roster, ops, c, host, g) for c in here):
            short.append(g)
    return gpus, short


def spans_hosts(roster: CommRoster, comm: str, ranks: list[int], max_hosts: int,
                max_share: float) -> bool:
    """The ranks run on more than ``max(max_hosts, max_share x the communicator's hosts)``
    hosts: a pipeline stage or a rack arriving last together, not a few stragglers."""
    members = roster.members.get(comm, {})
    hosts = {m.host for r in ranks if (m := members.get(r)) is not None}
    return beyond_few(len(hosts), len({m.host for m in members.values()}), max_hosts, max_share)
