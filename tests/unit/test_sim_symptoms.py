"""Each scenario shows its symptoms on the culprit and its peers; the healthy run shows none."""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from typing import Any

import msgpack
import numpy as np
import pytest

from producers.sim.simulation import SimConfig, Simulation
from schemas.metrics import BY_NAME

START = 1_767_225_600.0
FAULT_AT = 40.0
WATCHDOG = 60.0


@functools.cache
def run(scenario: str, seed: int = 7) -> tuple[Simulation, tuple[tuple[str, float, Any], ...]]:
    cfg = SimConfig(hosts=8, hosts_per_job=4, scenario=scenario, seed=seed, duration_s=130,
                    fault_at_s=FAULT_AT, init_s=5, watchdog_s=WATCHDOG)
    sim = Simulation(cfg)
    out = tuple((topic, ts, msgpack.unpackb(value)) for topic, _, ts, value in sim.iter_encoded())
    return sim, out


def truth(scenario: str) -> dict[str, Any]:
    sim, _ = run(scenario)
    assert len(sim.truth) == 1
    return sim.truth[0]


def logs(scenario: str) -> list[dict[str, Any]]:
    return [d for topic, _, d in run(scenario)[1] if topic == "aegis.logs"]


def telemetry(scenario: str, host: str, after: float = -1.0) -> list[dict[str, Any]]:
    return [d for topic, ts, d in run(scenario)[1]
            if topic == "aegis.telemetry" and d["host"] == host and ts >= START + after]


def ccl_at(scenario: str, t: float, job: str | None = None) -> dict[str, dict[str, Any]]:
    """host -> CCL record at event time START + t (of the fault's job unless ``job``)."""
    job = job or (truth(scenario)["job"] if scenario != "healthy" else None)
    return {d["host"]: d for topic, ts, d in run(scenario)[1]
            if topic == "aegis.ccl" and ts == START + t and (job is None or d["job"] == job)}


def comm_table(recs: dict[str, dict[str, Any]]) -> dict[tuple[str, str], list[tuple]]:
    """(comm, op) -> [(host, gpu, rank, cl, wr, wc, seq, td, n, pending)]."""
    out: dict[tuple[str, str], list[tuple]] = defaultdict(list)
    for host, d in recs.items():
        for r in d["ranks"]:
            for op, cl, wr, wc, seq, td, n in r["ops"]:
                out[(r["comm"], op)].append((host, r["gpu"], r["rank"], cl, wr, wc, seq, td, n,
                                             tuple(r["pending"])))
    return out


def gpu_metric(d: dict[str, Any], name: str, idx: int) -> float:
    return d["devices"]["gpu"]["values"][name][idx]


def nic_metric(d: dict[str, Any], name: str, idx: int) -> float:
    return d["devices"]["nic"]["values"][name][idx]


def culprit_host_gpu(scenario: str) -> tuple[str, int]:
    t = truth(scenario)
    if t["culprit"]["gpus"]:
        host, gpu = t["culprit"]["gpus"][0].split("/gpu")
        return host, int(gpu)
    host, nic = t["culprit"]["nics"][0].split("/nic")
    return host, int(nic)


def lines_with(scenario: str, text: str) -> list[dict[str, Any]]:
    return [d for d in logs(scenario) if text in d["line"]]


# --- the healthy run --------------------------------------------------------------------


BAD_TEXT = ("Xid", "WARN", "Watchdog", "AER", "Link down", "Link DOWN", "reset by peer",
            "Error", "error", "limited by", "Link ACTIVE", "completion from peer")


def test_healthy_has_no_fault_lines() -> None:
    assert not run("healthy")[0].truth
    bad = [d["line"] for d in logs("healthy") if any(t in d["line"] for t in BAD_TEXT)]
    assert bad == []
    assert lines_with("healthy", "Init COMPLETE") and lines_with("healthy", " iteration ")


def test_healthy_gpus_neither_hot_nor_throttled() -> None:
    """thermal_throttle's signs (> 85 C, SM clock < 1500 MHz) never occur in a healthy run."""
    for topic, _, d in run("healthy")[1]:
        if topic == "aegis.telemetry":
            values = d["devices"]["gpu"]["values"]
            assert max(values["gpu_temp_c"]) < 85
            assert min(values["gpu_sm_clock_mhz"]) > 1500


def test_healthy_abnormal_metrics_stay_below_floors() -> None:
    for topic, _, d in run("healthy")[1]:
        if topic != "aegis.telemetry":
            continue
        for group in d["devices"].values():
            for name, vals in group["values"].items():
                m = BY_NAME[name]
                assert all(math.isfinite(v) for v in vals), name
                if m.counter:
                    assert min(vals) >= 0, name
                if m.abnormal:
                    assert max(vals) < m.floor, (name, vals)
            if "nic_link_up" in group["values"]:
                assert group["values"]["nic_link_up"] == [1.0] * 8


@pytest.mark.parametrize("t", [20.0, 60.0, 100.0])
def test_healthy_ccl_counters_agree_within_a_comm(t: float) -> None:
    for (_, _), rows in comm_table(ccl_at("healthy", t)).items():
        cls = [r[3] for r in rows]
        assert max(cls) - min(cls) <= 1  # only an op in flight
        for _, _, _, cl, wr, wc, seq, _td, _n, pending in rows:
            assert wr >= wc and wr - wc <= 4 and pending == ()
            if wr > wc:
                assert cl == seq + 1  # a difference only inside an op
        tds = np.array([r[7] for r in rows])
        assert (tds / tds.mean()).min() > 0.8  # no healthy rank looks like a slow one
        ns = np.array([r[8] for r in rows])
        if ns.mean() > 0:
            assert (ns / ns.mean()).max() < 1.5


def test_healthy_utilisation_in_step_across_a_jobs_hosts() -> None:
    sim, out = run("healthy")
    hosts = sim.inventory.jobs["job-000"]
    at = [d for topic, ts, d in out if topic == "aegis.telemetry" and ts == START + 50
          and d["host"] in hosts]
    means = [np.mean(d["devices"]["gpu"]["values"]["gpu_util_pct"]) for d in at]
    assert len(means) == len(hosts) and np.ptp(means) < 6 and min(means) > 80


# --- critical errors ----------------------------------------------------------------------


@pytest.mark.parametrize("scenario,code", [("xid79", 79), ("xid48", 48), ("nvlink_error", 74)])
def test_xid_line_on_culprit_then_timeouts_on_peers(scenario: str, code: int) -> None:
    sim, _ = run(scenario)
    host, gpu = culprit_host_gpu(scenario)
    bus = sim.inventory.hosts[host].gpu_bus_ids[gpu].rsplit(".", 1)[0]
    xid = lines_with(scenario, f"NVRM: Xid (PCI:{bus}): {code},")
    assert xid and {d["host"] for d in xid} == {host}
    assert min(d["ts"] for d in xid) == pytest.approx(START + FAULT_AT, abs=0.01)
    job_hosts = set(sim.inventory.jobs[truth(scenario)["job"]])
    wd = lines_with(scenario, "Watchdog caught collective operation timeout")
    assert {d["host"] for d in wd} == job_hosts  # every host (the culprit's other ranks too)
    assert min(d["ts"] for d in wd) >= START + FAULT_AT + WATCHDOG
    ib = lines_with(scenario, "NCCL WARN NET/IB : Got completion from peer")
    culprit_ip = sim.inventory.hosts[host].ips[1 + gpu]
    assert ib and all(culprit_ip in d["line"] and d["host"] != host for d in ib)
    assert truth(scenario)["should_isolate"] is True
    assert ["isolate_host", host] in truth(scenario)["expected_actions"]


def test_xid79_culprit_gpu_unreadable_and_its_rank_stops() -> None:
    host, gpu = culprit_host_gpu("xid79")
    after = telemetry("xid79", host, FAULT_AT)
    assert after and all(math.isnan(gpu_metric(d, "gpu_temp_c", gpu)) for d in after)
    recs = ccl_at("xid79", FAULT_AT + 10)[host]
    assert gpu not in {r["gpu"] for r in recs["ranks"]}
    dead = truth("xid79")["end_ts"]
    later = [d for topic, ts, d in run("xid79")[1] if topic == "aegis.ccl" and ts > dead
             and d["job"] == truth("xid79")["job"]]
    assert later == []  # the job died after the timeout: no more CCL snapshots


def test_xid48_raises_the_dbe_counter() -> None:
    host, gpu = culprit_host_gpu("xid48")
    assert gpu_metric(telemetry("xid48", host, FAULT_AT)[0], "gpu_ecc_dbe_total", gpu) >= 1


def test_nvlink_error_counters_on_culprit() -> None:
    host, gpu = culprit_host_gpu("nvlink_error")
    d = telemetry("nvlink_error", host, FAULT_AT)[0]
    assert gpu_metric(d, "gpu_nvlink_err_per_s", gpu) > BY_NAME["gpu_nvlink_err_per_s"].floor


def test_gpu_conn_fail_every_peer_names_the_culprit_gpus_nic_first() -> None:
    sim, _ = run("gpu_conn_fail")
    host, gpu = culprit_host_gpu("gpu_conn_fail")
    addr = sim.inventory.hosts[host].rail_ips[gpu]
    errors = lines_with("gpu_conn_fail", "Got completion from peer")
    peers = set(sim.inventory.jobs[truth("gpu_conn_fail")["job"]]) - {host}
    naming = [d for d in errors if f"peer {addr}<" in d["line"]]
    assert {d["host"] for d in naming} == peers  # every peer's connection to it fails
    assert min(d["ts"] for d in naming) < min(d["ts"] for d in errors if d["host"] == host)
    watchdogs = lines_with("gpu_conn_fail", "Watchdog caught collective operation timeout")
    assert watchdogs and min(d["ts"] for d in watchdogs) > max(d["ts"] for d in errors)
    assert truth("gpu_conn_fail")["expected_actions"][0] == ["isolate_gpu", f"{host}/gpu{gpu}"]


def test_pcie_degradation_aer_downgrade_and_replays() -> None:
    host, gpu = culprit_host_gpu("pcie_degradation")
    assert {d["host"] for d in lines_with("pcie_degradation", "AER: Corrected error")} == {host}
    assert lines_with("pcie_degradation", "limited by 2.5 GT/s PCIe x8 link")
    d = telemetry("pcie_degradation", host, FAULT_AT + 5)[0]
    assert gpu_metric(d, "gpu_pcie_replay_per_s", gpu) > BY_NAME["gpu_pcie_replay_per_s"].floor


def test_ecc_storm_is_correctable_and_must_not_isolate() -> None:
    host, gpu = culprit_host_gpu("ecc_storm")
    assert lines_with("ecc_storm", "): 92, ") and not lines_with("ecc_storm", "): 48, ")
    d = telemetry("ecc_storm", host, FAULT_AT + 2)[0]
    assert gpu_metric(d, "gpu_ecc_sbe_per_s", gpu) > BY_NAME["gpu_ecc_sbe_per_s"].floor
    t = truth("ecc_storm")
    assert t["should_isolate"] is False and t["expected_actions"] == [] and not t["must_detect"]
    assert ccl_at("ecc_storm", 120.0)  # the job keeps training


# --- distributed and config errors --------------------------------------------------------


def test_conn_reset_two_hosts_name_each_other() -> None:
    sim, _ = run("conn_reset_2host")
    a, b = truth("conn_reset_2host")["culprit"]["hosts"]
    resets = lines_with("conn_reset_2host", "Connection reset by peer")
    assert {d["host"] for d in resets} == {a, b}
    for d in resets:
        other = b if d["host"] == a else a
        assert sim.inventory.hosts[other].ips[0] in d["line"]
    assert truth("conn_reset_2host")["expected_kinds"] == ["dist_error"]


def test_config_error_same_error_on_every_host_at_start() -> None:
    sim, out = run("config_error")
    t = truth("config_error")
    hosts = set(sim.inventory.jobs[t["job"]])
    errs = lines_with("config_error", "NCCL WARN Bootstrap : no socket interface found")
    assert {d["host"] for d in errs} == hosts == set(t["culprit"]["hosts"])
    assert {d["line"].split(" ", 2)[2] for d in errs} == {
        "bootstrap.cc:37 NCCL WARN Bootstrap : no socket interface found"}
    assert all(d["ts"] < START + 10 for d in errs)
    assert not [d for topic, _, d in out if topic == "aegis.ccl" and d["job"] == t["job"]]
    assert t["should_isolate"] is False and t["expected_kinds"] == ["config"]


# --- hangs (Aegis §4.2) -------------------------------------------------------------------


def test_compute_hang_culprit_cl_lags_peers_by_one() -> None:
    host, gpu = culprit_host_gpu("compute_hang")
    table = comm_table(ccl_at("compute_hang", FAULT_AT + 20))
    lagging = []
    for rows in table.values():
        assert all(r[4] == r[5] for r in rows)  # WR == WC: nobody waits on the network
        cls = [r[3] for r in rows]
        if len(set(cls)) > 1:
            low = [r for r in rows if r[3] == min(cls)]
            assert len(low) == 1 and max(cls) == min(cls) + 1
            lagging.append((low[0][0], low[0][1]))
    assert lagging and set(lagging) == {(host, gpu)}


def test_network_hang_wr_exceeds_wc_on_the_ranks_over_the_link() -> None:
    host, nic = culprit_host_gpu("network_hang")
    table = comm_table(ccl_at("network_hang", FAULT_AT + 20))
    stuck = [r for rows in table.values() for r in rows if r[4] > r[5]]
    assert len(stuck) == 3 and all(r[1] == nic for r in stuck)
    mine = [r for r in stuck if r[0] == host]
    assert len(mine) == 1 and len(mine[0][9]) == 2  # culprit waits on both ring neighbours
    others = [r for r in stuck if r[0] != host]
    assert all(r[9] == (mine[0][2],) for r in others)  # neighbours name the culprit's rank
    assert truth("network_hang")["expected_actions"] == [["run_netdiag", f"{host}/nic{nic}"]]


# --- degradation (Aegis §5) ---------------------------------------------------------------


def _td_ratios(scenario: str, t: float, host: str, gpu: int) -> tuple[list[float], list[float]]:
    mine: list[float] = []
    others: list[float] = []
    for rows in comm_table(ccl_at(scenario, t)).values():
        tds = np.array([r[7] for r in rows])
        if not any(r[0] == host and r[1] == gpu for r in rows):
            continue
        for r, x in zip(rows, tds / tds.mean(), strict=True):
            (mine if (r[0], r[1]) == (host, gpu) else others).append(float(x))
    return mine, others


@pytest.mark.parametrize("scenario", ["slow_gpu", "thermal_throttle"])
def test_slow_compute_culprit_waits_least(scenario: str) -> None:
    host, gpu = culprit_host_gpu(scenario)
    mine, others = _td_ratios(scenario, FAULT_AT + 70, host, gpu)
    assert mine and max(mine) < 0.8 and min(others) > 0.8
    assert truth(scenario)["expected_actions"] == [["isolate_gpu", f"{host}/gpu{gpu}"]]


def test_thermal_throttle_hot_and_slow_clock() -> None:
    host, gpu = culprit_host_gpu("thermal_throttle")
    d = telemetry("thermal_throttle", host, FAULT_AT + 70)[0]
    assert gpu_metric(d, "gpu_temp_c", gpu) > 85
    assert gpu_metric(d, "gpu_sm_clock_mhz", gpu) < 1500
    peers = [gpu_metric(d, "gpu_sm_clock_mhz", g) for g in range(8) if g != gpu]
    assert min(peers) > 1900


@pytest.mark.parametrize("scenario", ["slow_link", "nic_ecn", "large_packet_loss"])
def test_slow_network_n_high_on_the_link_ranks(scenario: str) -> None:
    host, nic = culprit_host_gpu(scenario)
    flagged = set()
    for rows in comm_table(ccl_at(scenario, FAULT_AT + 30)).values():
        ns = np.array([r[8] for r in rows])
        if ns.mean() == 0:
            continue
        flagged |= {(r[0], r[1]) for r, x in zip(rows, ns / ns.mean(), strict=True) if x > 1.5}
    assert (host, nic) in flagged and all(g == nic for _, g in flagged) and len(flagged) == 2


def test_nic_ecn_on_one_nic_and_iterations_slower() -> None:
    sim, _ = run("nic_ecn")
    host, nic = culprit_host_gpu("nic_ecn")
    at = [d for topic, ts, d in run("nic_ecn")[1]
          if topic == "aegis.telemetry" and ts == START + FAULT_AT + 10]
    assert len(at) == 8
    for d in at:
        for i in range(8):
            ecn = nic_metric(d, "nic_ecn_per_s", i)
            if (d["host"], i) == (host, nic):
                assert 10_000 <= ecn <= 30_000
                assert nic_metric(d, "nic_retrans_per_s", i) > BY_NAME["nic_retrans_per_s"].floor
            else:
                assert ecn < BY_NAME["nic_ecn_per_s"].floor
    job_hosts = sim.inventory.jobs[truth("nic_ecn")["job"]]
    its = [(d["ts"], float(d["line"].split("(ms):")[1].split("|")[0]))
           for d in lines_with("nic_ecn", "elapsed time per iteration") if d["host"] in job_hosts]
    before = np.mean([ms for ts, ms in its if ts < START + FAULT_AT])
    after = np.mean([ms for ts, ms in its if ts > START + FAULT_AT + 5])
    assert after / before == pytest.approx(1.26, abs=0.05)


def test_large_packet_loss_retransmits_on_that_nic() -> None:
    host, nic = culprit_host_gpu("large_packet_loss")
    d = telemetry("large_packet_loss", host, FAULT_AT + 5)[0]
    assert nic_metric(d, "nic_retrans_per_s", nic) > 1000
    assert nic_metric(d, "nic_ecn_per_s", nic) < BY_NAME["nic_ecn_per_s"].floor


def test_optics_flap_link_down_lines_and_dips() -> None:
    host, nic = culprit_host_gpu("optics_flap")
    downs = lines_with("optics_flap", f"mlx5_{nic}: Port: 1 Link DOWN")
    ups = lines_with("optics_flap", f"mlx5_{nic}: Port: 1 Link ACTIVE")
    assert len(downs) >= 2 and len(ups) >= 2 and {d["host"] for d in downs} == {host}
    seen = [nic_metric(d, "nic_link_up", nic) for d in telemetry("optics_flap", host, FAULT_AT)]
    assert 0.0 in seen and 1.0 in seen
    retrans = [nic_metric(d, "nic_retrans_per_s", nic)
               for d in telemetry("optics_flap", host, FAULT_AT)]
    assert max(retrans) > BY_NAME["nic_retrans_per_s"].floor
