"""The CCL snapshot codec against the shared vectors (schemas/vectors, also checked by the
C harness byte for byte), and on truncated, garbage and out-of-range input."""

from __future__ import annotations

import json
import random
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from schemas import errors
from schemas.ccl_snapshot import (
    ENTRY,
    HEADER,
    OP,
    OP_KINDS,
    OpStats,
    RankEntry,
    Snapshot,
    decode_snapshot,
    encode_snapshot,
)

VECTORS = Path(__file__).resolve().parents[2] / "schemas" / "vectors"
MANIFEST = json.loads((VECTORS / "ccl_snapshot_v1.json").read_text())
VALID = MANIFEST["valid"]
INVALID = MANIFEST["invalid"]


def _snapshot(d: dict[str, Any]) -> Snapshot:
    entries = tuple(
        RankEntry(**{**e, "ops": tuple(OpStats(**o) for o in e["ops"]),
                     "pending_peers": tuple(e["pending_peers"])})
        for e in d["entries"])
    return Snapshot(**{**d, "entries": entries})


def _bytes(name: str) -> bytes:
    return (VECTORS / name).read_bytes()


def test_layout_sizes() -> None:
    assert (HEADER.size, ENTRY.size, OP.size) == (40, 40, 56)
    assert len(OP_KINDS) == 12 and OP_KINDS[0] == "other" and OP_KINDS[1] == "AllReduce"


@pytest.mark.parametrize("vec", VALID, ids=[v["file"] for v in VALID])
def test_valid_vector_decodes_to_expected(vec: dict[str, Any]) -> None:
    assert decode_snapshot(_bytes(vec["file"])) == _snapshot(vec["expect"])


@pytest.mark.parametrize("vec", VALID, ids=[v["file"] for v in VALID])
def test_encoder_reproduces_vector(vec: dict[str, Any]) -> None:
    assert encode_snapshot(_snapshot(vec["expect"])) == _bytes(vec["file"])


@pytest.mark.parametrize("vec", INVALID, ids=[v["file"] for v in INVALID])
def test_invalid_vector_gives_typed_error(vec: dict[str, Any]) -> None:
    result = decode_snapshot(_bytes(vec["file"]))
    assert type(result) is getattr(errors, vec["error"])
    assert vec["match"] in str(result)


@pytest.mark.parametrize("vec", VALID, ids=[v["file"] for v in VALID])
def test_every_truncation_is_a_decode_error(vec: dict[str, Any]) -> None:
    data = _bytes(vec["file"])
    for cut in range(len(data)):
        result = decode_snapshot(data[:cut])
        assert isinstance(result, errors.DecodeError), (cut, result)


@pytest.mark.parametrize("seed", range(20))
def test_garbage_never_raises(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        data = rng.randbytes(rng.randrange(0, 400))
        assert isinstance(decode_snapshot(data), errors.WireError)
    base = bytearray(_bytes("ccl_v1_two_ranks_hang.bin"))
    for _ in range(300):
        mutated = bytearray(base)
        for _ in range(rng.randrange(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        assert isinstance(decode_snapshot(bytes(mutated)), Snapshot | errors.WireError)


@pytest.mark.parametrize("data", ["text", None, 17, [1, 2]])
def test_non_bytes_is_a_decode_error(data: Any) -> None:
    assert isinstance(decode_snapshot(data), errors.DecodeError)


def test_memoryview_and_bytearray_accepted() -> None:
    data = _bytes("ccl_v1_one_rank.bin")
    assert decode_snapshot(memoryview(data)) == decode_snapshot(bytearray(data))


def test_oversize_is_a_decode_error() -> None:
    assert isinstance(decode_snapshot(b"\0" * 70000), errors.DecodeError)


BASE = Snapshot(pid=9, seq=1, wall_ns=2_000_000_000, mono_ns=1_000_000_000, entries=(
    RankEntry(comm_hash=0xAB, nranks=4, rank=1, local_gpu=0, ops=(
        OpStats("AllReduce", cl=3, wr=6, wc=6, seq=3, td_ns=10, n_ns=5, n_samples=5),),
        pending_peers=(2,), pending_total=1),))
_OP0 = HEADER.size + ENTRY.size


def _patched(offset: int, fmt: str, value: int) -> bytes:
    data = bytearray(encode_snapshot(BASE))
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


@pytest.mark.parametrize(("offset", "fmt", "value", "field"), [
    (5, "<B", 0x80, "flags"),                          # unknown header flag
    (HEADER.size + 12, "<I", 4, "rank"),               # rank == nranks
    (HEADER.size + 8, "<I", 0, "nranks"),
    (HEADER.size + 16, "<h", -2, "local_gpu"),
    (HEADER.size + 20, "<H", 0x4, "flags"),            # unknown entry flag
    (HEADER.size + 22, "<H", 1, "flags"),              # reserved
    (HEADER.size + 20, "<H", 0x2, "flags"),            # PENDING_CUT with all peers listed
    (HEADER.size + 24, "<I", 0, "pending_total"),      # fewer than listed
    (_OP0 + 1, "<B", 6, "n_samples"),                  # over L = 5
    (_OP0 + 2, "<H", 1, "reserved"),
    (_OP0 + 32, "<Q", 4, "seq"),                       # seq above cl
    (_OP0 + 24, "<Q", 7, "wc"),                        # wc above wr
    (_OP0 + OP.size, "<I", 4, "pending"),              # peer not a rank
])
def test_out_of_range_field_is_a_validation_error(offset: int, fmt: str, value: int,
                                                  field: str) -> None:
    result = decode_snapshot(_patched(offset, fmt, value))
    assert isinstance(result, errors.ValidationError), result
    assert field in result.field


def test_repeated_kind_and_peer_rejected() -> None:
    two_ops = replace(BASE, entries=(
        RankEntry(comm_hash=1, nranks=4, rank=0, local_gpu=0, ops=(
            OpStats("Send", 1, 0, 0), OpStats("Send", 2, 0, 0))),))
    assert isinstance(decode_snapshot(encode_snapshot(two_ops)), errors.ValidationError)
    two_peers = replace(BASE, entries=(
        RankEntry(comm_hash=1, nranks=4, rank=0, local_gpu=0, ops=(),
                  pending_peers=(3, 3), pending_total=2),))
    assert isinstance(decode_snapshot(encode_snapshot(two_peers)), errors.ValidationError)


def test_samples_without_n_rejected() -> None:
    data = _patched(_OP0 + 1, "<B", 0)  # n_ns = 5 stays, no samples
    assert isinstance(decode_snapshot(data), errors.ValidationError)


def test_round_trip_and_helpers() -> None:
    decoded = decode_snapshot(encode_snapshot(BASE))
    assert decoded == BASE
    assert isinstance(decoded, Snapshot)
    assert decoded.entries[0].comm == "00000000000000ab"
    assert decoded.wall_time(900_000_000) == pytest.approx(1.9)
    assert decoded.wall_time(0) == 0.0


def test_encoder_refuses_values_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match="out of range"):
        encode_snapshot(Snapshot(pid=-1, seq=0, wall_ns=0, mono_ns=0, entries=()))
    with pytest.raises(ValueError):
        encode_snapshot(replace(BASE, entries=(
            RankEntry(comm_hash=1, nranks=1, rank=0, local_gpu=0, ops=(OpStats("Bogus", 1, 0, 0),)),)))
