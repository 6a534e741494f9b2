"""aegis-stream wire contract: records, codecs, the metric and topic catalogues.

Depends on nothing else in the project.
"""

from schemas.codec import decode, decode_or_raise, encode
from schemas.errors import (
    AegisError,
    ConfigError,
    DecodeError,
    ServiceUnavailable,
    ValidationError,
    VersionError,
    WireError,
)
from schemas.records import (
    ACTIONS,
    DIAGNOSIS_KINDS,
    SCHEMA_VERSION,
    CCLRecord,
    Culprits,
    DeadLetter,
    DeviceGroup,
    Diagnosis,
    IsolationCommand,
    LogRecord,
    OpCounters,
    RankSnapshot,
    TelemetryBatch,
    diagnosis_id,
)

__all__ = [
    "ACTIONS", "DIAGNOSIS_KINDS", "SCHEMA_VERSION", "AegisError", "CCLRecord", "ConfigError",
    "Culprits", "DeadLetter", "DecodeError", "DeviceGroup", "Diagnosis", "IsolationCommand",
    "LogRecord", "OpCounters", "RankSnapshot", "ServiceUnavailable", "TelemetryBatch",
    "ValidationError", "VersionError", "WireError", "decode", "decode_or_raise", "encode",
    "diagnosis_id",
]
