"""End-to-end fixtures: results printed at the end of the session (delay per scenario)."""

from __future__ import annotations

REPORT: list[str] = []


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    if REPORT:
        terminalreporter.section("aegis e2e: detection delay per scenario (event time)")
        for line in REPORT:
            terminalreporter.write_line(line)
