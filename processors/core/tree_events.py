"""What the Phase 1 decision tree (:mod:`processors.core.decision_tree`) reasons about: its
configuration, the classified log events it keeps, and which categories and rules count as
host-side, host-wide, triggers, evidence and connection failures (Aegis Algorithm 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from processors.core.log_classifier import LogEvent
from schemas.errors import ConfigError

HOST_WIDE = frozenset(("nic_or_link", "pcie", "nvlink", "host_hw"))
# config errors an update typically causes
UPDATE_RULES = frozenset(("nccl_version_mismatch", "nvml_driver_mismatch"))
HOST_SIDE = frozenset(("critical_gpu", "nvlink", "pcie", "nic_or_link", "host_hw"))
# distributed symptoms that are the reporting host's own HCA event (IBV_EVENT_PORT_ERR, a
# work queue error): evidence against that end of a link, not a lost connection
LOCAL_HCA_RULES = frozenset(("nccl_ib_async_event",))
# a scheduler or runtime saying the *peer* it names is down (Slurm's "Node failure on X",
# Ray's "marked dead"): the reporter only lost that node, the named end is at fault
PEER_DOWN_RULES = frozenset(("slurm_node_failure", "ray_node_dead"))
# failed connections whose cause is the reporting host's configuration (IB completion error 4,
# local protection: ACS or the IOMMU in GPUDirect RDMA's way): ConfigCheck's evidence
LOCAL_CONFIG_RULES = frozenset(("nccl_ib_local_protection_error",))
# distributed symptoms that are a connection's own failure (nccl_* / dist_* rules, suffix)
CONNECTION_RULES = frozenset(("connection_reset", "connection_closed", "ib_completion_error",
                               "ib_local_protection_error",
                               "remote_error", "broken_pipe", "socket_io_failed", "connect_failed",
                               "retry_exceeded"))


@dataclass
class DecisionTreeConfig:
    settle_s: float = 5.0  # judge a burst this long (event time) after its first trigger
    quiet_s: float = 60.0  # an incident ends after this long without a new symptom
    # after a host-side finding, distributed symptoms (NCCL/PyTorch timeouts, resets) this
    # long after it are its consequences, not new incidents: watchdogs fire 10-30 min late
    absorb_s: float = 1800.0
    lookback_s: float = 30.0  # degraded host events this old still join a new burst
    # OfflineDiag is the last resort (Aegis Alg. 1, after Phase 2): a burst the logs cannot
    # localise waits this long, so the CCL detectors can name the culprit first and the
    # guard refuses the offline test as already_localised (also when the logs topic is
    # consumed ahead of the CCL topic); a finding that arrives meanwhile takes precedence
    offline_wait_s: float = 120.0
    # "errors between 2 hosts" (isolate both) in a job of more hosts waits this long after
    # the first trigger: the first of a crashed host's peers often reports seconds before the
    # rest, and only the rest show which end is the root (RootDiag)
    pair_settle_s: float = 15.0
    # a rank that times out aborts: a connection failure naming a host whose own watchdog
    # timeout came up to this long before it is that teardown, not a culprit (0: off)
    teardown_s: float = 30.0
    max_lateness_s: float = 300.0  # older records are rejected as late
    max_burst_events: int = 5000
    evidence_lines: int = 5
    root_min_share: float = 0.5  # RootDiag: the centre touches at least this share of edges
    config_majority: float = 0.5  # ConfigCheck: share of the job's hosts for "systemic"
    # NetDiag on a switch: NIC faults logged by this many hosts behind one ToR, most of the
    # hosts with NIC faults and this share of the job's hosts behind it (0: never)
    switch_min_hosts: int = 3
    switch_min_share: float = 0.25
    # a host whose agent was heard beating and then wrote nothing for max(dark_s, 3 beats),
    # within dark_recent_s of the verdict, is down; failed connections that all touch such
    # hosts name every one of them (RootDiag:dark_hosts; 0: off)
    dark_s: float = 15.0
    dark_recent_s: float = 300.0
    line_chars: int = 300

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"[tree] {f.name}={v!r}: not a finite number >= 0")


@dataclass(frozen=True, slots=True)
class TreeEvent:
    """One classified log line the tree keeps (a trigger or evidence), as a flat tuple."""

    ts: float
    host: str
    cat: str
    sev: str
    rule: str
    xid: int | None
    gpu: int | None
    peer: str | None
    peer_rank: int | None
    rank: int | None
    device: str | None
    action: str
    line: str
    waited: float | None = None  # a timeout's waiting time: the operation began at ts - waited

    @property
    def host_fatal(self) -> bool:
        return self.cat in HOST_SIDE and self.sev == "fatal"

    @property
    def began(self) -> float:
        """When what this line reports began: a timed-out operation's start, else the line."""
        return self.ts - self.waited if self.waited else self.ts


def is_config(e: TreeEvent) -> bool:
    """A configuration error, or a failed connection whose cause is the reporter's config."""
    return e.cat == "config" or e.rule in LOCAL_CONFIG_RULES


def names_peer(e: TreeEvent) -> bool:
    """A distributed symptom that names the other end, or is a connection's own failure."""
    return (e.peer is not None or e.peer_rank is not None
            or e.rule.split("_", 1)[-1] in CONNECTION_RULES)


# the c10d store and rendezvous on rank 0's host (MASTER_ADDR:MASTER_PORT), which every rank
# of the job connects to: a failure there is not a link between two hosts
STORE_MARKS = ("TCPStore", "SocketImpl", "socket.cpp", "should dump", "endezvous",
               "store based barrier", "DistStoreError", "client socket")


def via_store(e: TreeEvent) -> bool:
    """A distributed symptom on the job's store or rendezvous connection (every rank has one
    to rank 0's host), not on a connection between two ranks."""
    return e.cat == "distributed_symptom" and any(k in e.line for k in STORE_MARKS)


def tree_event(ts: float, host: str, e: LogEvent, line: str) -> TreeEvent:
    """What the tree keeps of a classified line. A failed store or rendezvous connection
    (not a timeout) is evidence only: every restart resets the store."""
    ev = TreeEvent(ts, host, e.category, e.severity, e.rule, e.xid, e.gpu, e.peer, e.peer_rank,
                   e.rank, e.device, e.action, line, e.waited_s)
    if via_store(ev) and not ev.rule.endswith("_timeout"):
        return replace(ev, sev="degraded")
    return ev


def is_trigger(e: LogEvent) -> bool:
    if e.severity != "fatal":
        return False
    return e.category in HOST_SIDE or e.category in ("distributed_symptom", "config", "cuda_app_error")


def is_evidence(e: LogEvent) -> bool:
    return e.severity == "degraded" and e.category in (*HOST_SIDE, "distributed_symptom", "config")
