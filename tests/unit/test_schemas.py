"""The wire contract: every record round-trips, and bad input is a typed error naming the
field and value."""

from __future__ import annotations

import math

import msgpack
import orjson
import pytest

from schemas import (
    CCLRecord,
    Culprits,
    DeadLetter,
    DecodeError,
    DeviceGroup,
    Diagnosis,
    IsolationCommand,
    LogRecord,
    OpCounters,
    RankSnapshot,
    TelemetryBatch,
    ValidationError,
    VersionError,
    WireError,
    decode,
    decode_or_raise,
    diagnosis_id,
    encode,
)
from schemas.metrics import BY_NAME, CATALOGUE, DEVICE_KINDS, Direction
from schemas.topics import ALL


def telemetry() -> TelemetryBatch:
    return TelemetryBatch(
        host="h0001", ts=1700000000.5, job="job-1",
        devices={"gpu": DeviceGroup(("0", "1"), {"gpu_temp_c": (60.0, 61.5),
                                                 "gpu_sm_clock_mhz": (1980.0, 1400.0)}),
                 "nic": DeviceGroup(("mlx5_0",), {"nic_ecn_per_s": (0.0,)}),
                 "host": DeviceGroup(("host",), {"host_cpu_util_pct": (12.5,)})})


def ccl() -> CCLRecord:
    return CCLRecord(host="h0001", ts=1700000001.0, job="job-1", ranks=(
        RankSnapshot("9f2c4e1a00b3d7e5", 16, 3, 3,
                     (OpCounters("AllReduce", 10, 80, 78, 9, 10250.0, 41.5),), (4, 5), 1700000000.9),))


def diagnosis() -> Diagnosis:
    c = Culprits(("h0001",), ("h0001/gpu2",), ())
    return Diagnosis(id=diagnosis_id("job-1", "critical_error", c, "xid", 1.0), job="job-1",
                     kind="critical_error", culprits=c, evidence={"rule": "xid", "xid": 79},
                     confidence=0.95, event_ts=1.0, detected_ts=6.0, detector="decision_tree")


RECORDS = [
    telemetry(),
    LogRecord("h0001", 1700000002.0, "kernel", "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", "job-1"),
    LogRecord("h0002", 1700000002.0, "training", "step 10 loss 2.3"),
    ccl(),
    diagnosis(),
    IsolationCommand("d:isolate_host:h0001", "job-1", "isolate_host", "h0001", "Xid 79", "d", 6.0),
    DeadLetter("aegis.logs", 3, 42, b"\xff\x00garbage", "not msgpack"),
]


@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: type(r).__name__)
def test_round_trip(rec) -> None:  # type: ignore[no-untyped-def]
    data = encode(rec)
    assert decode(type(rec), data) == rec
    assert decode_or_raise(type(rec), data) == rec


def test_json_records_are_plain_json() -> None:
    d = orjson.loads(encode(diagnosis()))
    assert d["kind"] == "critical_error" and d["culprits"]["gpus"] == ["h0001/gpu2"]


@pytest.mark.parametrize("data", [b"", b"\xc1", b"garbage bytes", msgpack.packb([1, 2]),
                                  msgpack.packb("str")])
def test_garbage_is_a_decode_error_value(data: bytes) -> None:
    err = decode(TelemetryBatch, data)
    assert isinstance(err, DecodeError)
    with pytest.raises(WireError):
        decode_or_raise(TelemetryBatch, data)


def test_validation_error_names_field_and_value() -> None:
    wire = telemetry().to_wire()
    wire["ts"] = "yesterday"
    err = decode(TelemetryBatch, msgpack.packb(wire))
    assert isinstance(err, ValidationError)
    assert (err.record, err.field, err.value) == ("TelemetryBatch", "ts", "yesterday")
    assert "TelemetryBatch.ts='yesterday'" in str(err)


@pytest.mark.parametrize("mutate,field", [
    (lambda w: w.pop("host"), "host"),
    (lambda w: w.__setitem__("ts", math.inf), "ts"),
    (lambda w: w["devices"]["gpu"]["values"].__setitem__("gpu_temp_c", [1.0]), "values.gpu_temp_c"),
    (lambda w: w["devices"].__setitem__("fpga", {"ids": [], "values": {}}), "devices"),
])
def test_telemetry_validation(mutate, field) -> None:  # type: ignore[no-untyped-def]
    wire = telemetry().to_wire()
    mutate(wire)
    err = decode(TelemetryBatch, msgpack.packb(wire))
    assert isinstance(err, ValidationError) and err.field == field


def test_nan_values_pass_decode_for_the_detector_to_reject() -> None:
    wire = telemetry().to_wire()
    wire["devices"]["gpu"]["values"]["gpu_temp_c"] = [float("nan"), 60.0]
    rec = decode(TelemetryBatch, msgpack.packb(wire))
    assert isinstance(rec, TelemetryBatch) and math.isnan(rec.devices["gpu"].values["gpu_temp_c"][0])


def test_ccl_rank_bounds() -> None:
    wire = ccl().to_wire()
    wire["ranks"][0]["pending"] = [99]
    err = decode(CCLRecord, msgpack.packb(wire))
    assert isinstance(err, ValidationError) and err.field == "pending"
    wire = ccl().to_wire()
    wire["ranks"][0]["rank"] = 16
    assert isinstance(decode(CCLRecord, msgpack.packb(wire)), ValidationError)


@pytest.mark.parametrize("v", [2, True, 1.0, "1"])
def test_unknown_version_is_refused(v: object) -> None:
    for rec, cls in ((telemetry(), TelemetryBatch), (ccl(), CCLRecord)):
        wire = rec.to_wire()
        wire["v"] = v
        assert isinstance(decode(cls, msgpack.packb(wire)), VersionError)
    wire = diagnosis().to_wire()
    wire["v"] = v
    assert isinstance(decode(Diagnosis, orjson.dumps(wire)), VersionError)


def test_diagnosis_kind_and_confidence_checked() -> None:
    wire = diagnosis().to_wire()
    wire["kind"] = "vibes"
    assert isinstance(decode(Diagnosis, orjson.dumps(wire)), ValidationError)
    wire = diagnosis().to_wire()
    wire["confidence"] = 1.5
    assert isinstance(decode(Diagnosis, orjson.dumps(wire)), ValidationError)


def test_diagnosis_id_is_stable_and_order_free() -> None:
    a = diagnosis_id("j", "dist_error", Culprits(("h1", "h2")), "r", 5.0)
    b = diagnosis_id("j", "dist_error", Culprits(("h2", "h1")), "r", 5.0)
    assert a == b and len(a) == 20
    assert a != diagnosis_id("j", "dist_error", Culprits(("h1", "h2")), "r", 6.0)


def test_catalogue_covers_aegis_metrics() -> None:
    assert len(CATALOGUE) >= 20
    assert {m.kind for m in CATALOGUE} == set(DEVICE_KINDS)
    for name in ("nic_ecn_per_s", "nic_retrans_per_s", "nic_cnp_sent_per_s", "gpu_tensor_tflops",
                 "gpu_temp_c", "gpu_pcie_rx_bps", "gpu_nvlink_err_per_s", "gpu_ecc_dbe_total"):
        assert name in BY_NAME
    assert BY_NAME["nic_ecn_per_s"].abnormal and BY_NAME["nic_ecn_per_s"].floor > 0
    assert BY_NAME["gpu_sm_clock_mhz"].direction is Direction.LOW_BAD


def test_topic_catalogue_keys_inputs_by_job() -> None:
    names = {t.name for t in ALL}
    assert {"aegis.telemetry", "aegis.logs", "aegis.ccl", "aegis.diagnoses", "aegis.deadletter"} <= names
