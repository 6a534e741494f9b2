"""The XID policy: what each NVIDIA XID means to the decision tree (Aegis Phase 1, CriticalError).

The default table, ``xid_policy.toml`` next to this module, covers NVIDIA's XID catalogue and
cites its sources. Aegis' ECC rule is the default: XID 48, 94 and 95 are fatal; 63, 64 and 92
are not (treating them as critical wrecks utilisation). An operator file given to
:meth:`XidPolicy.load` is merged over the default one key at a time, so it only needs the
entries it changes::

    [xid.94]            # follow NVIDIA: contained ECC only restarts the application
    severity = "degraded"
    action = "restart_job"

Bad files raise :class:`~schemas.errors.ConfigError` naming the file, the table and the value.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from schemas.errors import ConfigError

DEFAULT_POLICY_PATH = str(Path(__file__).with_name("xid_policy.toml"))
CATEGORIES = ("critical_gpu", "benign_gpu", "nvlink", "pcie", "nic_or_link", "host_hw",
              "distributed_symptom", "cuda_app_error", "config", "other")
SEVERITIES = ("fatal", "degraded", "info")
XID_ACTIONS = ("isolate_gpu", "isolate_host", "restart_job", "none")
_FIELDS = ("category", "severity", "action", "description", "nvidia_action", "note")
_CHOICES = {"category": CATEGORIES, "severity": SEVERITIES, "action": XID_ACTIONS}
MAX_XID = 4095


@dataclass(frozen=True, slots=True)
class XidRule:
    """One XID's meaning. ``xid`` is None for the fallback of XIDs the policy does not list."""

    xid: int | None
    category: str
    severity: str
    action: str
    description: str = ""
    nvidia_action: str = ""
    note: str = ""

    @property
    def fatal(self) -> bool:
        return self.severity == "fatal"


def _check_entry(where: str, entry: Any) -> dict[str, Any]:
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: not a table (got {type(entry).__name__})")
    bad = sorted(set(entry) - set(_FIELDS))
    if bad:
        raise ConfigError(f"{where}: unknown keys {bad} (known: {list(_FIELDS)})")
    out: dict[str, Any] = {}
    for key, value in entry.items():
        if not isinstance(value, str):
            raise ConfigError(f"{where}.{key}={value!r}: not a string")
        if key in _CHOICES and value not in _CHOICES[key]:
            raise ConfigError(f"{where}.{key}={value!r}: not one of {list(_CHOICES[key])}")
        out[key] = value
    return out


class XidPolicy:
    """XID number → :class:`XidRule`, with a fallback for XIDs not listed."""

    __slots__ = ("default", "rules", "sources")

    def __init__(self, rules: Mapping[int, XidRule], default: XidRule,
                 sources: tuple[str, ...] = ()) -> None:
        self.rules = dict(rules)
        self.default = default
        self.sources = sources

    def lookup(self, xid: int) -> XidRule:
        rule = self.rules.get(xid)
        return rule if rule is not None else replace(self.default, xid=xid)

    def is_fatal(self, xid: int) -> bool:
        return self.lookup(xid).fatal

    def merged(self, doc: Mapping[str, Any], where: str) -> XidPolicy:
        """A new policy: this one with the tables of ``doc`` ([default], [xid.N]) laid over it."""
        bad = sorted(set(doc) - {"default", "xid"})
        if bad:
            raise ConfigError(f"{where}: unknown tables {bad} (known: ['default', 'xid'])")
        default = self.default
        if "default" in doc:
            default = replace(default, **_check_entry(f"{where} [default]", doc["default"]))
        rules = dict(self.rules)
        xids = doc.get("xid", {})
        if not isinstance(xids, Mapping):
            raise ConfigError(f"{where}: 'xid' must be a table of [xid.N] tables")
        for key, entry in xids.items():
            try:
                xid = int(key)
            except (TypeError, ValueError):
                raise ConfigError(f"{where} [xid.{key}]: XID must be an integer") from None
            if not 0 <= xid <= MAX_XID:
                raise ConfigError(f"{where} [xid.{key}]: XID out of range 0..{MAX_XID}")
            fields = _check_entry(f"{where} [xid.{key}]", entry)
            base = rules.get(xid)
            if base is None:  # a new XID starts from [default]
                base = replace(default, xid=xid, description="", nvidia_action="", note="")
            rules[xid] = replace(base, xid=xid, **fields)
        return XidPolicy(rules, default, self.sources + (where,))

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any], where: str = "<policy>") -> XidPolicy:
        """A policy from one parsed document that must define [default] itself."""
        if "default" not in doc:
            raise ConfigError(f"{where}: missing [default] table")
        d = _check_entry(f"{where} [default]", doc["default"])
        missing = [k for k in ("category", "severity", "action") if k not in d]
        if missing:
            raise ConfigError(f"{where} [default]: missing keys {missing}")
        empty = cls({}, XidRule(None, d["category"], d["severity"], d["action"]))
        return empty.merged(doc, where)

    @classmethod
    def load(cls, path: str | None = None) -> XidPolicy:
        """The default policy, with the operator file at ``path`` (if any) merged over it."""
        base = default_policy()
        if not path:
            return base
        return base.merged(_read_toml(path), path)


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as e:
        raise ConfigError(f"XID policy {path}: cannot read ({e.strerror or e})") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"XID policy {path}: not valid TOML ({e})") from e


@functools.cache
def default_policy() -> XidPolicy:
    """The shipped policy, parsed once per process."""
    return XidPolicy.from_mapping(_read_toml(DEFAULT_POLICY_PATH), DEFAULT_POLICY_PATH)
