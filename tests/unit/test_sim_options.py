"""Agent heartbeats on the logs topic, and the name prefix that keeps simulations apart."""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any

import msgpack
import pytest

from producers.sim.simulation import SimConfig, Simulation
from schemas.errors import ConfigError

START = 1_767_225_600.0
HB = "aegis-agent heartbeat seq="


@functools.cache
def records(**kw: Any) -> tuple[Simulation, tuple[tuple[str, str, float, dict[str, Any]], ...]]:
    sim = Simulation(SimConfig(**kw))
    return sim, tuple((topic, key, ts, msgpack.unpackb(v)) for topic, key, ts, v in
                      sim.iter_encoded())


def heartbeats(out: tuple[tuple[str, str, float, dict[str, Any]], ...]
               ) -> dict[str, list[tuple[float, int, str | None]]]:
    by_host: dict[str, list[tuple[float, int, str | None]]] = defaultdict(list)
    for topic, _, _, d in out:
        if topic == "aegis.logs" and d["source"] == "agent":
            assert d["line"].startswith(HB)
            by_host[d["host"]].append((d["ts"], int(d["line"][len(HB):]), d.get("job")))
    return by_host


# --- heartbeats -----------------------------------------------------------------------------


@pytest.mark.parametrize("period", [5.0, 2.5, 0.4])
def test_every_host_heartbeats_for_the_whole_run(period: float) -> None:
    # 9 hosts, jobs of 4: one idle host; xid79 kills its job, the agents live on
    sim, out = records(hosts=9, hosts_per_job=4, scenario="xid79", seed=3, duration_s=90,
                       fault_at_s=20, init_s=3, watchdog_s=30, heartbeat_s=period)
    by_host = heartbeats(out)
    assert set(by_host) == set(sim.inventory.hosts)
    n = int(90 / period)
    for beats in by_host.values():
        ts = [b[0] for b in beats]
        assert START <= ts[0] < START + period
        assert [b[1] for b in beats] == list(range(1, len(beats) + 1))
        assert all(abs(b - a - period) < 1e-6 for a, b in zip(ts, ts[1:], strict=False))
        assert n - 1 <= len(beats) <= n + 1 and ts[-1] < sim.end_ts
    culprit = sim.truth[0]["culprit"]["hosts"][0]
    assert by_host[culprit][-1][0] > sim.truth[0]["end_ts"]  # heartbeats after the job died
    firsts = sorted(beats[0][0] for beats in by_host.values())
    assert len(set(firsts)) == len(firsts)  # phases staggered
    idle = [h for h in sim.inventory.hosts if not any(h in hs for hs in sim.inventory.jobs.values())]
    assert idle and all(b[2] is None for b in by_host[idle[0]])
    assert all(b[2] == "job-000" for b in by_host["h0000"])
    stamps = [rec[2] for rec in out]
    assert stamps == sorted(stamps)  # the stream stays in event-time order


def test_heartbeats_deterministic_and_can_be_disabled() -> None:
    kw = dict(hosts=4, hosts_per_job=4, duration_s=30, init_s=2, seed=1)
    _, a = records(**kw)
    _, b = records(**kw, noise_logs=False)
    assert heartbeats(a) == heartbeats(b)  # independent of the log noise
    _, off = records(**kw, heartbeat_s=0.0)
    assert heartbeats(off) == {}


# --- name prefix ----------------------------------------------------------------------------

PFX = dict(hosts=9, hosts_per_job=4, scenario="mixed", seed=4, duration_s=220, fault_at_s=20,
           init_s=3, watchdog_s=30, mixed_spacing_s=5)


def names_in(out: tuple[tuple[str, str, float, dict[str, Any]], ...]) -> set[str]:
    found: set[str] = set()
    for _, key, _, d in out:
        found.update({key, d["host"]} | ({d["job"]} if d.get("job") else set()))
    return found


def test_prefix_on_every_name_and_derived_id() -> None:
    sim, out = records(**PFX, name_prefix="xid79-")
    inv = sim.inventory
    assert sorted(inv.hosts)[:2] == ["xid79-h0000", "xid79-h0001"]
    assert sorted(inv.jobs) == ["xid79-job-000", "xid79-job-001"]
    assert all(n.startswith("xid79-") for n in names_in(out))
    for job, ranks in inv.ranks.items():
        assert job.startswith("xid79-") and all(h.startswith("xid79-") for h, _ in ranks.values())
    assert all(t.startswith("xid79-tor-") for h in inv.hosts.values() for t in h.tor)
    assert sim.truth
    for f in sim.truth:
        assert f["job"].startswith("xid79-") and "xid79-job-" in f["fault_id"]
        c = f["culprit"]
        ids = c["hosts"] + c["gpus"] + c["nics"] + [e for lk in c["links"] for e in lk.split("<->")]
        assert ids and all(i.startswith("xid79-") for i in ids)
        assert all(a[1].startswith("xid79-") for a in f["expected_actions"])
    nccl = [d["line"] for topic, _, _, d in out if topic == "aegis.logs" and d["source"] == "nccl"]
    assert nccl and all(line.startswith(("xid79-h0", "NCCL version")) for line in nccl)


def test_prefixed_runs_do_not_collide() -> None:
    runs = {p: records(**PFX, name_prefix=p) for p in ("", "a-", "b-")}
    comms: dict[str, set[str]] = {}
    ips: dict[str, set[str]] = {}
    for p, (sim, out) in runs.items():
        comms[p] = {r["comm"] for topic, _, _, d in out if topic == "aegis.ccl" for r in d["ranks"]}
        ips[p] = {ip for h in sim.inventory.hosts.values() for ip in h.ips}
        assert comms[p] and len(ips[p]) == 9 * 9
    for p, q in (("", "a-"), ("", "b-"), ("a-", "b-")):
        assert not comms[p] & comms[q] and not ips[p] & ips[q]
        assert not names_in(runs[p][1]) & names_in(runs[q][1])
    # the same seed draws the same faults; only the names differ
    plain = [(f["scenario"], f["start_ts"]) for f in runs[""][0].truth]
    assert plain == [(f["scenario"], f["start_ts"]) for f in runs["a-"][0].truth]


def test_no_prefix_keeps_the_documented_names() -> None:
    sim, _ = records(**PFX)
    h = sim.inventory.hosts["h0000"]
    assert h.ips[0] == "10.1.0.10" and h.ips[1] == "10.16.0.10" and h.tor[3] == "tor-p0-r3"
    assert "job-000" in sim.inventory.jobs


def test_explicit_ip_site_and_bad_values() -> None:
    sim = Simulation(SimConfig(hosts=2, hosts_per_job=2, duration_s=10, name_prefix="x-",
                               ip_site=256 + 7))
    assert sim.inventory.hosts["x-h0001"].ips[:2] == ("10.33.7.11", "10.48.7.11")
    for bad in (dict(name_prefix="a/b"), dict(name_prefix="-a"), dict(ip_site=5000),
                dict(heartbeat_s=-1.0)):
        with pytest.raises(ConfigError):
            Simulation(SimConfig(hosts=2, hosts_per_job=2, duration_s=10, **bad))
