"""One settings object for the worker, the engine and replay: detector thresholds and the
service addresses, built from a TOML policy file, environment variables and flags.

Secrets (Redis password) are never printed: ``Settings.__repr__`` masks them.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from schemas.errors import ConfigError
from schemas.inventory import Inventory
from schemas.topics import CCL, COMMANDS, DEADLETTER, DIAGNOSES, LOGS, TELEMETRY

# policy-file table -> (module, config class); every field of the class can be set
_SECTIONS = {
    "input": ("processors.core.job_clock", "InputConfig"),
    "tree": ("processors.core.decision_tree", "DecisionTreeConfig"),
    "zscore": ("processors.core.zscore", "ZScoreConfig"),
    "liveness": ("processors.core.telemetry_liveness", "LivenessConfig"),
    "alignment": ("processors.core.alignment", "AlignmentConfig"),
    "tdn": ("processors.core.tdn", "TDNConfig"),
    "guard": ("sinks.guard", "GuardConfig"),
}
_DETECTOR_SECTION = {"DecisionTree": "tree", "ZScoreDetector": "zscore",
                     "TelemetryLiveness": "liveness",
                     "AlignmentDetector": "alignment", "TDNDetector": "tdn"}


def _config_class(section: str) -> Any:
    import importlib

    module, name = _SECTIONS[section]
    return getattr(importlib.import_module(module), name)


@dataclass
class PipelineConfig:
    """Thresholds of every detector and of the guard. Unset sections use their defaults."""

    sections: dict[str, Any] = field(default_factory=dict)
    xid_policy_path: str | None = None

    def section(self, name: str) -> Any:
        if name not in self.sections:
            self.sections[name] = _config_class(name)()
        return self.sections[name]

    def _kwargs(self, fn: Any, inventory: Inventory | None) -> dict[str, Any]:
        params = inspect.signature(fn).parameters
        kw: dict[str, Any] = {}
        if "inventory" in params:
            kw["inventory"] = inventory
        if "policy" in params and self.xid_policy_path:
            from processors.core.xid_policy import XidPolicy

            kw["policy"] = XidPolicy.load(self.xid_policy_path)
        return kw

    def build(self, cls: Any, job: str, inventory: Inventory | None) -> Any:
        cfg = self.section(_DETECTOR_SECTION[cls.__name__])
        return cls(job, cfg, **self._kwargs(cls, inventory))

    def restore(self, cls: Any, state: Any, job: str, inventory: Inventory | None) -> Any:
        cfg = self.section(_DETECTOR_SECTION[cls.__name__])
        return cls.restore(state, job, cfg, **self._kwargs(cls.restore, inventory))

    @classmethod
    def from_toml(cls, path: str | None) -> PipelineConfig:
        """Load a policy file: tables [input] [tree] [zscore] [liveness] [alignment] [tdn]
        [guard], and
        ``xid_policy = "file.toml"`` at the top level. Unknown keys are errors."""
        if not path:
            return cls()
        try:
            with open(path, "rb") as fh:
                doc = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"policy file {path}: {e}") from e
        out = cls()
        xid = doc.pop("xid_policy", None)
        if xid is not None:
            out.xid_policy_path = os.path.join(os.path.dirname(os.path.abspath(path)), str(xid))
        for name, values in doc.items():
            if name not in _SECTIONS or not isinstance(values, dict):
                raise ConfigError(f"policy file {path}: unknown table [{name}] "
                                  f"(known: {', '.join(_SECTIONS)})")
            klass = _config_class(name)
            known = {f.name for f in dataclasses.fields(klass)}
            bad = sorted(set(values) - known)
            if bad:
                raise ConfigError(f"policy file {path}: [{name}] has unknown keys {bad} "
                                  f"(known: {sorted(known)})")
            try:
                out.sections[name] = klass(**values)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"policy file {path}: [{name}]: {e}") from e
        return out


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def mask_url(url: str) -> str:
    """redis://:secret@host:6379/0 -> redis://:***@host:6379/0"""
    parts = urlsplit(url)
    if parts.password:
        user = parts.username or ""
        netloc = f"{user}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


@dataclass
class Settings:
    """Service addresses and names; env AEGIS_* provide defaults, flags override."""

    brokers: str = field(default_factory=lambda: _env("AEGIS_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    redis_url: str = field(default_factory=lambda: _env("AEGIS_REDIS_URL", "redis://127.0.0.1:6379/0"))
    cluster: str = field(default_factory=lambda: _env("AEGIS_CLUSTER", "default"))
    app_id: str = field(default_factory=lambda: _env("AEGIS_APP_ID", "aegis-worker"))
    topic_logs: str = LOGS.name
    topic_telemetry: str = TELEMETRY.name
    topic_ccl: str = CCL.name
    topic_diagnoses: str = DIAGNOSES.name
    topic_commands: str = COMMANDS.name
    topic_deadletter: str = DEADLETTER.name
    partitions: int = 12
    metrics_port: int = field(default_factory=lambda: int(_env("AEGIS_METRICS_PORT", "9464")))
    checkpoint_every_s: float = 10.0
    policy: str | None = field(default_factory=lambda: os.environ.get("AEGIS_POLICY"))
    inventory: str | None = field(default_factory=lambda: os.environ.get("AEGIS_INVENTORY"))
    # Faust's local folder (its version marker; tables live in Kafka changelogs, memory://):
    # None = Faust's default, ``{app_id}-data`` in the current directory
    data_dir: str | None = field(default_factory=lambda: os.environ.get("AEGIS_DATA_DIR"))

    def __repr__(self) -> str:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["redis_url"] = mask_url(self.redis_url)
        return "Settings(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"

    def with_topic_prefix(self, prefix: str) -> Settings:
        """Every topic name with a prefix (tests and side-by-side deployments)."""
        return dataclasses.replace(self, **{
            f.name: prefix + getattr(self, f.name)
            for f in dataclasses.fields(self) if f.name.startswith("topic_")})
