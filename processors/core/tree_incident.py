"""What belongs to an incident the Phase 1 decision tree already found, split from
:mod:`processors.core.decision_tree`: symptoms that touch its culprits (Aegis §3: a CCL
timeout is a symptom of the found fault), and the job's teardown once its watchdogs fire.

A hung job's watchdogs fire (PyTorch's default is 10 minutes) and each rank that times out
takes its process down; its peers' connections to it (and to the c10d store, when it is rank
0's host) fail. Those errors name an aborting rank, not the culprit, so they are not edges
for RootDiag. Pure functions over :class:`~processors.core.tree_events.TreeEvent`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from processors.core.tree_events import DecisionTreeConfig, TreeEvent, names_peer, via_store
from schemas.records import Diagnosis

# host -> the whole seconds of its recent watchdog timeout lines, ascending
Watchdogs = dict[str, list[float]]
MAX_PER_HOST = 16
TEARDOWN_AFTER_S = 1.0  # the abort follows the timeout; a second covers two hosts' clocks


def note_watchdog(watchdogs: Watchdogs, ev: TreeEvent, keep_s: float) -> None:
    """Add ``ev``'s time to its host's if it is a timeout (it says how long it waited),
    dropping that host's times more than ``keep_s`` older than it."""
    if ev.waited is None or ev.cat != "distributed_symptom":
        return
    second = float(math.floor(ev.ts))
    mine = watchdogs.setdefault(ev.host, [])
    if second not in mine:
        horizon = ev.ts - keep_s
        mine[:] = sorted([w for w in mine if w >= horizon] + [second])[-MAX_PER_HOST:]


def torn_down(e: TreeEvent, watchdogs: Watchdogs, teardown_s: float,
              host_of: Callable[[TreeEvent], Any]) -> bool:
    """A connection failure of the job's teardown: the host it names timed out itself (a
    watchdog line) from ``teardown_s`` before it to a second after it, so that host's ranks
    were aborting. The first rank to time out is one that entered the collective, i.e. a
    rank waiting on the culprit, not the culprit."""
    if teardown_s <= 0 or e.cat != "distributed_symptom" or e.waited is not None or not names_peer(e):
        return False
    peer = host_of(e)[0]
    if peer is None or peer == e.host:
        return False
    # whole seconds are kept: the window is a second wider on the early side
    return any(e.ts - teardown_s - 1.0 <= w <= e.ts + TEARDOWN_AFTER_S
               for w in watchdogs.get(peer, ()))


def touches(ev: TreeEvent, inc: dict[str, Any], host_of: Callable[[TreeEvent], Any]) -> bool:
    """A symptom that names no peer (a timeout), or whose reporter or peer is one of the
    incident's culprit hosts, belongs to that incident."""
    culprits = set(inc.get("culprits", inc["hosts"]))
    if ev.host in culprits:
        return True
    if ev.peer is None and ev.peer_rank is None:
        return True
    return host_of(ev)[0] in culprits


def absorbed(ev: TreeEvent, inc: dict[str, Any] | None, watchdogs: Watchdogs,
             teardown_s: float, host_of: Callable[[TreeEvent], Any]) -> bool:
    """A distributed symptom within a host-side incident's absorb window that touches it or
    is the job's teardown."""
    return (inc is not None and ev.cat == "distributed_symptom" and not ev.host_fatal
            and ev.ts <= inc.get("absorb_until", 0.0)
            and (touches(ev, inc, host_of) or torn_down(ev, watchdogs, teardown_s, host_of)))


def last_joined(events: Sequence[TreeEvent]) -> float | None:
    """The newest of the reporters' first distributed symptoms (store and rendezvous lines
    aside, as RootDiag counts reporters): when the burst's last reporter joined it."""
    first: dict[str, float] = {}
    for e in events:
        if e.cat == "distributed_symptom" and not via_store(e):
            first[e.host] = min(first.get(e.host, e.ts), e.ts)
    return max(first.values()) if first else None


def hold_until(d: Diagnosis, start: float, cfg: DecisionTreeConfig, members: int,
               dark_due: float | None, events: Sequence[TreeEvent] = ()) -> float | None:
    """When a verdict waits for more evidence: OfflineDiag, the last resort, until Phase 2
    had ``offline_wait_s`` to name a culprit; in a job of more than 2 hosts, any verdict
    on errors between 2 hosts (isolate both, or the end with a fault of its own) until
    ``pair_settle_s``, and the silent-host verdict until ``pair_settle_s`` after the last
    reporter of ``events`` joined (:func:`last_joined`): a peer that has not reported *yet*
    is not silent, also when one reporter's lines came early (a clock stepped back, a
    shorter timeout); any verdict on failed connections to a host whose agent missed its
    beat until that host is dark or beats again (``dark_due``, :mod:`tree_liveness`)."""
    holds = [] if dark_due is None else [dark_due]
    path = [str(p) for p in d.evidence.get("path", ())]
    if d.evidence.get("rule") == "offline_diag":
        holds.append(start + cfg.settle_s + cfg.offline_wait_s)
    elif members > 2 and any(p.startswith(("DistError:2hosts", "RootDiag:silent_host")) for p in path):
        holds.append(start + max(cfg.settle_s, cfg.pair_settle_s))
        joined = last_joined(events) if "RootDiag:silent_host" in path else None
        if joined is not None:
            holds.append(joined + cfg.pair_settle_s)
    return max(holds) if holds else None
