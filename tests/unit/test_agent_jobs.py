"""Job id sources: env var, scheduler file (re-read on change), fixed label."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from producers.agent.jobs import EnvJob, FileJob, FixedJob, clean_job


@pytest.mark.parametrize(("text", "job"), [
    ("job-42\n", "job-42"), ("\n\n  j7  \nother\n", "j7"), ("", None), ("   \n", None),
    (None, None), ("x" * 500, "x" * 200), ("a\x00b", "ab")])
def test_clean_job(text: str | None, job: str | None) -> None:
    assert clean_job(text) == job


def test_env_job() -> None:
    env = {"AEGIS_JOB_ID": "train-7"}
    assert EnvJob(environ=env).current() == "train-7"
    assert EnvJob("SLURM_JOB_ID", env).current() is None
    assert EnvJob("SLURM_JOB_ID", {"SLURM_JOB_ID": "991"}).current() == "991"


def test_file_job_rereads_on_change(tmp_path: Path) -> None:
    p = tmp_path / "job"
    src = FileJob(p)
    assert src.current() is None  # no file yet: no job
    p.write_text("job-a\n")
    assert src.current() == "job-a"
    tmp = tmp_path / "job.tmp"
    tmp.write_text("job-b\n")
    os.replace(tmp, p)  # the scheduler swaps the file atomically
    assert src.current() == "job-b"
    with open(p, "w") as fh:
        fh.write("job-c-longer\n")  # rewritten in place
    assert src.current() == "job-c-longer"
    p.unlink()
    assert src.current() is None


def test_fixed_job() -> None:
    assert FixedJob("j1").current() == "j1"
    assert FixedJob("").current() is None
