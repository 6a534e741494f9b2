"""The replay report opened in real headless Chromium (Debian package ``chromium``; ``make
test`` installs it). Offline: no network flags aside, the page has nothing to fetch.

Checks that every plot rendered with content (the page's own script measures each SVG's
marks with getBBox and records the result in the DOM) and that the screenshot is a real
picture. Screenshots are kept under ``artifacts/`` (ignored by git).
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import orjson
import pytest

from processors import replay
from producers.sim.simulation import SimConfig, Simulation
from schemas.recording import RecordingWriter

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium() -> str:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install the Debian package 'chromium' "
                    "(apt-get install -y chromium; `make test` does it) to test the report")
    return CHROMIUM


def run_chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, timeout=180)


def png_pixels(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, decompressed IDAT bytes) of a PNG, read by hand."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, size = 8, b"", (0, 0)
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    return size[0], size[1], zlib.decompress(idat)


def make_report(tmp: Path, name: str, scenario: str, extra: list[str], **kw: float) -> Path:
    sim = Simulation(SimConfig(hosts=8, hosts_per_job=8, scenario=scenario, seed=1, **kw))
    rec = tmp / f"{name}.aegis"
    with RecordingWriter(str(rec), meta=sim.header_meta()) as w:
        sim.run(w)
    truth = tmp / f"{name}.truth.json"
    truth.write_bytes(orjson.dumps(sim.truth_doc()))
    html = tmp / f"{name}.html"
    code = replay.main([str(rec), "-o", str(tmp / f"{name}.jsonl"), "--report", str(html),
                        "--truth", str(truth), *extra])
    assert code == 0
    return html


@pytest.mark.parametrize("name,scenario,extra,kw,kinds", [
    ("compute_hang", "compute_hang", [], {"duration_s": 360, "fault_at_s": 60},
     ("timeline", "degradation", "tree-path", "heatmap")),
    ("nic_ecn", "nic_ecn", ["--policy", "SHORT"], {"duration_s": 400, "fault_at_s": 60},
     ("timeline", "degradation", "metric", "heatmap")),
])
def test_report_renders_in_chromium(tmp_path, name, scenario, extra, kw, kinds):
    browser = chromium()
    assert browser
    short = tmp_path / "short.toml"
    short.write_text("[zscore]\nwindow_s = 120.0\n")
    html = make_report(tmp_path, name, scenario, [str(short) if x == "SHORT" else x
                                                  for x in extra], **kw)
    url = html.resolve().as_uri()

    dom = run_chromium(["--dump-dom", url], tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr.decode(errors="replace")[-2000:]
    text = dom.stdout.decode()
    check = re.search(r'id="render-check" data-plots="(\d+)" data-nonempty="(\d+)"', text)
    assert check, text[-2000:]
    total, nonempty = int(check.group(1)), int(check.group(2))
    svgs = re.findall(r'<svg id="([^"]+)" class="aegis-plot ([^"]+)" data-marks="(\d+)"[^>]*'
                      r'data-rendered="(\d+)x(\d+)"', text)
    assert total == len(svgs) > 0 and nonempty == total, (total, nonempty)
    for pid, _cls, marks, w, h in svgs:
        assert int(marks) > 0 and (int(w) > 0 or int(h) > 0), pid
    for kind in kinds:
        assert any(cls.split()[0] == kind for _, cls, *_ in svgs), kind

    artifacts = ROOT / "artifacts"
    artifacts.mkdir(exist_ok=True)
    png = tmp_path / "shot.png"
    shot = run_chromium([f"--screenshot={png}", "--window-size=1400,4000", url],
                        tmp_path / "profile-shot")
    assert shot.returncode == 0 and png.exists(), shot.stderr.decode(errors="replace")[-2000:]
    shutil.copy(png, artifacts / f"report-{name}.png")
    shutil.copy(html, artifacts / f"report-{name}.html")
    data = png.read_bytes()
    width, height, pixels = png_pixels(data)
    assert (width, height) == (1400, 4000)
    assert len(data) > 30_000  # a blank page compresses to a few KB
    assert len(set(pixels[::97])) > 32  # not one colour: many distinct byte values
