"""The project's exception tree. Errors at the edge are values: decoders raise these,
and the edges turn them into dead letters.

    AegisError
    ├── WireError                 bytes that are not a record of ours
    │   ├── DecodeError           not msgpack/JSON, or not a mapping
    │   ├── VersionError          a schema version this build does not read
    │   └── ValidationError       a field is missing, mistyped or out of range
    ├── ConfigError               a setting or policy file is wrong
    └── ServiceUnavailable        Kafka or Redis could not be reached
"""

from __future__ import annotations

from typing import Any


class AegisError(Exception):
    """Root of every error this project raises on purpose."""


class WireError(AegisError):
    """Bytes on a topic or socket that are not a valid record."""


class DecodeError(WireError):
    """The payload is not well-formed msgpack/JSON, or not a mapping."""


class VersionError(WireError):
    """The record carries a schema version this build cannot read."""

    def __init__(self, record: str, version: Any, supported: tuple[int, ...]) -> None:
        self.record, self.version, self.supported = record, version, supported
        super().__init__(f"{record}: schema version {version!r} not supported (reads {list(supported)})")


class ValidationError(WireError):
    """A field is missing, of the wrong type or out of range. Names the field and value."""

    def __init__(self, record: str, field: str, value: Any, reason: str) -> None:
        self.record, self.field, self.value, self.reason = record, field, value, reason
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"{record}.{field}={shown} rejected ({reason})")


class ConfigError(AegisError):
    """A setting, flag or policy file is invalid."""


class ServiceUnavailable(AegisError):
    """Kafka or Redis could not be reached; the message says which and where."""
