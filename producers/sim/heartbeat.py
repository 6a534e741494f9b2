"""Agent heartbeats on the logs topic, as producers/agent emits them.

Every host's agent sends ``LogRecord(source="agent", line="aegis-agent heartbeat seq=<n>")``
every ``period_s`` (seq from 1), so the logs topic's event time advances while a job is
quiet: the decision tree judges its settle window on log event time, and a host that stops
beating is dark (processors/core/tree_liveness.py). Only host_down and rack_power_loss stop an
agent (a GPU that fell off the bus does not): their hosts' lines, heartbeats included, are
dropped from the fault's start (LogQueue.go_dark). Hosts' phases are staggered deterministically (golden-ratio offsets).
"""

from __future__ import annotations

import numpy as np

from producers.sim.state import LogQueue

SOURCE = "agent"
GOLDEN = 0.6180339887498949


def heartbeat_line(seq: int) -> str:
    return f"aegis-agent heartbeat seq={seq}"


class Heartbeats:
    """Schedules each host's heartbeats due before the end of the current tick."""

    def __init__(self, n_hosts: int, start_ts: float, period_s: float) -> None:
        self.period = period_s
        offsets = period_s * ((np.arange(n_hosts) * GOLDEN) % 1.0)
        self.next_ts = start_ts + offsets
        self.seq = np.ones(n_hosts, dtype=np.int64)

    def schedule(self, until: float, logs: LogQueue) -> None:
        """Queue every heartbeat with ts < ``until`` not yet queued."""
        due = np.flatnonzero(self.next_ts < until)
        while len(due):
            for h, ts, seq in zip(due.tolist(), self.next_ts[due].tolist(),
                                  self.seq[due].tolist(), strict=True):
                logs.add(ts, h, SOURCE, heartbeat_line(seq))
            self.seq[due] += 1
            self.next_ts[due] += self.period
            due = due[self.next_ts[due] < until]
