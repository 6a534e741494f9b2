"""CBD settings and the baseline file.

Every field of :class:`CbdConfig` can be set from a TOML or JSON file (``aegis cbd --config``);
unknown keys are refused, naming the file and the key. Defaults follow Aegis §6 (CBD): the
mass-failure share is 0.5 ("if many hosts fail at once, roll back the recent update").

The baseline file (``--baseline``) is JSON ``{metric: value}`` with the metrics of
:data:`BASELINE_METRICS`; ``aegis cbd --save-baseline FILE`` writes the batch medians of a
healthy run in that format.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.errors import ConfigError

# metric -> what it is (all "higher is better")
BASELINE_METRICS = {
    "cpu_gflops": "numpy float32 matmul GFLOP/s of one host",
    "mem_copy_gbps": "numpy copy bandwidth, GB/s (read+write)",
    "read_mbps": "sequential read speed of the configured paths, MB/s",
    "gpu_tflops": "torch bf16 matmul TFLOP/s of one GPU",
    "gpu_hbm_gbps": "device-to-device copy GB/s of one GPU",
    "gpu_pcie_gbps": "pinned host-to-device copy GB/s of one GPU",
    "gpu_nvlink_gbps": "peer-to-peer copy GB/s between two GPUs of a host",
    "link_gbps": "one directed host-to-host TCP link, Gbit/s",
    "busbw_gbps": "collective bus bandwidth (nccl-tests convention), GB/s",
}


@dataclass
class CbdConfig:
    """Thresholds and requirements. Ratios are fractions of the batch median or baseline."""

    # verdicts (Aegis §6: mass failure -> roll back, do not isolate everyone)
    mass_share: float = 0.5
    mass_min_hosts: int = 2
    hold_on_error: bool = True
    # configuration checks
    required_env: list[str] = field(default_factory=list)
    expected_env: dict[str, str] = field(default_factory=dict)
    env_prefixes: list[str] = field(default_factory=lambda: ["NCCL_", "UCX_", "MLX5_"])
    env_may_differ: list[str] = field(default_factory=lambda: [
        "NCCL_DEBUG_FILE", "NCCL_HOSTID", "NCCL_COMM_ID", "NCCL_TOPO_DUMP_FILE"])
    gpus_per_host: int | None = None
    require_persistence: bool = True
    require_ecc: bool = True
    require_default_route: bool = True
    pcie_gpu_speed_strict: bool = False  # GPUs lower PCIe speed when idle; width always counts
    pcie_ignore: list[str] = field(default_factory=list)  # bus ids narrower by design
    # single-host checks
    xid_window_s: float = 86400.0
    compute_ratio: float = 0.7
    baseline_ratio: float = 0.8
    read_paths: list[str] = field(default_factory=list)
    read_mb: int = 256
    read_min_mbps: float | None = None
    # probe mesh (UDP/TCP, several sizes: Aegis Alg. 1 OfflineDiag, the >1 KB loss case)
    probe_sizes: list[int] = field(default_factory=list)  # empty: derived from path MTU
    loss_ratio: float = 0.1
    loss_min_lost: int = 2
    full_mesh_max: int = 32
    # bandwidth (probe mesh rounds and collective links): "far below the batch median"
    link_ratio: float = 0.3
    busbw_ratio: float = 0.7
    # collective drivers
    all_reduce_perf: str = "all_reduce_perf"
    mpirun: str = "mpirun"
    mpirun_args: list[str] = field(default_factory=lambda: ["--allow-run-as-root"])
    port: int = 0  # probe/collective port on every host; 0: pick one per run
    python: str = ""  # interpreter on the hosts; empty: this one

    @classmethod
    def from_mapping(cls, doc: dict[str, Any], where: str = "<config>") -> CbdConfig:
        known = {f.name: f for f in dataclasses.fields(cls)}
        for k in doc:
            if k not in known:
                raise ConfigError(f"{where}: unknown CBD setting {k!r} (known: "
                                  f"{', '.join(sorted(known))})")
        cfg = cls(**doc)
        cfg.validate(where)
        return cfg

    @classmethod
    def load(cls, path: str | None) -> CbdConfig:
        if not path:
            return cls()
        return cls.from_mapping(_read_doc(path), path)

    def validate(self, where: str = "<config>") -> None:
        if not 0 < self.mass_share <= 1:
            raise ConfigError(f"{where}: mass_share={self.mass_share} not in (0, 1]")
        for name in ("compute_ratio", "baseline_ratio", "loss_ratio", "link_ratio",
                     "busbw_ratio"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not 0 < v <= 1:
                raise ConfigError(f"{where}: {name}={v!r} not in (0, 1]")
        if any(not isinstance(s, int) or not 28 < s <= 65535 for s in self.probe_sizes):
            raise ConfigError(f"{where}: probe_sizes={self.probe_sizes} must be packet sizes "
                              "in bytes (29..65535)")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"{where}: port={self.port} not a port number")


def _read_doc(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e}") from e
    try:
        doc = json.loads(text) if path.endswith(".json") else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: not valid {'JSON' if path.endswith('.json') else 'TOML'}: "
                          f"{e}") from e
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: top level is not a table")
    return doc.get("cbd", doc) if isinstance(doc.get("cbd"), dict) else doc


def load_baseline(path: str | None) -> dict[str, float]:
    """``{metric: value}``; unknown metrics or non-numbers are refused."""
    if not path:
        return {}
    doc = _read_doc(path)
    out: dict[str, float] = {}
    for k, v in doc.items():
        if k not in BASELINE_METRICS:
            raise ConfigError(f"{path}: unknown baseline metric {k!r} "
                              f"(known: {', '.join(BASELINE_METRICS)})")
        if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
            raise ConfigError(f"{path}: baseline {k}={v!r} is not a positive number")
        out[k] = float(v)
    return out
