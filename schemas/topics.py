"""The topic catalogue. Every detector compares the hosts of one job, so input topics are
keyed by job (host when a record has no job) and a whole job lands in one partition.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    record: str
    encoding: str  # msgpack | json
    key: str
    partitions: int
    retention_ms: int
    compacted: bool = False
    why: str = ""


HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS

TELEMETRY = Topic("aegis.telemetry", "TelemetryBatch", "msgpack", "job or host", 12, 3 * DAY_MS,
                  why="Z-score compares the hosts of a job: the whole job in one partition")
LOGS = Topic("aegis.logs", "LogRecord", "msgpack", "job or host", 12, 7 * DAY_MS,
             why="the decision tree clusters symptoms across the job's hosts")
CCL = Topic("aegis.ccl", "CCLRecord", "msgpack", "job or host", 12, 3 * DAY_MS,
            why="CL/WR/WC alignment compares the ranks of a communicator, all inside one job")
DIAGNOSES = Topic("aegis.diagnoses", "Diagnosis", "json", "job", 12, 30 * DAY_MS,
                  why="platform teams and replay read one job's findings in order")
COMMANDS = Topic("aegis.commands", "IsolationCommand", "json", "job", 12, 30 * DAY_MS,
                 why="an audit copy of every command sent to the Redis queue")
DEADLETTER = Topic("aegis.deadletter", "DeadLetter", "json", "source topic", 3, 14 * DAY_MS,
                   why="bad input kept with its raw bytes and reason for inspection")

AGENT_COMMANDS = Topic("aegis.agent-commands", "CbdRequest", "json", "host", 12, DAY_MS,
                       why="requests (CBD runs) addressed to one host's agent")
CBD_RESULTS = Topic("aegis.cbd-results", "CbdHostResult", "json", "batch", 3, 30 * DAY_MS,
                    why="a batch's per-host results gathered by one coordinator")

ALL = (TELEMETRY, LOGS, CCL, DIAGNOSES, COMMANDS, DEADLETTER)
CBD = (AGENT_COMMANDS, CBD_RESULTS)
INPUTS = (TELEMETRY, LOGS, CCL)
