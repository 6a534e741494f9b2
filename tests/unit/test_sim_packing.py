"""Columnar msgpack equals msgpack.packb, and rendered records equal schemas.codec's bytes."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest

from producers.sim import packing as pk
from producers.sim.simulation import SimConfig, Simulation
from schemas import codec
from schemas.records import CCLRecord, LogRecord, TelemetryBatch

BOUNDARIES = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**53, 2**63 - 1]


def test_uint_encoding_matches_msgpack_at_every_boundary() -> None:
    data, cls = pk.encode_uints(np.array([BOUNDARIES]))
    for j, v in enumerate(BOUNDARIES):
        assert bytes(data[0, j, :pk._INT_LEN[cls[0, j]]]) == msgpack.packb(v)


def test_negative_ints_rejected() -> None:
    with pytest.raises(ValueError):
        pk.encode_uints(np.array([[1, -1]]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_row_packer_equals_packb(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 7
    names = [f"h{'x' * int(rng.integers(0, 40))}" for _ in range(n)]  # fixstr and str8
    segs = [pk.const(pk.map_header(3) + pk.pack("name")), pk.rows([pk.pack(s) for s in names]),
            pk.const(pk.pack("ints") + pk.array_header(20)), *[pk.INT] * 20,
            pk.const(pk.pack("floats") + pk.array_header(3)), *[pk.FLOAT] * 3]
    packer = pk.RowPacker(segs, n)
    ints = rng.choice(BOUNDARIES, size=(n, 20))
    floats = rng.normal(size=(n, 3)) * 1e6
    floats[0, 0] = math.nan
    for select in (None, np.array([5, 1, 3])):
        rows = list(range(n)) if select is None else select.tolist()
        out = packer.pack(floats[rows], ints[rows], select=select)
        for r, b in zip(rows, out, strict=True):
            want = {"name": names[r], "ints": [int(x) for x in ints[r]],
                    "floats": [float(x) for x in floats[r]]}
            if r == 0:
                got = msgpack.unpackb(b)
                assert math.isnan(got["floats"][0])
                want["floats"][0] = got["floats"][0]
            assert b == msgpack.packb(want)


def test_rendered_records_equal_codec_bytes_and_arrays() -> None:
    """Every record the simulator writes decodes, and re-encodes to the very same bytes."""
    sim = Simulation(SimConfig(hosts=5, hosts_per_job=4, scenario="network_hang", seed=2,
                               duration_s=60, fault_at_s=30, init_s=3, watchdog_s=20))
    types = {"aegis.telemetry": TelemetryBatch, "aegis.ccl": CCLRecord, "aegis.logs": LogRecord}
    seen = set()
    pending = False
    for topic, key, _ts, value in sim.iter_encoded():
        rec = codec.decode_or_raise(types[topic], value)
        assert codec.encode(rec) == value
        assert rec.key == key
        seen.add(topic)
        if isinstance(rec, CCLRecord):
            pending |= any(r.pending_peers for r in rec.ranks)
        if isinstance(rec, TelemetryBatch) and rec.host == "h0004":
            assert rec.job is None  # the idle leftover host is keyed by host
    assert seen == set(types) and pending
