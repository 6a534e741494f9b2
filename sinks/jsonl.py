"""JSONL file sink: one JSON object per line, for ``aegis diagnose`` and analysts (``jq``).

Each line is the record's wire form (the same fields as on Kafka) plus ``"type"``:
``diagnosis`` | ``command`` | ``refusal`` | ``dead_letter``; e.g.
``jq -c 'select(.type=="command") | [.action, .target]' out.jsonl``. :func:`read_jsonl`
turns lines back into records. Diagnoses and commands are written once per id.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from schemas.errors import DecodeError
from schemas.records import DeadLetter, Diagnosis, IsolationCommand
from sinks.base import GuardRefusal, SinkItem

_TYPES: dict[type, str] = {Diagnosis: "diagnosis", IsolationCommand: "command",
                           GuardRefusal: "refusal", DeadLetter: "dead_letter"}
_CLASSES = {v: k for k, v in _TYPES.items()}


def to_line(item: SinkItem) -> bytes:
    """One JSONL line (with the trailing newline) for a sink item."""
    kind = _TYPES.get(type(item))
    if kind is None:
        raise TypeError(f"JsonlSink: {type(item).__name__} is not a sink item")
    return orjson.dumps({"type": kind, **item.to_wire()}, option=orjson.OPT_SORT_KEYS) + b"\n"


def from_line(line: bytes | str) -> SinkItem:
    """Decode one line written by :func:`to_line`; raises DecodeError/ValidationError."""
    try:
        obj: Any = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise DecodeError(f"JSONL: not valid JSON: {e}") from e
    if not isinstance(obj, dict) or obj.get("type") not in _CLASSES:
        raise DecodeError(f"JSONL: line has no known 'type': {str(line)[:80]!r}")
    cls = _CLASSES[obj.pop("type")]
    return cls.from_wire(obj)  # type: ignore[attr-defined]


def read_jsonl(path: str | Path) -> Iterator[SinkItem]:
    with open(path, "rb") as fh:
        for raw in fh:
            if raw.strip():
                yield from_line(raw)


class JsonlSink:
    """Write sink items to a file (path, ``"-"`` for stdout, or an open binary stream). A path
    is appended to (a long-running writer loses nothing across restarts), or truncated first
    with ``append=False`` (one command's output file: ``aegis diagnose -o``, ``aegis replay -o``)."""

    def __init__(self, out: str | Path | IO[bytes], *, include_refusals: bool = True,
                 include_dead_letters: bool = True, append: bool = True) -> None:
        self._target = out
        self._mode = "ab" if append else "wb"
        self._fh: IO[bytes] | None = None
        self._owns = False
        self.include_refusals = include_refusals
        self.include_dead_letters = include_dead_letters
        self._buf: list[bytes] = []
        self._ids: set[str] = set()
        self.written = 0

    def setup(self) -> None:
        if self._fh is not None:
            return
        if isinstance(self._target, str | Path):
            if str(self._target) == "-":
                import sys

                self._fh = sys.stdout.buffer
            else:
                self._fh = open(self._target, self._mode)  # noqa: SIM115 - closed in close()
                self._owns = True
        else:
            self._fh = self._target

    def add(self, item: SinkItem) -> None:
        if isinstance(item, GuardRefusal) and not self.include_refusals:
            return
        if isinstance(item, DeadLetter) and not self.include_dead_letters:
            return
        if isinstance(item, Diagnosis | IsolationCommand):
            key = f"{type(item).__name__}:{item.id}"
            if key in self._ids:
                return
            self._ids.add(key)
        self._buf.append(to_line(item))

    def add_dead_letter(self, dead: DeadLetter) -> None:
        self.add(dead)

    def flush(self) -> None:
        self.setup()
        assert self._fh is not None
        if self._buf:
            self._fh.write(b"".join(self._buf))
            self.written += len(self._buf)
            self._buf = []
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self.flush()
            if self._owns:
                self._fh.close()
            self._fh = None

    def __enter__(self) -> JsonlSink:
        self.setup()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
