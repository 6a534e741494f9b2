"""Pure analysis of multi-host tests: which pairs to probe, loss by packet size, link rates,
and localisation of the bad link or host (Aegis Alg. 1 RootDiag idea: the culprit is the
endpoint common to the failures).

Loss math (per pair, protocol and size): ``loss = 1 - recv / sent`` of echoed probes; a cell
is bad when at least ``loss_min_lost`` probes were lost AND ``loss >= loss_ratio``. With N
probes and none lost, the true loss rate is below ~3/N at 95% confidence (rule of three),
so N bounds the smallest loss a run can see: 20 UDP probes per size (light) catch >= 15%,
200 (full) catch >= 1.5%. A pair is ``large_packet_loss`` when its smallest size is clean
and a larger size is bad (the Aegis >1 KB case), ``loss`` when the smallest size is bad too.

Rates: one number per directed link. The reference is the median over hosts of each host's
median link, so neither one bad host (which spoils half the pairs of a 4-host batch) nor one
inflated sample moves it much; a link is slow below ``link_ratio`` x reference, or below
``baseline_ratio`` x the baseline.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Pair = tuple[str, str]  # sorted


def pair(a: str, b: str) -> Pair:
    x, y = sorted((a, b))
    return (x, y)


def probe_pairs(hosts: Sequence[str], full_mesh_max: int = 32) -> list[Pair]:
    """Every pair up to ``full_mesh_max`` hosts; beyond, ring offsets 1, 2 and n/2 (each
    host in 4-6 pairs, enough to find the host common to its bad pairs)."""
    hs = sorted(hosts)
    n = len(hs)
    if n <= full_mesh_max:
        return [pair(a, b) for a, b in itertools.combinations(hs, 2)]
    return ring_pairs(hs, (1, 2, n // 2))


def ring_pairs(hosts: Sequence[str], offsets: Iterable[int] = (1, 2)) -> list[Pair]:
    """Pairs of hosts ``k`` apart on the sorted ring, for each k in ``offsets`` (every host
    meets 2·len(offsets) partners; a bad host is then the common end of that many pairs)."""
    hs = sorted(hosts)
    n = len(hs)
    out = {pair(hs[i], hs[(i + k) % n]) for i in range(n) for k in offsets if k % n}
    return sorted(out)


def assign_probers(pairs: Iterable[Pair]) -> dict[str, list[str]]:
    """Echo probes measure both directions, so each pair is probed from one end: the end
    with fewer pairs so far (deterministic)."""
    load: dict[str, list[str]] = defaultdict(list)
    for a, b in sorted(pairs):
        src, dst = (a, b) if len(load[a]) <= len(load[b]) else (b, a)
        load[src].append(dst)
    return dict(load)


def bandwidth_rounds(hosts: Sequence[str], pairs: Iterable[Pair]) -> list[list[Pair]]:
    """Rounds in which every host is in at most one pair (so no host link carries two
    tests). A full mesh uses the circle method (n-1 rounds); other pair sets are coloured
    greedily."""
    hs = sorted(hosts)
    ps = sorted(set(pairs))
    if len(ps) == len(hs) * (len(hs) - 1) // 2 and len(hs) > 1:
        arr: list[str | None] = list(hs) + ([None] if len(hs) % 2 else [])
        rounds = []
        for _ in range(len(arr) - 1):
            m = len(arr)
            rounds.append([pair(x, y) for i in range(m // 2)
                           if (x := arr[i]) is not None and (y := arr[m - 1 - i]) is not None])
            arr = [arr[0], arr[-1], *arr[1:-1]]
        return rounds
    out: list[list[Pair]] = []
    busy: list[set[str]] = []
    for p in ps:
        for i, b in enumerate(busy):
            if p[0] not in b and p[1] not in b:
                out[i].append(p)
                b.update(p)
                break
        else:
            out.append([p])
            busy.append(set(p))
    return out


def loss_cells(outputs: Iterable[Mapping[str, Any]]) -> dict[Pair, dict[str, dict[int, list[int]]]]:
    """Loss outputs of every prober -> pair -> proto -> size -> [sent, recv]."""
    out: dict[Pair, dict[str, dict[int, list[int]]]] = defaultdict(lambda: defaultdict(dict))
    for o in outputs:
        for c in o.get("cells", ()):
            cell = out[pair(o["src"], c["dst"])][c["proto"]].setdefault(int(c["size"]), [0, 0])
            cell[0] += int(c["sent"])
            cell[1] += int(c["recv"])
    return {p: dict(v) for p, v in out.items()}


def cell_bad(sent: int, recv: int, ratio: float, min_lost: int) -> bool:
    lost = sent - recv
    return sent > 0 and lost >= min(min_lost, sent) and lost / sent >= ratio


def classify(protos: Mapping[str, Mapping[int, Sequence[int]]], ratio: float, min_lost: int
             ) -> tuple[str, list[int]]:
    """("ok" | "large_packet_loss" | "loss", sizes with bad cells in any protocol)."""
    bad: set[int] = set()
    smallest: set[int] = set()
    for cells in protos.values():
        if not cells:
            continue
        smallest.add(min(cells))
        bad |= {s for s, (sent, recv) in cells.items() if cell_bad(sent, recv, ratio, min_lost)}
    if not bad:
        return "ok", []
    return ("loss" if bad & smallest else "large_packet_loss"), sorted(bad)


def link_rates(records: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], float]:
    """[{src, dst, gbps}] -> (src, dst) -> Gbit/s (the lowest when measured twice)."""
    out: dict[tuple[str, str], float] = {}
    for r in records:
        k = (str(r["src"]), str(r["dst"]))
        v = float(r.get("gbps") or 0.0)
        out[k] = min(out.get(k, v), v)
    return out


def rate_reference(rates: Mapping[tuple[str, str], float]) -> float:
    """Median over hosts of each host's median link rate: robust both to one bad host
    (which spoils half the pairs of a 4-host batch) and to one inflated measurement."""
    per: dict[str, list[float]] = defaultdict(list)
    for (a, b), v in rates.items():
        per[a].append(v)
        per[b].append(v)
    return statistics.median(statistics.median(v) for v in per.values()) if per else 0.0


def slow_links(rates: Mapping[tuple[str, str], float], ratio: float,
               baseline: float | None = None, baseline_ratio: float = 0.8
               ) -> tuple[set[tuple[str, str]], float]:
    ref = rate_reference(rates)
    floor = ratio * ref
    if baseline:
        floor = max(floor, baseline_ratio * baseline)
    return {k for k, v in rates.items() if v < floor}, floor


def localise(bad: Iterable[Pair], tested: Iterable[Pair]) -> tuple[list[str], list[Pair]]:
    """Suspect hosts and the bad pairs no single host explains.

    - one host in every bad pair (and >= 2 bad pairs): that host;
    - otherwise, greedily, hosts with >= 2 bad pairs that are at least half of the pairs
      they were tested in;
    - a bad pair left over names both its ends as suspects (Aegis Alg. 1 DistError: with
      two hosts involved, both go; wrongly holding one healthy host costs less than a slow
      diagnosis).
    """
    bad_set = set(bad)
    if not bad_set:
        return [], []
    tested_n: dict[str, int] = defaultdict(int)
    for a, b in set(tested) | bad_set:
        tested_n[a] += 1
        tested_n[b] += 1
    common = set.intersection(*(set(p) for p in bad_set))
    if len(bad_set) >= 2 and common:
        return sorted(common), []
    suspects: list[str] = []
    left = set(bad_set)
    while left:
        count: dict[str, int] = defaultdict(int)
        for a, b in left:
            count[a] += 1
            count[b] += 1
        h, c = max(sorted(count.items()), key=lambda kv: kv[1])
        if c < 2 or c / tested_n[h] < 0.5:
            break
        suspects.append(h)
        left = {p for p in left if h not in p}
    unresolved = sorted(left)
    return sorted(set(suspects) | {h for p in unresolved for h in p}), unresolved
