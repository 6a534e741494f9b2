"""What-if: the same records under two policies, and what would appear, disappear or change.

``aegis replay ... --policy candidate.toml`` runs the base policy (the built-in defaults, or
``--base-policy``) and the candidate over the same records in one pass, then compares:

- a diagnosis is identified by ``(job, kind, culprits, rule)``; several with the same
  identity (separate incidents) are paired in event-time order;
- *appear*: only under the candidate; *disappear*: only under the base;
- *change*: same identity, different ``event_ts``, ``detected_ts``, ``confidence`` or
  recommended actions (``evidence["actions"]``);
- commands are identified by ``(job, action, target)`` plus their diagnosis' identity
  (*change*: another ``issued_at``); guard refusals likewise, plus the reason.

:func:`compare` is pure; :func:`diff_lines` renders it for people, :func:`diff_doc` for
machines (``--diff-json``). Rule changes are regression-tested this way (docs/replay.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from schemas.records import Diagnosis, IsolationCommand
from sinks.base import GuardRefusal, SinkItem

DIFF_FORMAT = "aegis-whatif"
SECTIONS = ("diagnoses", "commands", "refusals")
Identity = tuple[str, ...]


def diagnosis_identity(d: Diagnosis) -> Identity:
    c = d.culprits
    return (d.job, d.kind, ",".join(c.hosts), ",".join(c.gpus), ",".join(c.links),
            str(d.evidence.get("rule", "")))


def _actions(d: Diagnosis) -> list[list[str]]:
    acts = d.evidence.get("actions", [])
    return [list(map(str, a)) for a in acts] if isinstance(acts, list | tuple) else []


def diagnosis_changes(a: Diagnosis, b: Diagnosis) -> dict[str, list[Any]]:
    """Fields that differ between two diagnoses of the same identity: name -> [base, new]."""
    out: dict[str, list[Any]] = {}
    for name in ("event_ts", "detected_ts", "confidence"):
        x, y = getattr(a, name), getattr(b, name)
        if x != y:
            out[name] = [x, y]
    if _actions(a) != _actions(b):
        out["actions"] = [_actions(a), _actions(b)]
    return out


@dataclass
class Pair:
    identity: Identity
    base: Any
    new: Any
    fields: dict[str, list[Any]]


@dataclass
class SectionDiff:
    appear: list[Any] = field(default_factory=list)
    disappear: list[Any] = field(default_factory=list)
    change: list[Pair] = field(default_factory=list)
    same: int = 0

    @property
    def empty(self) -> bool:
        return not (self.appear or self.disappear or self.change)


@dataclass
class WhatIfDiff:
    diagnoses: SectionDiff
    commands: SectionDiff
    refusals: SectionDiff

    @property
    def empty(self) -> bool:
        return self.diagnoses.empty and self.commands.empty and self.refusals.empty

    def section(self, name: str) -> SectionDiff:
        return {"diagnoses": self.diagnoses, "commands": self.commands,
                "refusals": self.refusals}[name]


def _order_ts(item: Any) -> float:
    if isinstance(item, Diagnosis):
        return item.event_ts
    if isinstance(item, IsolationCommand):
        return item.issued_at
    return float(getattr(item, "ts", 0.0))


def _pair_up(base: Sequence[Any], new: Sequence[Any], ident: Callable[[Any], Identity],
             changes: Callable[[Any, Any], dict[str, list[Any]]]) -> SectionDiff:
    groups: dict[Identity, tuple[list[Any], list[Any]]] = {}
    for side, items in ((0, base), (1, new)):
        for it in items:
            groups.setdefault(ident(it), ([], []))[side].append(it)
    out = SectionDiff()
    for key in sorted(groups):
        a, b = (sorted(x, key=_order_ts) for x in groups[key])
        for x, y in zip(a, b, strict=False):
            delta = changes(x, y)
            if delta:
                out.change.append(Pair(key, x, y, delta))
            else:
                out.same += 1
        out.disappear.extend(a[len(b):])
        out.appear.extend(b[len(a):])
    return out


def _split(items: Iterable[SinkItem]) -> tuple[list[Diagnosis], list[IsolationCommand],
                                               list[GuardRefusal]]:
    ds, cs, rs = [], [], []
    seen: set[str] = set()
    for it in items:
        if isinstance(it, Diagnosis):
            if it.id not in seen:
                seen.add(it.id)
                ds.append(it)
        elif isinstance(it, IsolationCommand):
            cs.append(it)
        elif isinstance(it, GuardRefusal):
            rs.append(it)
    return ds, cs, rs


def compare(base: Iterable[SinkItem], new: Iterable[SinkItem]) -> WhatIfDiff:
    """What changes from the ``base`` outputs to the ``new`` ones (both in emission order)."""
    bd, bc, br = _split(base)
    nd, nc, nr = _split(new)
    ids = {d.id: diagnosis_identity(d) for d in bd}
    ids.update({d.id: diagnosis_identity(d) for d in nd})

    def cmd_ident(c: IsolationCommand) -> Identity:
        return (c.job, c.action, c.target, *ids.get(c.diagnosis_id, (c.diagnosis_id,)))

    def ref_ident(r: GuardRefusal) -> Identity:
        return (r.job, r.action, r.target, r.reason, *ids.get(r.diagnosis_id, (r.diagnosis_id,)))

    def cmd_changes(a: IsolationCommand, b: IsolationCommand) -> dict[str, list[Any]]:
        return {"issued_at": [a.issued_at, b.issued_at]} if a.issued_at != b.issued_at else {}

    def ref_changes(a: GuardRefusal, b: GuardRefusal) -> dict[str, list[Any]]:
        return {"ts": [a.ts, b.ts]} if a.ts != b.ts else {}

    return WhatIfDiff(_pair_up(bd, nd, diagnosis_identity, diagnosis_changes),
                      _pair_up(bc, nc, cmd_ident, cmd_changes),
                      _pair_up(br, nr, ref_ident, ref_changes))


# ---- rendering ---------------------------------------------------------------------------
def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def describe(item: Any) -> str:
    if isinstance(item, Diagnosis):
        c = item.culprits
        who = " ".join(f"{k}={','.join(v)}" for k, v in
                       (("hosts", c.hosts), ("gpus", c.gpus), ("links", c.links)) if v)
        return (f"diagnosis {item.kind} job={item.job} {who} rule={item.evidence.get('rule', '')} "
                f"detected {iso(item.detected_ts)}")
    if isinstance(item, IsolationCommand):
        return f"command {item.action} {item.target} job={item.job} at {iso(item.issued_at)}"
    if isinstance(item, GuardRefusal):
        return f"refusal {item.action} {item.target} job={item.job} ({item.reason})"
    return repr(item)


def _field_text(name: str, pair: list[Any]) -> str:
    a, b = pair
    if name.endswith("_ts") or name in ("issued_at", "ts"):
        return f"{name} {iso(a)} -> {iso(b)} ({b - a:+.1f} s)"
    return f"{name} {a} -> {b}"


def diff_lines(diff: WhatIfDiff, base_name: str, new_name: str) -> list[str]:
    """Human-readable lines: a summary, then ``+`` appear, ``-`` disappear, ``~`` change."""
    counts = ", ".join(f"{s} +{len(d.appear)} -{len(d.disappear)} ~{len(d.change)} ={d.same}"
                       for s in SECTIONS for d in (diff.section(s),))
    lines = [f"what-if: {new_name} vs {base_name}: {counts}"]
    if diff.empty:
        lines.append("what-if: no difference")
    for s in SECTIONS:
        d = diff.section(s)
        lines += [f"+ {describe(x)}" for x in d.appear]
        lines += [f"- {describe(x)}" for x in d.disappear]
        lines += [f"~ {describe(p.new)}: " + "; ".join(_field_text(k, v) for k, v in
                                                       sorted(p.fields.items()))
                  for p in d.change]
    return lines


def _wire(item: Any) -> dict[str, Any]:
    return dict(item.to_wire())


def diff_doc(diff: WhatIfDiff, base_name: str, new_name: str) -> dict[str, Any]:
    """The machine-readable diff (``--diff-json``): stable key order, wire-form records."""
    doc: dict[str, Any] = {"format": DIFF_FORMAT, "v": 1, "base": base_name, "policy": new_name,
                           "identical": diff.empty, "summary": {}}
    for s in SECTIONS:
        d = diff.section(s)
        doc["summary"][s] = {"appear": len(d.appear), "disappear": len(d.disappear),
                             "change": len(d.change), "same": d.same}
        doc[s] = {"appear": [_wire(x) for x in d.appear],
                  "disappear": [_wire(x) for x in d.disappear],
                  "change": [{"identity": list(p.identity), "fields": p.fields,
                              "base": _wire(p.base), "policy": _wire(p.new)} for p in d.change]}
    return doc
