"""The guard's input: a diagnosis' recommended actions, checked (sinks/guard.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from schemas.records import ACTIONS, Diagnosis

ISOLATING_ACTIONS = ("isolate_host", "isolate_gpu")


def parse_actions(d: Diagnosis, refuse: Callable[..., None]
                  ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """A diagnosis' recommended ``evidence.actions`` as (isolations, other actions), each
    ``(action, target)`` once; malformed or unknown entries go to ``refuse``."""
    raw = d.evidence.get("actions", []) if isinstance(d.evidence, Mapping) else []
    if not isinstance(raw, list | tuple):
        refuse(str(raw)[:64], "", "malformed_action", "evidence.actions is not a list")
        return [], []
    isolations: list[tuple[str, str]] = []
    others: list[tuple[str, str]] = []
    for entry in raw:
        if (not isinstance(entry, list | tuple) or len(entry) != 2
                or not all(isinstance(x, str) and x for x in entry)):
            refuse(str(entry)[:64], "", "malformed_action",
                   f"diagnosis {d.id}: action {entry!r} is not [action, target]")
            continue
        a, tgt = str(entry[0]), str(entry[1])
        if a not in ACTIONS:
            refuse(a, tgt, "unknown_action", f"{a!r} is not one of {list(ACTIONS)}")
            continue
        bucket = isolations if a in ISOLATING_ACTIONS else others
        if (a, tgt) not in bucket:
            bucket.append((a, tgt))
    return isolations, others


def peers_down(d: Diagnosis, down: set[str]) -> list[str]:
    """The failed connections' other ends (RootDiag's ``evidence.peer_hosts``) when every one
    of them is a host shown down and none of the diagnosis' own hosts is: the named host is
    the survivor that reported them (hosts that died together, a rack's power, are named by
    their live neighbours only), not their root. Else []."""
    v = d.evidence.get("peer_hosts") if isinstance(d.evidence, Mapping) else None
    peers = sorted({h for h in v if isinstance(h, str)}) if isinstance(v, list | tuple) else []
    mine = {*d.culprits.hosts, *(g.rpartition("/")[0] for g in d.culprits.gpus)}
    if not peers or not set(peers) <= down or mine & down:
        return []
    return peers
