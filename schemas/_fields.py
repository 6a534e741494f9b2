"""Field readers shared by the record decoders. Each names the record, field and value it rejects."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from schemas.errors import ValidationError


def req(rec: str, d: Mapping[str, Any], key: str) -> Any:
    if key not in d:
        raise ValidationError(rec, key, None, "missing")
    return d[key]


def text(rec: str, d: Mapping[str, Any], key: str, *, optional: bool = False, max_len: int = 256) -> Any:
    v = d.get(key) if optional else req(rec, d, key)
    if v is None and optional:
        return None
    if not isinstance(v, str):
        raise ValidationError(rec, key, v, "not a string")
    if not optional and not v:
        raise ValidationError(rec, key, v, "empty")
    if len(v) > max_len:
        raise ValidationError(rec, key, v, f"longer than {max_len} characters")
    return v


def number(rec: str, d: Mapping[str, Any], key: str, *, optional: bool = False,
           minimum: float | None = None) -> Any:
    v = d.get(key) if optional else req(rec, d, key)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValidationError(rec, key, v, "not a number")
    if not math.isfinite(v):
        raise ValidationError(rec, key, v, "not finite")
    if minimum is not None and v < minimum:
        raise ValidationError(rec, key, v, f"below {minimum}")
    return float(v)


def integer(rec: str, d: Mapping[str, Any], key: str, *, minimum: int | None = 0,
            optional: bool = False) -> Any:
    v = d.get(key) if optional else req(rec, d, key)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValidationError(rec, key, v, "not an integer")
    if minimum is not None and v < minimum:
        raise ValidationError(rec, key, v, f"below {minimum}")
    return v


def choice(rec: str, d: Mapping[str, Any], key: str, allowed: tuple[str, ...]) -> str:
    v = req(rec, d, key)
    if v not in allowed:
        raise ValidationError(rec, key, v, f"not one of {', '.join(allowed)}")
    return str(v)


def mapping(rec: str, d: Mapping[str, Any], key: str, *, optional: bool = False) -> Any:
    v = d.get(key, {} if optional else None) if optional else req(rec, d, key)
    if not isinstance(v, Mapping):
        raise ValidationError(rec, key, v, "not a mapping")
    return v


def sequence(rec: str, d: Mapping[str, Any], key: str, *, optional: bool = False) -> Any:
    v = d.get(key, []) if optional else req(rec, d, key)
    if not isinstance(v, list | tuple):
        raise ValidationError(rec, key, v, "not a list")
    return v


def str_list(rec: str, d: Mapping[str, Any], key: str) -> tuple[str, ...]:
    v = sequence(rec, d, key, optional=True)
    for item in v:
        if not isinstance(item, str):
            raise ValidationError(rec, key, item, "list item not a string")
    return tuple(v)
