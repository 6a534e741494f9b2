"""Agents mode over an in-memory bus: request and result formats, the agent's
``run_cbd_request``, and the coordinator's verdict."""

from __future__ import annotations

import json
import threading
import time

import pytest

from producers.cbd import agents
from producers.cbd import analysis as an
from producers.cbd.config import CbdConfig
from producers.cbd.targets import HostSpec
from tests.unit.test_cbd_config_checks import make_facts

LOCAL_CHECKS = ["nccl_env", "routes", "nvml_health", "row_remap", "recent_xids"]


def request(hosts: int = 2, only: list[str] | None = None, **cfg: object) -> agents.CbdRequest:
    specs = [HostSpec(f"h{i}", "local", addr="127.0.0.1", port=40000 + 2 * i)
             for i in range(1, hosts + 1)]
    return agents.make_request("pod-3", "light", specs, CbdConfig(**cfg),  # type: ignore[arg-type]
                               now=1000.0, only=only or [])


def test_request_and_result_round_trip() -> None:
    req = request(only=["routes"])
    wire = json.loads(json.dumps(req.to_wire()))
    assert wire["type"] == "cbd_request" and wire["v"] == 1
    assert agents.CbdRequest.from_wire(wire) == req
    res = agents.CbdHostResult(req.id, "pod-3", "h1", {"net": []}, [{"check": "routes"}])
    back = agents.CbdHostResult.from_wire(json.loads(json.dumps(res.to_wire())))
    assert back == res
    with pytest.raises(ValueError):
        agents.CbdRequest.from_wire({**wire, "v": 2})
    with pytest.raises(ValueError):
        agents.CbdRequest.from_wire({**wire, "hosts": [{"name": "h1"}]})
    with pytest.raises(ValueError, match="addr"):
        agents.make_request("b", "light", [HostSpec("h1", "local")], CbdConfig(), 0.0)


def test_in_memory_bus_groups_read_independently() -> None:
    bus = agents.InMemoryBus()
    bus.publish("t", "k1", b"a")
    bus.publish("t", "k2", b"b")
    assert bus.poll("t", "g1", 0) == [("k1", b"a"), ("k2", b"b")]
    assert bus.poll("t", "g1", 0) == []
    assert bus.poll("t", "g2", 0) == [("k1", b"a"), ("k2", b"b")]


def test_agents_answer_over_the_bus_and_coordinator_delivers() -> None:
    bus = agents.InMemoryBus()
    stop = threading.Event()
    served: dict[str, int] = {}

    def agent(host: str) -> None:
        served[host] = agents.serve_requests(bus, host, stop, poll_s=0.1)

    threads = [threading.Thread(target=agent, args=(h,)) for h in ("h1", "h2", "h9")]
    for t in threads:
        t.start()
    try:
        req = request(only=LOCAL_CHECKS)
        agents.publish_request(bus, req)
        got = agents.gather_results(bus, req, timeout_s=60)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert sorted(got) == ["h1", "h2"] and served == {"h1": 1, "h2": 1, "h9": 0}
    assert got["h1"].facts is not None and got["h1"].error == ""
    assert {r["check"] for r in got["h1"].results} == {"nvml_health", "row_remap", "recent_xids"}
    report = agents.judge_request(req, got)
    assert report.mode == "agents" and report.verdict == "deliver", report.to_wire()
    assert set(report.hosts["h2"].results) == set(LOCAL_CHECKS)


def test_coordinator_holds_silent_agents_and_judges_network_results() -> None:
    req = request(hosts=4, only=["nccl_env", "probe_mesh"], require_default_route=False)
    names = req.names
    pairs = an.probe_pairs(names)
    got = {}
    for i, h in enumerate(names[:3], start=1):
        facts = make_facts(i)
        facts["addrs"] = {"lo": ["127.0.0.1/8"]}
        cells = [{"dst": d, "proto": "udp", "size": s, "sent": 20,
                  "recv": 0 if ("h3" in (h, d) and s > 512) else 20}
                 for d in an.assign_probers(pairs).get(h, []) for s in (64, 512, 1500)]
        got[h] = agents.CbdHostResult(req.id, req.batch, h, facts, [],
                                      loss={"src": h, "cells": cells},
                                      finished_ts=req.issued_ts + 20)
    report = agents.judge_request(req, got)
    assert report.hosts["h4"].verdict == "hold"
    assert "no result from the host's agent" in report.hosts["h4"].reasons[0]
    assert report.hosts["h3"].results["probe_mesh"].status == "fail"
    assert [c.target for c in report.commands] == ["h3"]  # h4 errored: held, not isolated
    assert report.wall_s == pytest.approx(20.0)


def test_schedule_is_shared_and_ordered() -> None:
    req = request(hosts=4)
    s = agents.schedule(req, req.suite())
    assert req.start_at == s.loss_at < s.bandwidth_at < s.ring_at < s.end_at
    assert s.end_at - req.issued_ts < 60  # light profile budget


def test_run_cbd_request_ignores_other_hosts() -> None:
    assert agents.run_cbd_request(request(), "h7", clock=time.time) is None
