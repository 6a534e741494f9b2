"""The XID policy: Aegis' ECC defaults, NVIDIA catalogue coverage, operator overrides, bad files."""

from __future__ import annotations

import pytest

from processors.core.xid_policy import (
    CATEGORIES,
    SEVERITIES,
    XID_ACTIONS,
    XidPolicy,
    default_policy,
)
from schemas.errors import ConfigError


@pytest.mark.parametrize("xid", [48, 94, 95])
def test_uncorrectable_ecc_is_fatal_by_default(xid: int) -> None:
    rule = default_policy().lookup(xid)
    assert rule.fatal and rule.category == "critical_gpu" and rule.action == "isolate_gpu"


@pytest.mark.parametrize("xid", [63, 64, 92])
def test_correctable_ecc_is_not_fatal(xid: int) -> None:
    rule = default_policy().lookup(xid)
    assert not rule.fatal and rule.category == "benign_gpu" and rule.action == "none"


def test_xid_94_records_nvidias_restart_app_rating() -> None:
    rule = default_policy().lookup(94)
    assert rule.nvidia_action == "RESTART_APP"
    assert "RESTART_APP" in rule.note


@pytest.mark.parametrize("xid,category,severity,action", [
    (79, "critical_gpu", "fatal", "isolate_host"),
    (74, "nvlink", "fatal", "isolate_host"),
    (13, "cuda_app_error", "fatal", "restart_job"),
    (31, "cuda_app_error", "fatal", "restart_job"),
    (45, "benign_gpu", "info", "none"),
    (119, "critical_gpu", "fatal", "isolate_gpu"),
    (167, "pcie", "fatal", "isolate_host"),
])
def test_catalogue_entries(xid: int, category: str, severity: str, action: str) -> None:
    rule = default_policy().lookup(xid)
    assert (rule.category, rule.severity, rule.action) == (category, severity, action)


def test_catalogue_coverage_and_valid_values() -> None:
    p = default_policy()
    assert len(p.rules) >= 100
    used = {8, 11, 13, 31, 32, 43, 45, 46, 48, 62, 63, 64, 74, 79, 92, 94, 95, 109, 119, 120,
            136, 140, 143, *range(144, 151), 154, 155, 158, 171, 172}
    assert used <= set(p.rules)
    for rule in [*p.rules.values(), p.default]:
        assert rule.category in CATEGORIES
        assert rule.severity in SEVERITIES
        assert rule.action in XID_ACTIONS


def test_unknown_xid_falls_back_to_default() -> None:
    rule = default_policy().lookup(1)  # "Unused" in the catalogue
    assert rule.xid == 1 and rule.severity == "degraded" and rule.action == "none"


def test_override_changes_only_given_keys(tmp_path) -> None:
    f = tmp_path / "ops.toml"
    f.write_text('[xid.94]\nseverity = "degraded"\naction = "restart_job"\n\n'
                 '[xid.999]\nseverity = "fatal"\n')
    p = XidPolicy.load(str(f))
    r94 = p.lookup(94)
    assert (r94.category, r94.severity, r94.action) == ("critical_gpu", "degraded", "restart_job")
    assert p.lookup(48).fatal  # untouched
    r999 = p.lookup(999)  # new XID starts from [default]
    assert (r999.category, r999.severity) == ("critical_gpu", "fatal")
    assert str(f) in p.sources
    assert default_policy().lookup(94).fatal  # the shared default is not mutated


def test_override_default_table(tmp_path) -> None:
    f = tmp_path / "ops.toml"
    f.write_text('[default]\nseverity = "info"\n')
    assert XidPolicy.load(str(f)).lookup(2).severity == "info"


@pytest.mark.parametrize("text,needle", [
    ("[xid.94\nseverity=", "not valid TOML"),
    ('[xid.94]\ncolour = "red"\n', "unknown keys"),
    ('[xid.94]\ncategory = "gpu"\n', "not one of"),
    ('[xid.94]\nseverity = 3\n', "not a string"),
    ('[xid.abc]\nseverity = "info"\n', "must be an integer"),
    ('[xid.99999]\nseverity = "info"\n', "out of range"),
    ('[rules]\nx = 1\n', "unknown tables"),
    ('xid = 3\n', "must be a table"),
])
def test_bad_override_files(tmp_path, text: str, needle: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as ei:
        XidPolicy.load(str(f))
    assert needle in str(ei.value) and str(f) in str(ei.value)


def test_missing_file_is_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        XidPolicy.load(str(tmp_path / "nope.toml"))


def test_from_mapping_needs_a_default() -> None:
    with pytest.raises(ConfigError, match="missing \\[default\\]"):
        XidPolicy.from_mapping({"xid": {}})
    with pytest.raises(ConfigError, match="missing keys"):
        XidPolicy.from_mapping({"default": {"category": "other"}})
