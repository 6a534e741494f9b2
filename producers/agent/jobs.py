"""Where the agent learns which job runs on this host (records are keyed by job, or by host
when there is none: Kafka keeps a whole job in one partition).

Three sources: an environment variable (default ``AEGIS_JOB_ID``), a file the scheduler
writes (re-read whenever its inode, size or mtime changes; first non-empty line), or a fixed
label. An empty or unreadable source means "no job".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Protocol

MAX_JOB_LEN = 200


def clean_job(text: str | None) -> str | None:
    """First non-empty line, stripped and bounded; None when there is none."""
    if not text:
        return None
    for line in text.splitlines():
        line = line.strip()
        if line:
            return "".join(ch for ch in line[:MAX_JOB_LEN] if ch.isprintable()) or None
    return None


class JobSource(Protocol):
    def current(self) -> str | None: ...

    def describe(self) -> str: ...


class EnvJob:
    def __init__(self, var: str = "AEGIS_JOB_ID", environ: Mapping[str, str] | None = None) -> None:
        self.var = var
        self.environ = environ if environ is not None else os.environ

    def current(self) -> str | None:
        return clean_job(self.environ.get(self.var))

    def describe(self) -> str:
        return f"env {self.var}"


class FileJob:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._sig: tuple[int, int, int] | None = None
        self._job: str | None = None

    def current(self) -> str | None:
        try:
            st = os.stat(self.path)
        except OSError:
            self._sig, self._job = None, None
            return None
        sig = (st.st_ino, st.st_size, st.st_mtime_ns)
        if sig != self._sig:
            try:
                with open(self.path, encoding="utf-8", errors="replace") as fh:
                    self._job = clean_job(fh.read(4096))
            except OSError:
                self._job = None
            self._sig = sig
        return self._job

    def describe(self) -> str:
        return f"file {self.path}"


class FixedJob:
    def __init__(self, label: str | None) -> None:
        self.label = clean_job(label)

    def current(self) -> str | None:
        return self.label

    def describe(self) -> str:
        return f"fixed {self.label!r}"
