"""Aegis §3 RootDiag over failed connections, split from :mod:`processors.core.decision_tree`.

The tree resolves each distributed symptom to an *edge* ``(ts, (host, gpu), (peer, gpu))``;
this module names the endpoint at their centre. Pure functions over edges and host sets.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence

Endpoint = tuple[str, int | None]
Edge = tuple[float, Endpoint, Endpoint]


def root_of(edges: Sequence[Edge], host_suspects: Sequence[str], pool: Collection[str],
            reporters: Collection[str], min_share: float) -> tuple[str, int | None, str] | None:
    """``(host, gpu or None, why)`` at the centre of the failed connections, or None.

    In order: the one host with host-side evidence (``host_evidence``); the endpoint in most
    edges, with at least ``min_share`` of them and strictly more than any other (``hit``);
    the one endpoint common to the first (up to 3) edges (``first_fail``); the one host of
    the job that reported nothing (``silent_host``).
    """
    if len(host_suspects) == 1:
        return host_suspects[0], centre_gpu(host_suspects[0], edges), "host_evidence"
    if edges:
        ranked = Counter(h for _, a, b in edges for h in {a[0], b[0]}).most_common()
        top, n = ranked[0]
        second = ranked[1][1] if len(ranked) > 1 else 0
        if n >= 2 and n > second and n >= min_share * len(edges):
            return top, centre_gpu(top, edges), "hit"
        first = edges[: min(3, len(edges))]
        common = set.intersection(*({a[0], b[0]} for _, a, b in first))
        if len(first) >= 2 and len(common) == 1:
            host = common.pop()
            return host, centre_gpu(host, edges), "first_fail"
    silent = sorted(set(pool) - set(reporters))
    if len(pool) >= 3 and len(silent) == 1:
        return silent[0], None, "silent_host"
    return None


def centre_gpu(host: str, edges: Sequence[Edge]) -> int | None:
    """The GPU of ``host`` in more than half of its resolved edge endpoints, else None."""
    gpus = Counter(ep[1] for _, a, b in edges for ep in (a, b) if ep[0] == host and ep[1] is not None)
    if not gpus:
        return None
    g, n = gpus.most_common(1)[0]
    return g if n * 2 > sum(gpus.values()) else None
