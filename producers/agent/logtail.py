"""Follow the kernel log and training logs; forward the interesting lines (Aegis §4.1: the
decision tree starts from training logs and kernel errors such as Xid, NCCL and timeouts).

* kernel: ``/dev/kmsg`` (non-blocking, from the end), else a text file such as
  /var/log/kern.log, else ``journalctl -f -k -o short-iso``;
* training logs: files; a line mentioning NCCL is source "nccl", others "training".

Files survive rotation (inode changed: finish the old file, then read the new one from its
start) and truncation (size below our offset: restart at 0). A partial last line waits for
its newline; a line longer than ``max_line`` bytes is cut and marked. Only lines matching the
prefilter, or that the worker's classifier would place in a category (not ``other``), are
forwarded: the regex is quick, the classifier makes sure no rule's line is left behind.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Sequence

from processors.core.log_classifier import classify
from producers.agent.collector import LogLine, Notices, Partial

DEFAULT_PREFILTER = (
    r"Xid|NVRM|NCCL WARN|NCCL ERROR|Watchdog|\bAER\b|PCIe|\bECC\b|mlx5|"
    r"(?i:timeout|timed out|error|fail|fault|nvlink|link (?:is )?down|connection reset|"
    r"traceback|exception|hung task|out of memory|oom-kill|segfault|call trace|abort)"
)
MAX_LINE = 8192
READ_BUDGET = 1 << 20  # bytes per file per poll; the rest waits for the next poll
TRUNCATED = " [truncated by aegis-agent]"


class LineSplitter:
    """Bytes in, complete lines out; partial tails wait, over-long lines are cut once."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self.buf = bytearray()
        self.skipping = False

    def feed(self, data: bytes) -> list[str]:
        self.buf += data
        out: list[str] = []
        while True:
            i = self.buf.find(b"\n")
            if i < 0:
                break
            raw = bytes(self.buf[:i])
            del self.buf[: i + 1]
            if self.skipping:
                self.skipping = False
                continue
            out.append(_decode(raw, self.max_line))
        if len(self.buf) > self.max_line:
            out.append(_decode(bytes(self.buf[: self.max_line]), self.max_line) + TRUNCATED)
            self.buf.clear()
            self.skipping = True
        return out

    def finish(self) -> list[str]:
        """The file ended for good (rotated away): its partial last line is complete."""
        rest = b"" if self.skipping else bytes(self.buf)
        self.buf.clear()
        self.skipping = False
        return [_decode(rest, self.max_line)] if rest.strip() else []


def _decode(raw: bytes, max_line: int) -> str:
    text = raw[:max_line].decode("utf-8", "replace").rstrip("\r")
    return text + (TRUNCATED if len(raw) > max_line else "")


class FileFollower:
    """``tail -F`` for one file, polled. Starts at the end unless ``from_start``."""

    def __init__(self, path: str | os.PathLike[str], notices: Notices | None = None,
                 from_start: bool = False, max_line: int = MAX_LINE) -> None:
        self.path = os.fspath(path)
        self.notices = notices or Notices()
        self.from_start = from_start
        self.max_line = max_line
        self._fd = -1
        self._first = True  # a file present at start is read from its end, a later one from 0
        self.ino = -1
        self.pos = 0
        self.splitter = LineSplitter(max_line)

    def _open(self, at_end: bool) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            self.notices.once(f"log:missing:{self.path}", f"log {self.path} not found (waiting for it)")
            return False
        except OSError as e:
            self.notices.once(f"log:open:{self.path}", f"log {self.path}: cannot open: {e.strerror}")
            return False
        self.notices.clear(f"log:missing:{self.path}")
        self.notices.clear(f"log:open:{self.path}")
        st = os.fstat(fd)
        self._fd, self.ino = fd, st.st_ino
        self.pos = st.st_size if at_end else 0
        self.splitter = LineSplitter(self.max_line)
        return True

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1

    def _drain(self, budget: int) -> tuple[list[str], int]:
        out: list[str] = []
        while budget > 0:
            try:
                data = os.pread(self._fd, min(65536, budget), self.pos)
            except OSError:
                break
            if not data:
                break
            self.pos += len(data)
            budget -= len(data)
            out += self.splitter.feed(data)
        return out, budget

    def poll(self) -> list[str]:
        if self._fd < 0:
            at_end = self._first and not self.from_start
            self._first = False
            if not self._open(at_end=at_end):
                return []
        try:
            size = os.fstat(self._fd).st_size
        except OSError:
            size = self.pos
        if size < self.pos:  # truncated (copytruncate): start over
            self.pos = 0
            self.splitter = LineSplitter(self.max_line)
        lines, budget = self._drain(READ_BUDGET)
        if budget <= 0:
            return lines  # more to read; rotation is checked once we are at the end
        try:
            ino = os.stat(self.path).st_ino
        except OSError:
            return lines  # renamed away and not recreated yet: keep the old file
        if ino != self.ino:  # rotated: old file is finished, read the new one from 0
            lines += self.splitter.finish()
            self._close()
            if self._open(at_end=False):
                more, _ = self._drain(budget)
                lines += more
        return lines

    def close(self) -> None:
        self._close()


def parse_kmsg_record(record: str, boot_wall: float) -> tuple[float, str] | None:
    """``"6,812,5531201,-;NVRM: Xid ..."`` → (wall time, message); None if malformed."""
    header, sep, body = record.partition(";")
    if not sep:
        return None
    fields = header.split(",")
    if len(fields) < 3 or not fields[2].isdigit():
        return None
    message = body.split("\n", 1)[0]
    return boot_wall + int(fields[2]) / 1e6, message


class KmsgFollower:
    """Non-blocking reader of /dev/kmsg: one record per read(), from the end of the ring."""

    def __init__(self, path: str = "/dev/kmsg", notices: Notices | None = None) -> None:
        self.path = path
        self.notices = notices or Notices()
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(self.fd, 0, os.SEEK_END)
        self.boot_wall = time.time() - time.monotonic()

    def poll(self, now: float, limit: int = 5000) -> list[tuple[float, str]]:
        out: list[tuple[float, str]] = []
        for _ in range(limit):
            try:
                data = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:  # EPIPE: the ring overwrote records we had not read
                self.notices.once("kmsg:overrun", "kernel log: ring buffer overran, lines lost")
                continue
            except OSError as e:
                self.notices.once("kmsg:read", f"kernel log: read failed: {e.strerror}")
                break
            if not data:
                break
            rec = parse_kmsg_record(data.decode("utf-8", "replace"), self.boot_wall)
            if rec is not None:
                out.append((min(rec[0], now), rec[1][:MAX_LINE]))
        return out

    def close(self) -> None:
        os.close(self.fd)


class JournalFollower:
    """``journalctl -f -k -o short-iso`` as a child process, read without blocking."""

    def __init__(self, notices: Notices | None = None) -> None:
        self.notices = notices or Notices()
        self.proc = subprocess.Popen(
            ["journalctl", "-f", "-k", "-o", "short-iso", "-n", "0", "--no-pager"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        self.fd = self.proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.splitter = LineSplitter()

    def poll(self) -> list[str]:
        out: list[str] = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not data:
                self.notices.once("journal:eof", "kernel log: journalctl exited")
                break
            out += self.splitter.feed(data)
        # "2024-05-01T10:00:00+0000 host kernel: NVRM: Xid ..." -> the message
        return [ln.split(" kernel: ", 1)[1] if " kernel: " in ln else ln for ln in out]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()


KernelSource = KmsgFollower | FileFollower | JournalFollower


def open_kernel_log(path: str | None, notices: Notices) -> KernelSource | None:
    """The given path (char device → kmsg reader, else a followed file), or the first that
    works of /dev/kmsg, /var/log/kern.log, /var/log/messages, journalctl."""
    if path:
        try:
            if stat.S_ISCHR(os.stat(path).st_mode):
                return KmsgFollower(path, notices)
        except OSError:
            pass
        return FileFollower(path, notices)
    reasons = []
    try:
        return KmsgFollower("/dev/kmsg", notices)
    except OSError as e:
        reasons.append(f"/dev/kmsg: {e.strerror}")
    for candidate in ("/var/log/kern.log", "/var/log/messages"):
        if os.access(candidate, os.R_OK):
            return FileFollower(candidate, notices)
        reasons.append(f"{candidate}: not readable")
    if shutil.which("journalctl"):
        try:
            return JournalFollower(notices)
        except OSError as e:
            reasons.append(f"journalctl: {e.strerror}")
    notices.once("kernel:none", "kernel log not available: " + "; ".join(reasons))
    return None


class LogTailer:
    """The log collector: kernel log plus training log files, prefiltered."""

    name = "logs"

    def __init__(self, kernel: KernelSource | None, files: Sequence[str] = (),
                 prefilter: str | None = DEFAULT_PREFILTER, notices: Notices | None = None,
                 max_lines: int = 2000, classified: bool = True) -> None:
        """``classified``: also send a line the prefilter misses when the classifier
        (``processors.core.log_classifier``) gives it a category, so a rule's line is never
        dropped at the host (audit 6: the regex alone lost 32 of 396 real fault lines)."""
        self.notices = notices or Notices()
        self.kernel = kernel
        self.files = [FileFollower(f, self.notices) for f in files]
        self.prefilter = re.compile(prefilter) if prefilter else None
        self.classified = classified
        self.max_lines = max_lines
        self.suppressed = 0  # lines over max_lines in one collection (a log storm)

    def _keep(self, line: str) -> bool:
        if not line.strip():
            return False
        if self.prefilter is None or self.prefilter.search(line):
            return True
        return self.classified and classify(line).category != "other"

    def collect(self, now: float) -> Partial:
        out = Partial()
        kept: list[LogLine] = []
        if isinstance(self.kernel, KmsgFollower):
            kept += [LogLine(ts, "kernel", ln) for ts, ln in self.kernel.poll(now) if self._keep(ln)]
        elif self.kernel is not None:
            kept += [LogLine(now, "kernel", ln) for ln in self.kernel.poll() if self._keep(ln)]
        for f in self.files:
            kept += [LogLine(now, "nccl" if "NCCL" in ln else "training", ln)
                     for ln in f.poll() if self._keep(ln)]
        if len(kept) > self.max_lines:
            self.suppressed += len(kept) - self.max_lines
            self.notices.once("logs:storm", f"log storm: over {self.max_lines} matching lines "
                              "in one interval; the excess is counted, not sent")
            kept = kept[: self.max_lines]
        out.logs = kept
        return out

    def close(self) -> None:
        if self.kernel is not None:
            self.kernel.close()
        for f in self.files:
            f.close()
