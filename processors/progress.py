"""A small progress line on stderr for long work (no dependency; quiet when not a TTY
unless forced)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, total: int | None = None, *, enabled: bool | None = None,
                 every_s: float = 0.5) -> None:
        self.label, self.total = label, total
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.every_s = every_s
        self._t0 = time.monotonic()
        self._last = 0.0
        self.count = 0

    def update(self, count: int, extra: str = "") -> None:
        self.count = count
        now = time.monotonic()
        if not self.enabled or now - self._last < self.every_s:
            return
        self._last = now
        self._draw(extra)

    def _draw(self, extra: str) -> None:
        elapsed = time.monotonic() - self._t0
        rate = self.count / elapsed if elapsed > 0 else 0.0
        if self.total:
            frac = min(1.0, self.count / self.total)
            bar = "#" * int(frac * 30)
            text = f"{self.label} [{bar:<30}] {self.count}/{self.total} ({rate:,.0f}/s) {extra}"
        else:
            text = f"{self.label} {self.count:,} ({rate:,.0f}/s) {extra}"
        sys.stderr.write("\r" + text[:150].ljust(80))
        sys.stderr.flush()

    def done(self, extra: str = "") -> None:
        if self.enabled:
            self._draw(extra)
            sys.stderr.write("\n")
            sys.stderr.flush()
