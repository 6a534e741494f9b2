"""Pure multi-host analysis: pair plans, loss by size, link rates and localisation."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from producers.cbd import analysis as an
from producers.cbd.checks_multi import judge_mesh
from producers.cbd.collective import judge_ring
from producers.cbd.netprobe import sizes_for
from tests.unit.test_cbd_config_checks import batch, make_ctx

HOSTS4 = ["h1", "h2", "h3", "h4"]


@pytest.mark.parametrize("n", [2, 3, 4, 7, 32, 33, 100])
def test_pairs_probers_and_rounds(n: int) -> None:
    hosts = [f"h{i:03d}" for i in range(n)]
    pairs = an.probe_pairs(hosts, full_mesh_max=32)
    if n <= 32:
        assert len(pairs) == n * (n - 1) // 2
    else:
        per = {h: sum(h in p for p in pairs) for h in hosts}
        assert min(per.values()) >= 4
    probers = an.assign_probers(pairs)
    probed = sorted(an.pair(s, d) for s, ds in probers.items() for d in ds)
    assert probed == sorted(pairs)  # each pair probed exactly once
    for ps in (pairs, an.ring_pairs(hosts)):
        rounds = an.bandwidth_rounds(hosts, ps)
        assert sorted(p for r in rounds for p in r) == sorted(set(ps))
        for r in rounds:
            ends = [h for p in r for h in p]
            assert len(ends) == len(set(ends))  # a host meets one partner per round
        if ps is pairs and n <= 32:
            assert len(rounds) == (n - 1 if n % 2 == 0 else n)


@pytest.mark.parametrize("cells, expect", [
    ({"udp": {64: [20, 20], 512: [20, 20], 1500: [20, 20]}}, ("ok", [])),
    ({"udp": {64: [20, 20], 512: [20, 20], 1024: [20, 0], 1500: [20, 0]},
      "tcp": {64: [3, 3], 1024: [3, 0]}}, ("large_packet_loss", [1024, 1500])),
    ({"udp": {64: [20, 10], 1500: [20, 9]}}, ("loss", [64, 1500])),
    ({"udp": {64: [20, 19], 1500: [20, 19]}}, ("ok", [])),  # one lost probe is noise
])
def test_classify(cells: dict, expect: tuple) -> None:
    assert an.classify(cells, ratio=0.1, min_lost=2) == expect


@pytest.mark.parametrize("bad, expect", [
    ([], ([], [])),
    ([("h1", "h4"), ("h2", "h4"), ("h3", "h4")], (["h4"], [])),
    ([("h1", "h2")], (["h1", "h2"], [("h1", "h2")])),  # one bad pair: both ends (Alg. 1)
    ([("h1", "h2"), ("h3", "h4")], (["h1", "h2", "h3", "h4"], [("h1", "h2"), ("h3", "h4")])),
])
def test_localise(bad: list, expect: tuple) -> None:
    tested = [an.pair(a, b) for a, b in itertools.combinations(HOSTS4, 2)]
    assert an.localise(bad, tested) == expect


def test_localise_two_bad_hosts_in_a_big_batch() -> None:
    hosts = [f"h{i}" for i in range(10)]
    tested = [an.pair(a, b) for a, b in itertools.combinations(hosts, 2)]
    bad = [p for p in tested if "h3" in p or "h7" in p]
    assert an.localise(bad, tested) == (["h3", "h7"], [])


def test_rate_reference_survives_a_bad_host_and_an_outlier() -> None:
    rates = {(a, b): 3.0 for a, b in itertools.permutations(HOSTS4, 2)}
    rates.update({("h3", x): 0.01 for x in HOSTS4 if x != "h3"})
    rates.update({(x, "h3"): 0.05 for x in HOSTS4 if x != "h3"})
    rates[("h1", "h2")] = 40.0
    slow, floor = an.slow_links(rates, ratio=0.3)
    assert floor == pytest.approx(0.9)
    assert {an.pair(*k) for k in slow} == {("h1", "h3"), ("h2", "h3"), ("h3", "h4")}
    slow_b, floor_b = an.slow_links({k: 3.0 for k in rates}, 0.3, baseline=10.0,
                                    baseline_ratio=0.8)
    assert floor_b == 8.0 and len(slow_b) == len(rates)


@pytest.mark.parametrize("base, mtu, exact, expect", [
    ([64, 512, 1024, 4096], 1500, False, [64, 512, 1024, 1500]),
    ([64, 512, 1024, 4096], 9000, False, [64, 512, 1024, 4096, 9000]),
    ([64], 1500, True, [64]),
    ([64, 2000], None, True, [64]),
])
def test_sizes_for(base: list, mtu: int | None, exact: bool, expect: list) -> None:
    assert sizes_for(base, mtu, exact) == expect


def _cells(dst: str, lossy: bool) -> list[dict]:
    out = []
    for size in (64, 512, 1024, 1500):
        lost = lossy and size >= 1024
        out.append({"dst": dst, "proto": "udp", "size": size, "sent": 20,
                    "recv": 0 if lost else 20})
        out.append({"dst": dst, "proto": "tcp", "size": size, "sent": 3, "recv": 0 if lost else 3})
    return out


def test_judge_mesh_localises_large_packet_loss() -> None:
    ctx = make_ctx(batch())
    pairs = an.probe_pairs(HOSTS4)
    loss = [{"src": s, "cells": [c for d in ds for c in _cells(d, "h4" in (s, d))]}
            for s, ds in an.assign_probers(pairs).items()]
    res = judge_mesh("probe_mesh", loss, [], pairs, ctx)
    assert [h for h, r in res.items() if r.status == "fail"] == ["h4"]
    assert "large-packet loss on 3/3 link(s): packets >= 1024 B" in res["h4"].reason
    link = res["h4"].evidence["links"]["h1/eth0<->h4/eth0"]
    assert link["class"] == "large_packet_loss" and link["loss"]["udp"]["64"] == 0.0
    assert link["loss"]["udp"]["1500"] == 1.0


def test_judge_ring_localises_a_slow_egress() -> None:
    ctx = make_ctx(batch())
    n = 4

    def rate(src: int, dst: int) -> float:
        return 0.02 if src == 2 else 2.0

    outputs: dict[str, dict[str, Any]] = {h: {"rank": r, "links": [{"src": s, "dst": r, "gbps": rate(s, r)}
                                        for s in ((r - 1) % n, (r + 1) % n)],
                   "allreduce": {"busbw_gbps": 0.1, "algbw_gbps": 0.07, "correct": True}}
               for r, h in enumerate(HOSTS4)}
    res = judge_ring("collective", outputs, HOSTS4, ctx, "test")
    assert [h for h, r in res.items() if r.status == "fail"] == ["h3"]
    assert res["h1"].evidence["driver"] == "socket-ring"
    outputs["h2"]["allreduce"] = {"error": "reduce-scatter step 1 waiting for rank 0: timed out"}
    for o in outputs.values():
        for lk in o["links"]:
            lk["gbps"] = 2.0
    res = judge_ring("collective", outputs, HOSTS4, ctx, "test")
    assert all(r.status == "fail" and "all-reduce failed" in r.reason for r in res.values())
