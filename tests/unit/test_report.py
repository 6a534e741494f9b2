"""The HTML report: self-contained, every plot has content, the right plots for the findings."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import numpy as np
import orjson
import pytest

from processors import replay
from processors.report import plots
from processors.report.build import ReportInput, build_report, comm_priority, split
from processors.report.collect import CCLCollector, TelemetryCollector, collect
from processors.report.svg import diverging, fmt, num_label, sequential, time_ticks
from processors.settings import PipelineConfig
from producers.sim.simulation import SimConfig, Simulation
from schemas.recording import RecordingWriter, read_recording
from schemas.records import Diagnosis
from schemas.topics import TELEMETRY
from sinks.jsonl import read_jsonl


class PlotCounter(HTMLParser):
    """Each svg.aegis-plot: its id, data-marks, and the children of its g.marks."""

    def __init__(self) -> None:
        super().__init__()
        self.plots: dict[str, dict[str, int]] = {}
        self.cur: str | None = None
        self.depth = 0  # depth inside g.marks (1 = the g itself)
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for k in ("src", "href"):
            if a.get(k):
                self.external.append(f"{tag}[{k}]={a[k]}")
        if tag == "svg" and "aegis-plot" in (a.get("class") or ""):
            self.cur = a["id"]
            self.plots[self.cur] = {"declared": int(a["data-marks"]), "children": 0}
        elif self.cur and tag == "g" and a.get("class") == "marks":
            self.depth = 1
        elif self.depth:
            if self.depth == 1:
                self.plots[self.cur]["children"] += 1
            self.depth += 1

    def handle_endtag(self, tag):
        if self.depth:
            self.depth -= 1
        if tag == "svg":
            self.cur, self.depth = None, 0


def _sim(tmp, scenario, **kw):
    sim = Simulation(SimConfig(hosts=8, hosts_per_job=8, scenario=scenario, seed=1, **kw))
    path = tmp / f"{scenario}.aegis"
    with RecordingWriter(str(path), meta=sim.header_meta()) as w:
        sim.run(w)
    (tmp / f"{scenario}.truth.json").write_bytes(orjson.dumps(sim.truth_doc()))
    return str(path), sim


@pytest.fixture(scope="module")
def hang(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    path, sim = _sim(tmp, "compute_hang", duration_s=360, fault_at_s=60)  # the tree: +245 s
    out, html = tmp / "out.jsonl", tmp / "report.html"
    assert replay.main([path, "-o", str(out), "--report", str(html),
                        "--truth", str(tmp / "compute_hang.truth.json")]) == 0
    return path, sim, list(read_jsonl(out)), html.read_text()


def test_report_is_self_contained_and_every_plot_has_marks(hang):
    _, _, _, html = hang
    pc = PlotCounter()
    pc.feed(html)
    assert pc.external == [] and "://" not in html and "@import" not in html
    assert pc.plots
    for pid, n in pc.plots.items():
        assert n["declared"] > 0 and n["children"] == n["declared"], pid


def test_report_has_the_plots_of_the_findings(hang):
    _, sim, items, html = hang
    job = sim.truth[0]["job"]
    ids = set(re.findall(r'<svg id="([^"]+)"', html))
    assert f"timeline-{job}" in ids and f"degradation-{job}" in ids
    ds = [i for i in items if isinstance(i, Diagnosis)]
    tree = [d for d in ds if d.detector == "decision_tree"]
    assert tree and all(f"tree-{d.id}" in ids for d in tree)
    hang_d = next(d for d in ds if d.kind == "hang_compute")
    comms = {x["comm"] for x in hang_d.evidence["lagging_in"]}
    for c in comms:
        for metric in ("cl_lag", "wr_wc", "td_ratio"):
            assert f"heat-{job}-{c}-{metric}" in ids
    assert 'class="fault"' in html  # the truth fault on the timeline
    assert "f00-compute_hang" in html


def test_lagging_rank_stands_out_in_the_cl_heatmap(hang):
    path, sim, items, _ = hang
    job = sim.truth[0]["job"]
    host, gpu = sim.truth[0]["culprit"]["gpus"][0].split("/gpu")
    start, end = sim.config.start_ts, sim.end_ts
    ccl = CCLCollector(start, 5.0, int((end - start) // 5) + 1)
    collect(read_recording(path)[1], None, ccl, {job})
    ds = [i for i in items if isinstance(i, Diagnosis) and i.job == job]
    comms = {c: cd for (j, c), cd in ccl.comms.items() if j == job}
    first = comm_priority(ds, comms)[0]
    cd = comms[first]
    vals, step = plots.heatmap_values(cd, max_cols=10_000)
    culprit = next(r for r, m in cd.members.items() if m == (host, int(gpu)))
    t_fault = int((sim.truth[0]["start_ts"] + 30 - start) // 5)
    lag = vals["cl_lag"][:, t_fault:t_fault + 12]  # while the hang lasts (before the crash)
    assert (lag[culprit] >= 1).all()
    others = np.delete(lag, culprit, axis=0)
    assert (np.nan_to_num(others) == 0).mean() > 0.9


def test_degradation_of_the_hung_job(hang):
    _, sim, _, html = hang
    job = sim.truth[0]["job"]
    row = re.search(rf"<tr><td>{job}</td><td>([0-9.]+)%</td><td>([0-9]+)</td>", html)
    assert row and float(row.group(1)) > 20.0  # hung for minutes: stalled time is lost time


def test_zscore_metric_plots_on_telemetry(tmp_path):
    sim = Simulation(SimConfig(hosts=8, hosts_per_job=8, scenario="nic_ecn", seed=1,
                               duration_s=400, fault_at_s=60))
    path = tmp_path / "ecn.aegis"
    with RecordingWriter(str(path), meta=sim.header_meta()) as w:
        for e in sim.iter_encoded():
            if e[0] == TELEMETRY.name:
                w.emit_encoded(*e)
    cfg = PipelineConfig.from_toml(None)
    pol = tmp_path / "p.toml"
    pol.write_text("[zscore]\nwindow_s = 120.0\n")
    out, html_path = tmp_path / "o.jsonl", tmp_path / "r.html"
    assert replay.main([str(path), "--policy", str(pol), "-o", str(out),
                        "--report", str(html_path)]) == 0
    html = html_path.read_text()
    ds = [i for i in read_jsonl(out) if isinstance(i, Diagnosis) and i.kind == "slow_network"]
    assert ds
    d = ds[0]
    for m in d.evidence["metrics"]:
        assert f'id="metric-{d.id}-{m}"' in html
    assert 'class="persistence"' in html and 'class="band"' in html
    assert 'id="whatif"' in html  # the what-if section of a --policy run
    # the series reproduces the detector's numbers at the flagged sub-window
    tel = TelemetryCollector({(d.job, "nic"): set(d.evidence["metrics"])}, 30.0)
    collect(read_recording(str(path))[1], tel, None)
    cfg = PipelineConfig.from_toml(str(pol))
    for m, ev in d.evidence["metrics"].items():
        s = tel.series(d.job, "nic", m, d.evidence["device"], cfg.section("zscore"))
        i = s.t.index(ev["flagged_at"] - 30.0)
        assert s.value[i] == pytest.approx(ev["value"]) and s.mean[i] == pytest.approx(ev["mean"])
        assert s.std[i] == pytest.approx(ev["std"]) and s.upper[i] == pytest.approx(ev["bound"])


def test_healthy_report_still_renders(tmp_path):
    path, _ = _sim(tmp_path, "healthy", duration_s=120)
    inp = ReportInput(path=path, items=[])
    html = build_report(inp)
    pc = PlotCounter()
    pc.feed(html)
    assert any(p.startswith("heat-") for p in pc.plots)
    assert split([]).diagnoses == []


@pytest.mark.parametrize("x,s", [(0.0, "0"), (1.5, "1.5"), (2.0, "2"), (-0.001, "0"), (3.14159, "3.14")])
def test_fmt(x, s):
    assert fmt(x) == s


def test_labels_ticks_and_colours():
    assert num_label(12_300) == "12.3k" and num_label(2.5e9) == "2.5G" and num_label(0.5) == "0.5"
    ticks = time_ticks(1767225600.0, 1767226500.0)
    assert 3 <= len(ticks) <= 8 and ticks == sorted(ticks)
    assert sequential(0) == "#fafafa" and sequential(1) == "#b2182b"
    assert diverging(1.0) == "#f7f7f7" and diverging(0.2).startswith("#21") and diverging(9) == "#b2182b"
