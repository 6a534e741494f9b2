"""Phase 2 from the NCCL ABI to a diagnosis, with nothing simulated in between: the built
plugin driven as NCCL drives it (v4 tables, four ranks on GPUs 0-3), the agent's real
CCLReceiver on a real Unix socket, and the real alignment detector. Rank 2 stops launching
while its peers wait on it: the diagnosis names h001/gpu2 (Aegis §4.2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from tests.integration.test_ccl_hooks_harness import HOOKS, ROOT, _require_tools


def test_a_rank_that_stops_launching_is_named_through_the_whole_chain(tmp_path: Path) -> None:
    _require_tools()
    subprocess.run(["make", "-C", str(HOOKS)], check=True, capture_output=True, timeout=300)
    run = subprocess.run([sys.executable, "-m", "tests.integration.apps.ccl_chain_app",
                          str(tmp_path / "ccl.sock")], cwd=ROOT, capture_output=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    diags = [orjson.loads(x) for x in run.stdout.splitlines()]
    assert [(d["kind"], d["evidence"]["rule"], d["culprits"]["gpus"]) for d in diags] == [
        ("hang_compute", "cl_lag", ["h001/gpu2"])], diags
    (lag,) = diags[0]["evidence"]["lagging_in"]
    assert (lag["rank"], lag["cl"], lag["max_cl"], lag["ops"]) == (2, 9, 10, ["AllReduce"])
