"""Host specs, targets and the nccl-tests driver's command line and parser."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from producers.cbd.nccl_tests import mpirun_argv, parse_output, usable
from producers.cbd.targets import (
    HostSpec,
    LocalTarget,
    NetnsTarget,
    SshTarget,
    load_hosts,
    make_target,
    parse_spec,
)
from schemas.errors import ConfigError


@pytest.mark.parametrize("text, expect", [
    ("local", ("local", "", None)),
    ("h1=netns:cbd-a addr=10.200.0.1 port=29500 env.NCCL_IB_HCA=mlx5",
     ("netns", "cbd-a", "10.200.0.1")),
    ("ssh:root@gpu17", ("ssh", "root@gpu17", None)),
])
def test_parse_spec(text: str, expect: tuple) -> None:
    s = parse_spec(text)
    assert (s.kind, s.arg, s.addr) == expect
    if s.kind == "netns":
        assert s.name == "h1" and s.port == 29500 and s.env == {"NCCL_IB_HCA": "mlx5"}
    if s.kind == "ssh":
        assert s.name == "gpu17"


@pytest.mark.parametrize("text, err", [
    ("docker:x", "kind"), ("netns", "needs an argument"), ("local port=99999", "port"),
    ("local color=red", "unknown option"), ("local addr", "KEY=VALUE")])
def test_parse_spec_errors(text: str, err: str) -> None:
    with pytest.raises(ConfigError, match=err):
        parse_spec(text)


def test_load_hosts_list_text_and_json(tmp_path: Path) -> None:
    assert [s.name for s in load_hosts("netns:a, netns:b")] == ["a", "b"]
    txt = tmp_path / "hosts.txt"
    txt.write_text("# batch 7\nh1=netns:a addr=10.0.0.1\n\nh2=netns:b  # spare\n")
    assert [(s.name, s.addr) for s in load_hosts(str(txt))] == [("h1", "10.0.0.1"), ("h2", None)]
    js = tmp_path / "hosts.json"
    js.write_text(json.dumps([{"name": "x", "target": "netns:a", "addr": "10.0.0.9",
                               "env": {"NCCL_DEBUG": "WARN"}}, "y=local"]))
    x, y = load_hosts(str(js))
    assert x.env == {"NCCL_DEBUG": "WARN"} and x.addr == "10.0.0.9" and y.kind == "local"
    with pytest.raises(ConfigError, match="duplicate"):
        load_hosts("netns:a,netns:a")


def test_target_command_lines() -> None:
    assert NetnsTarget(HostSpec("h", "netns", "ns1")).command(["true"]) == [
        "ip", "netns", "exec", "ns1", "true"]
    ssh = SshTarget(HostSpec("h", "ssh", "root@gpu1", env={"A": "1 2"}))
    assert ssh.command(["python3", "-m", "x"]) == [
        "ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "root@gpu1",
        "env 'A=1 2' python3 -m x"]
    assert isinstance(make_target(HostSpec("h", "local")), LocalTarget)


def test_local_run_and_timeout() -> None:
    t = LocalTarget(HostSpec("h", "local", env={"CBD_T": "yes"}))
    r = t.run([sys.executable, "-c", "import os; print(os.environ['CBD_T'])"], 30)
    assert r.rc == 0 and r.stdout.strip() == "yes"
    slow = t.run([sys.executable, "-c", "import time; time.sleep(30)"], 0.5)
    assert slow.timed_out and slow.duration_s < 10
    missing = t.run(["/nonexistent/tool"], 5)
    assert missing.rc == 127


NCCL_OUT = """\
# nThread 1 nGpus 1 minBytes 8388608 maxBytes 33554432 step: 2(factor) warmup iters: 5 iters: 20
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
[1,0]<stdout>:     8388608       2097152     float     sum      -1    90.10   93.10  174.57      0    89.00   94.25  176.72      0
    16777216       4194304     float     sum      -1   160.20  104.73  196.37      0   158.90  105.58  197.97      0
    33554432       8388608     float     sum      -1   301.00  111.48  209.02      0   300.10  111.81  209.65      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 193.3
"""
OLD_FORMAT = """\
#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
     1048576        262144   float     sum    27.76   37.78   66.11  2e-07    27.49   38.15   66.76  2e-07
"""


def test_parse_nccl_tests_output() -> None:
    out = parse_output(NCCL_OUT)
    assert [r["size"] for r in out["rows"]] == [8388608, 16777216, 33554432]
    assert out["max_busbw"] == 209.02 and out["avg_busbw"] == 193.3 and out["wrong"] == 0
    old = parse_output(OLD_FORMAT)
    assert old["rows"][0]["busbw"] == 66.11 and old["avg_busbw"] is None
    assert parse_output("mpirun: command not found")["rows"] == []


def test_mpirun_argv_and_usable() -> None:
    argv = mpirun_argv("mpirun", ["--allow-run-as-root"], [("10.0.0.1", 8), ("10.0.0.2", 8)],
                       "all_reduce_perf", {"NCCL_IB_HCA": "mlx5"})
    assert argv[:6] == ["mpirun", "--allow-run-as-root", "-np", "16", "-H",
                        "10.0.0.1:8,10.0.0.2:8"]
    assert "-x" in argv and "NCCL_IB_HCA=mlx5" in argv and argv[-2:] == ["-n", "20"]
    facts: dict[str, dict[str, Any]] = {"a": {"tools": {"all_reduce_perf": "/x", "mpirun": "/y"},
                   "nvml": {"available": True, "count": 8}},
             "b": {"tools": {}, "nvml": {"available": False}}}
    ok, why = usable(facts, ["a", "b"])
    assert not ok and "b: no all_reduce_perf, mpirun, GPUs (NVML)" in why
    assert usable(facts, ["a"])[0]
