"""Aegis §4.2 CL/WR/WC alignment over a synthetic job (SynthJob, also used by test_tdn)."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest

from processors.core.alignment import AlignmentConfig, AlignmentDetector
from processors.core.base import Outputs
from processors.core.ccl_state import localise
from schemas.inventory import HostInventory, Inventory
from schemas.records import CCLRecord, OpCounters, RankSnapshot

JOB = "job-a"


class SynthJob:
    """``hosts`` × ``gpus`` training job, one iteration per 1 s snapshot.

    TP communicator per host (rank = local GPU, NVLink: no network WRs) and a DP communicator
    per rail (rank = host index; ring: host h sends to h+1). Faults: ``hang`` (a GPU stops
    launching), ``link_down`` (WRs over one NIC never complete), ``kill`` (a host stops
    reporting), ``slow`` (a GPU computes slower), ``slow_link`` (a NIC's WRs are slower),
    ``finish`` (the job ends: counters stop, reporting goes on).
    """

    def __init__(self, hosts: int = 16, gpus: int = 8, t0: float = 1000.0, seed: int = 0,
                 jitter: float = 0.02, spikes: float = 0.01) -> None:
        self.H, self.G, self.t, self.k = hosts, gpus, t0, 0
        self.rng = np.random.default_rng(seed)
        self.jitter, self.spikes = jitter, spikes
        self.hosts = [f"h{i:04d}" for i in range(hosts)]
        self.tp = [f"{0xA000000000000000 + h:016x}" for h in range(hosts)]
        self.dp = [f"{0xB000000000000000 + g:016x}" for g in range(gpus)]
        z = np.zeros((hosts, gpus), dtype=np.int64)
        self.tp_cl, self.dp_cl, self.dp_wr, self.dp_wc = z.copy(), z.copy(), z.copy(), z.copy()
        self.tp_seq, self.dp_seq = z.copy(), z.copy()
        self.tp_td, self.dp_td, self.dp_n = (np.zeros((hosts, gpus)) for _ in range(3))
        self.dp_pending: dict[tuple[int, int], tuple[int, ...]] = {}
        self.slow: dict[tuple[int, int], float] = {}
        self.slow_links: dict[tuple[int, int], float] = {}
        self.silent: set[int] = set()
        self.fault: tuple[str, int, int, bool] | None = None  # kind, host, gpu, both ways
        self.frozen = False
        self.link_peers = True  # slow links also show their outstanding WRs and peers

    # -- faults -----------------------------------------------------------------------------
    def hang(self, h: int, g: int) -> None:
        self.fault = ("hang", h, g, True)

    def link_down(self, h: int, g: int, both_ways: bool = True) -> None:
        self.fault = ("link", h, g, both_ways)

    def kill(self, h: int) -> None:
        self.fault = ("kill", h, 0, True)

    def finish(self) -> None:
        self.frozen = True

    # -- one snapshot interval --------------------------------------------------------------
    def step(self) -> list[CCLRecord]:
        self.t += 1.0
        if self.fault is not None:
            self._fault_step(*self.fault)
            self.fault, self.frozen = None, True
        elif not self.frozen:
            self._iteration()
        return [self.record(h) for h in range(self.H) if h not in self.silent]

    def _iteration(self) -> None:
        H, G, rng = self.H, self.G, self.rng
        self.k += 1
        slow = np.ones((H, G))
        for (h, g), f in self.slow.items():
            slow[h, g] = f
        arrive = 100.0 * (1 + self.jitter * rng.standard_normal((H, G))) * slow
        end_tp = arrive.max(axis=1) + 20.0 * (1 + 0.02 * rng.standard_normal(H))
        self.tp_td = (end_tp[:, None] - arrive) * 1000.0
        b = end_tp[:, None] + 0.5 * rng.standard_normal((H, G))
        end_dp = b.max(axis=0) + 40.0 * (1 + 0.02 * rng.standard_normal(G))
        self.dp_td = (end_dp[None, :] - b) * 1000.0
        n = 50.0 * (1 + 0.1 * np.abs(rng.standard_normal((H, G))))
        n[rng.random((H, G)) < self.spikes] *= 2.5  # passing congestion, one iteration
        self.dp_pending = {}
        self.tp_cl += 1
        self.tp_seq[:] = self.k
        self.dp_cl += 1
        self.dp_seq[:] = self.k
        self.dp_wc[:] = self.dp_wr  # the previous interval's in-flight requests completed
        self.dp_wr += 2
        self.dp_wc += 2
        for (h, g), f in self.slow_links.items():
            n[h, g] *= f
            n[(h - 1) % H, g] *= (1 + f) / 2
            if not self.link_peers:
                continue
            self.dp_pending[(h, g)] = ((h + 1) % H,)
            self.dp_pending[((h - 1) % H, g)] = (h,)
            self.dp_wc[h, g] -= 1
            self.dp_wc[(h - 1) % H, g] -= 1
        self.dp_n = n

    def _fault_step(self, kind: str, fh: int, fg: int, both: bool) -> None:
        H = self.H
        self.dp_pending = {}
        self.dp_wc[:] = self.dp_wr
        if kind == "hang":  # fh/fg never launches; its host blocks in TP, the rest in DP
            for g in range(self.G):
                if g != fg:
                    self.tp_cl[fh, g] += 1
            self.tp_cl[np.arange(H) != fh] += 1
            for h in range(H):
                if h == fh:
                    continue
                self.dp_cl[h] += 1
                self.dp_wr[h] += 1
                if (h + 1) % H != fh:
                    self.dp_wc[h] += 1
                else:
                    for g in range(self.G):
                        self.dp_pending[(h, g)] = (fh,)
        elif kind == "link":  # rail fg's op never completes over fh's NIC; TP then waits on it
            self.tp_cl += 1
            self.dp_cl += 1
            self.dp_wr += 2
            self.dp_wc += 2
            self.dp_wc[fh, fg] -= 1
            self.dp_pending[(fh, fg)] = ((fh + 1) % H,)
            if both:
                self.dp_wc[(fh - 1) % H, fg] -= 1
                self.dp_pending[((fh - 1) % H, fg)] = (fh,)
            for g in range(self.G):
                if g != fg:
                    self.tp_cl[:, g] += 1
        elif kind == "kill":  # fh's host disappears; everyone else blocks in DP
            self.silent.add(fh)
            self.tp_cl += 1
            for h in range(H):
                if h != fh:
                    self.dp_cl[h] += 1
                    self.dp_wr[h] += 1
                    if (h + 1) % H != fh:
                        self.dp_wc[h] += 1
                    else:
                        for g in range(self.G):
                            self.dp_pending[(h, g)] = (fh,)

    def record(self, h: int, **override: float) -> CCLRecord:
        ranks = []
        for g in range(self.G):
            tp = OpCounters("allreduce", int(self.tp_cl[h, g]), 0, 0, int(self.tp_seq[h, g]),
                            float(self.tp_td[h, g]), 0.0)
            ranks.append(RankSnapshot(self.tp[h], self.G, g, g, (tp,), (), self.t))
        for g in range(self.G):
            dp = OpCounters("allreduce", int(self.dp_cl[h, g]), int(self.dp_wr[h, g]),
                            int(self.dp_wc[h, g]), int(self.dp_seq[h, g]),
                            override.get("td_us", float(self.dp_td[h, g])),
                            float(self.dp_n[h, g]))
            ranks.append(RankSnapshot(self.dp[g], self.H, h, g, (dp,),
                                      self.dp_pending.get((h, g), ()), self.t))
        return CCLRecord(self.hosts[h], self.t, tuple(ranks), JOB)

    def inventory(self) -> Inventory:
        inv = Inventory()
        for h, name in enumerate(self.hosts):
            inv.add_host(HostInventory(name, tor=tuple(f"tor-r{g}-{h // 32}"
                                                       for g in range(self.G))))
        return inv


def run(det: AlignmentDetector, job: SynthJob, steps: int, out: Outputs | None = None) -> Outputs:
    out = out if out is not None else Outputs()
    for _ in range(steps):
        for rec in job.step():
            out.extend(det.observe(rec))
        out.extend(det.advance(job.t))
    return out


def test_compute_hang_names_the_gpu_within_stall_plus_5s() -> None:
    job, det = SynthJob(), AlignmentDetector(JOB)
    assert not run(det, job, 20).diagnoses
    job.hang(3, 2)
    hang_start = job.t + 1  # the snapshot where h0003/gpu2 first failed to launch
    out = run(det, job, 60)
    assert [d.kind for d in out.diagnoses] == ["hang_compute"]
    d = out.diagnoses[0]
    assert d.culprits.gpus == ("h0003/gpu2",) and d.culprits.hosts == ("h0003",)
    assert d.evidence["rule"] == "cl_lag"
    assert d.evidence["actions"] == [["isolate_host", "h0003"], ["restart_job", JOB]]
    assert {x["comm"] for x in d.evidence["lagging_in"]} == {job.tp[3], job.dp[2]}
    # the hang began in (hang_start - 1, hang_start]; named within stall + 5 s of that
    assert d.detected_ts - (hang_start - 1) <= det.cfg.stall_s + 5
    assert d.event_ts == hang_start  # first report of peers ahead of the lagging GPU
    assert d.evidence["lagging_in"][0]["last_cl_change"] == hang_start - 1


@pytest.mark.parametrize("both_ways, link", [
    (True, "h0005/nic3<->tor"),  # h4->h5 and h5->h6 outstanding: h5's NIC is common
    (False, "h0005/nic3<->h0006/nic3"),  # one outstanding pair: name the pair
])
def test_network_hang_localises_the_nic(both_ways: bool, link: str) -> None:
    job, det = SynthJob(), AlignmentDetector(JOB)
    run(det, job, 10)
    job.link_down(5, 3, both_ways)
    out = run(det, job, 50)
    assert [d.kind for d in out.diagnoses] == ["hang_network"]
    d = out.diagnoses[0]
    assert d.culprits.links == (link,)
    assert d.evidence["actions"] == [["run_netdiag", link]]
    assert "h0005" in d.culprits.hosts and not d.culprits.gpus


def test_network_hang_uses_inventory_tor_names() -> None:
    job = SynthJob()
    det = AlignmentDetector(JOB, inventory=job.inventory())
    run(det, job, 10)
    job.link_down(5, 3)
    d, = run(det, job, 50).diagnoses
    assert d.culprits.links == ("h0005/nic3<->tor-r3-0",)


def test_silent_host_is_the_suspect_once() -> None:
    job, det = SynthJob(), AlignmentDetector(JOB)
    run(det, job, 10)
    job.kill(7)
    out = run(det, job, 60)
    assert len(out.diagnoses) == 1
    d = out.diagnoses[0]
    assert (d.kind, d.evidence["rule"], d.culprits.hosts) == ("hang_compute", "rank_silent",
                                                               ("h0007",))
    assert d.evidence["actions"] == [["isolate_host", "h0007"], ["restart_job", JOB]]


def test_hosts_silent_together_are_one_diagnosis() -> None:
    """A rack's power: the guard takes all of them past its cap or none, and the job
    restarts once, not once per host."""
    job, det = SynthJob(), AlignmentDetector(JOB)
    run(det, job, 10)
    job.kill(8)
    job.silent.update({9, 10})  # the same instant (kill keeps one fault)
    out = run(det, job, 60)
    [d] = out.diagnoses
    hosts = ("h0008", "h0009", "h0010")
    assert (d.evidence["rule"], d.culprits.hosts) == ("rank_silent", hosts)
    assert d.evidence["actions"] == [*(["isolate_host", h] for h in hosts), ["restart_job", JOB]]
    assert sorted(d.evidence["silent_since_by_host"]) == list(hosts)
    assert len(d.evidence["silent_gpus"]) == 24 and "h0008, h0009 and h0010 stopped" in d.summary
    assert run(det, job, 30).diagnoses == []  # every one of them is in the incident


@pytest.mark.parametrize("keep_reporting", [True, False])
def test_job_end_is_not_a_hang(keep_reporting: bool) -> None:
    job, det = SynthJob(), AlignmentDetector(JOB)
    run(det, job, 10)
    job.finish()
    if keep_reporting:
        out = run(det, job, 120)
    else:  # hosts stop one after another; time moves on
        out = Outputs()
        for h in range(job.H):
            out = run(det, job, 3, out)
            job.silent.add(h)
        out.extend(det.advance(job.t + 700))
    assert not out.diagnoses


def test_rearms_after_the_communicator_advances() -> None:
    job, det = SynthJob(), AlignmentDetector(JOB)
    run(det, job, 5)
    job.hang(1, 1)
    assert len(run(det, job, 40).diagnoses) == 1
    assert not run(det, job, 40).diagnoses  # still the same incident
    job.tp_cl[:] = job.tp_cl.max() + 1  # recovers
    job.dp_cl[:] = job.dp_cl.max() + 1
    job.dp_wc[:] = job.dp_wr
    job.dp_pending = {}
    job.frozen = False
    assert not run(det, job, 10).diagnoses
    job.hang(1, 1)
    assert len(run(det, job, 40).diagnoses) == 1


def test_snapshot_restore_mid_stall_gives_identical_outputs() -> None:
    job, det = SynthJob(), AlignmentDetector(JOB)
    run(det, job, 10)
    job.hang(2, 6)
    run(det, job, 15)
    state = msgpack.unpackb(msgpack.packb(det.snapshot()), raw=False, strict_map_key=False)
    twin = AlignmentDetector.restore(state, JOB)
    a, b = Outputs(), Outputs()
    for _ in range(40):
        for rec in job.step():
            a.extend(det.observe(rec))
            b.extend(twin.observe(rec))
    assert len(a.diagnoses) == 1
    assert [d.to_wire() for d in a.diagnoses] == [d.to_wire() for d in b.diagnoses]
    assert twin.snapshot() == det.snapshot()


def test_bad_and_late_input_is_rejected_with_a_reason() -> None:
    job, det = SynthJob(hosts=4), AlignmentDetector(JOB)
    run(det, job, 3)
    bad = RankSnapshot(job.tp[0], 8, 0, 0, (OpCounters("allreduce", -1, 0, 0),))
    out = det.observe(CCLRecord("h0000", job.t + 1, (bad,), JOB))
    late = det.observe(CCLRecord("h0000", job.t - 2, job.record(0).ranks, JOB))
    other = det.observe(CCLRecord("h0000", job.t, (), "job-b"))
    assert [r.reason for r in out.rejections] == ["negative_counter"]
    assert {r.reason for r in late.rejections} == {"late"}
    assert [r.reason for r in other.rejections] == ["wrong_job"]


def test_communicators_are_bounded() -> None:
    det = AlignmentDetector(JOB, AlignmentConfig(max_comms=4))
    out = Outputs()
    for i in range(10):
        snap = RankSnapshot(f"{i:016x}", 2, 0, 0, (OpCounters("allreduce", 1, 0, 0),))
        out.extend(det.observe(CCLRecord("h0000", 10.0 + i, (snap,), JOB)))
    assert len(det.counters) == 4 and len(det.roster.sizes) == 4
    assert [r.reason for r in out.rejections] == ["comm_evicted"] * 6


@pytest.mark.parametrize("troubled, peers, how, suspects, pairs", [
    ([5], {}, "endpoint", (5,), ()),
    ([4, 5], {4: [5], 5: [6]}, "endpoint", (5,), ((4, 5), (5, 6))),
    ([5, 1, 9], {5: [1, 9], 1: [5], 9: [5]}, "endpoint", (5,), ((1, 5), (5, 9))),
    ([5], {5: [6]}, "pair", (), ((5, 6),)),
    ([5, 6], {5: [6], 6: [5]}, "pair", (), ((5, 6),)),
    ([1, 3], {1: [2], 3: [4]}, "scattered", (), ((1, 2), (3, 4))),
    ([1, 3], {}, "scattered", (1, 3), ()),
    ([4, 5], {}, "ring", (5,), ((4, 5),)),  # 4 sends into 5, 5 sends out: 5's NIC
    ([0, 15], {}, "ring", (0,), ((0, 15),)),  # wraps around the ring of 16
    ([2, 9], {}, "scattered", (2, 9), ()),
])
def test_rootdiag_localisation(troubled: list[int], peers: dict[int, list[int]], how: str,
                               suspects: tuple[int, ...], pairs: tuple[tuple[int, int], ...]) -> None:
    loc = localise(troubled, peers, ring_size=16)
    assert (loc.how, loc.suspects, loc.pairs) == (how, suspects, pairs)


def test_config_is_checked() -> None:
    from schemas.errors import ConfigError
    with pytest.raises(ConfigError):
        AlignmentConfig(stall_s=0)
    assert math.isclose(AlignmentConfig().stall_s, 30.0)


def test_most_specific_gpu_of_a_host_is_named() -> None:
    """TP of h3: only gpu0 went ahead (gpu1..7 lag); DP rail 5: h3 lags. gpu5 lags in both."""
    job, det = SynthJob(), AlignmentDetector(JOB)
    run(det, job, 10)
    job.finish()
    job.tp_cl[3, 0] += 1
    job.dp_cl[:, 5] += 1
    job.dp_cl[3, 5] -= 1
    d, = run(det, job, 40).diagnoses
    assert d.culprits.gpus == ("h0003/gpu5",)
    assert d.evidence["less_specific"] == [f"h0003/gpu{g}" for g in (1, 2, 3, 4, 6, 7)]


def test_lagging_and_silent_on_one_host_give_one_diagnosis() -> None:
    job, det = SynthJob(), AlignmentDetector(JOB)
    run(det, job, 10)
    job.finish()
    job.dp_cl[:, 2] += 1
    job.dp_cl[6, 2] -= 1  # h6/gpu2 lags in rail 2 ...
    job.silent.add(6)  # ... and h6 stops reporting
    d, = run(det, job, 45).diagnoses
    assert d.culprits.hosts == ("h0006",) and d.kind == "hang_compute"


def test_a_killed_communicator_is_gone_not_hung() -> None:
    """A job killed mid-iteration freezes unequal counters; the agent keeps reporting the dead
    processes' entries for ~10 s, then drops them. Meanwhile another communicator of the job
    keeps the clock moving. The frozen one is gone, not a compute hang."""
    from processors.core.alignment import AlignmentDetector
    from schemas.records import CCLRecord, OpCounters, RankSnapshot

    det, diags = AlignmentDetector(JOB), []
    for t in range(1, 120):
        for h in range(4):
            ranks = [RankSnapshot("b" * 16, 4, h, 1, (OpCounters("AllReduce", t, t, t),))]
            if t <= 60 + 10:  # killed at 60 (rank 2 one launch behind), reported 10 s more
                cl = min(t, 60) - (1 if h == 2 and t >= 60 else 0)
                ranks.append(RankSnapshot("a" * 16, 4, h, 0, (OpCounters("AllReduce", cl, cl, cl),)))
            out = det.observe(CCLRecord(f"h{h:04d}", 1000.0 + t, tuple(ranks), job=JOB))
            diags += out.diagnoses + det.advance(1000.0 + t).diagnoses
    assert diags == []
