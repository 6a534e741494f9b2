"""What a non-fatal XID verdict means to the decision tree (NVIDIA's RESTART_APP).

NVIDIA's Xid catalogue rates many XIDs "restart the application": the driver contained the
error to the process that hit it (Xid 94, contained ECC, is the one operators most often
override to this; the shipped policy keeps it fatal, as Aegis Alg. 1 does). The policy says so
with a non-fatal ``severity`` and ``action = "restart_job"``. Two consequences:

- The application's own words for an ECC error (``CUDA error: uncorrectable ECC error
  encountered``) are its view of the driver's ECC XID. On a host that logged one, the line takes
  that XID's severity: an XID made non-fatal must not come back as a host-wide critical error
  through the application's message, which names no GPU.
- A contained XID that came before every distributed symptom is why the job broke: its process
  died, its peers hang on it. The tree restarts the job and isolates nothing (a ``config``
  diagnosis, so the guard also treats a later hang on that host as its consequence).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from processors.core.tree_events import HOST_SIDE, TreeEvent

# NVIDIA: XID 48 double-bit ECC, 94 contained and 95 uncontained uncorrectable ECC
ECC_XIDS = frozenset((48, 94, 95))
# the application's words for them: an ECC error, or CUDA's contained error (error 910,
# "Invalid access of peer GPU memory over nvlink or a hardware error")
APP_ECC_RULES = frozenset(("cuda_ecc_uncorrectable", "cuda_error_contained"))
_RANK = {"info": 0, "degraded": 1, "fatal": 2}


def app_ecc_follows_xid(events: Sequence[TreeEvent]) -> list[TreeEvent]:
    """``events`` with each application ECC line on a host that logged an ECC XID given the
    most severe of that host's ECC XIDs' severities, when that is not fatal."""
    worst: dict[str, str] = {}
    for e in events:
        if e.xid in ECC_XIDS and _RANK[e.sev] >= _RANK[worst.get(e.host, "info")]:
            worst[e.host] = e.sev
    return [replace(e, sev=worst[e.host])
            if e.rule in APP_ECC_RULES and worst.get(e.host, "fatal") != "fatal" else e
            for e in events]


def contained_xids(events: Sequence[TreeEvent]) -> list[TreeEvent]:
    """The non-fatal XIDs whose policy action is ``restart_job``, logged no later than the
    first distributed symptom (after it, an XID may be the hang's consequence)."""
    dist = [e.ts for e in events if e.cat == "distributed_symptom"]
    first = min(dist) if dist else float("inf")
    return [e for e in events if e.xid is not None and e.cat in HOST_SIDE and e.sev != "fatal"
            and e.action == "restart_job" and e.ts <= first]


def restart_summary(contained: Sequence[TreeEvent]) -> str:
    xids = ", ".join(sorted({f"XID {e.xid}" for e in contained}))
    return (f"{xids} on {len({e.host for e in contained})} host(s), contained to the process "
            f"(policy: restart_job): restart the job, no isolation")
