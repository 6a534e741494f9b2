"""The TD/N detector's parameters (Aegis §5.2; the rules are in processors/core/tdn.py)."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.errors import ConfigError

# §5.2's TD premise, an op ends at the same moment on every rank, holds for collectives
# whose work is even. A point-to-point op ends when its one peer is done: in a pipeline, the
# stage with the most work always waits least on its Send/Recv, and was isolated host by
# host, then rolled back. An all-to-all carries uneven, data-dependent loads (MoE experts):
# the hot experts' ranks arrive last by design, and ~200 GPUs were named. A slow GPU is
# still late in its data-parallel AllReduce. N is judged for all of them.
NO_TD_OPS = frozenset({"send", "recv", "sendrecv", "alltoall", "alltoallv"})


@dataclass(frozen=True, slots=True)
class TDNConfig:
    """Parameters of the §5.2 rules; seconds of event time."""

    alpha: float = 0.8  # TD(i,j,k) < alpha * TD(i,k): slow compute
    beta: float = 1.5  # N(i,j,k) > beta * N(i,k): slow network
    window_wrs: int = 5  # L, work requests in the plugin's N (reported in evidence)
    persist: int = 5  # consecutive violating evaluations before a rule fires
    persist_window_s: float = 10.0  # ... spanning at least this much event time
    min_ranks: int = 4  # fewer ranks with a value in an iteration: not compared
    # more ranks than this share (at least 1) short in one iteration: a mixed population
    # (slower hardware in part of the job, uneven work), not a straggler; nobody violates
    max_slow_share: float = 0.25
    # ... or short ranks on more than max(max_slow_hosts, max_slow_host_share of the
    # communicator's hosts) hosts: a stage or a rack, not a few stragglers (the guard's cap)
    max_slow_hosts: int = 2
    max_slow_host_share: float = 0.1
    # at least max(2, this share of a host's GPUs) short together, none a victim: the host is
    # named (isolate_host), not its GPUs one by one (0: never)
    host_rollup_share: float = 0.5
    seq_timeout_s: float = 5.0  # an incomplete iteration is evaluated after this long
    seq_bucket: int = 1  # launches compared together: 1 = exact iterations; raise it when the
    # plugin samples launches that are not aligned across hosts (seq // seq_bucket is the key)
    sweep_interval_s: float = 1.0  # how often timed-out iterations are looked for
    forget_s: float = 600.0  # a communicator with no report this long is dropped
    max_comms: int = 65536
    max_ops: int = 16  # collective kinds per communicator
    max_pending_seqs: int = 32  # buffered iterations per (communicator, op); oldest dropped
    max_peers: int = 64
    max_links: int = 8
    # scattered slow ranks on this many hosts behind one ToR (most of the slow hosts, and at
    # least switch_min_share of the ring's hosts behind it): NetDiag on the switch (0: never)
    switch_min_hosts: int = 3
    switch_min_share: float = 0.25

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1 or self.beta <= 1 or self.min_ranks < 2 or self.persist < 1 \
                or self.seq_bucket < 1 or not 0 < self.max_slow_share <= 1 \
                or not 0 <= self.host_rollup_share <= 1 or self.max_slow_hosts < 0 \
                or self.max_slow_host_share < 0 or self.switch_min_hosts < 0 \
                or not 0 <= self.switch_min_share <= 1:
            raise ConfigError("tdn: need 0 < alpha < 1, beta > 1, min_ranks >= 2, persist >= 1, "
                              "seq_bucket >= 1, 0 < max_slow_share <= 1, "
                              "0 <= host_rollup_share <= 1, max_slow_hosts and "
                              "max_slow_host_share >= 0, switch_min_hosts >= 0, "
                              "0 <= switch_min_share <= 1")
        if min(self.persist_window_s, self.seq_timeout_s, self.forget_s) < 0 or \
                self.sweep_interval_s <= 0 or min(self.max_comms, self.max_ops, self.max_peers,
                                                  self.max_links, self.max_pending_seqs) < 1:
            raise ConfigError("tdn: durations >= 0, sweep_interval_s > 0, limits >= 1")
