"""The health gate's policy: defaults, a host's say over them, and findings on real captures."""

from __future__ import annotations

import calendar
import dataclasses
import json
import time
from pathlib import Path

import pytest

from fleet.inventory.host import HEALTH_CHECKS, Host
from fleet.node.probes.health import GpuHealth, Xid, parse_health, parse_xids
from fleet.reset.health import (
    CHECKS,
    DEFAULT_LEVEL,
    WHY,
    XID_ACTION,
    XID_NAMES,
    Finding,
    HealthPolicy,
    Level,
    fails,
    judge,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SMI = FIXTURES / "nvidia-smi"
KLOG = FIXTURES / "kernel-log"
DEFAULTS = HealthPolicy()
BUS = "00000000:83:00.0"  # the H200 capture's GPU
PCI = "0000:83:00"
T0 = 11 * 3600 + 2 * 60 + 13  # 11:02:13 UTC on 1970-01-01


def fixture(path: Path) -> str:
    return path.read_bytes().decode()


def gpu(**facts: object) -> GpuHealth:
    """The real H200 idle capture's GPU, with `facts` changed."""
    (h200,) = parse_health(fixture(SMI / "h200_drv590.48.01_1gpu_q_idle.txt"))
    return dataclasses.replace(h200, **facts)  # type: ignore[arg-type]


def message_xids(name: str, at: float) -> tuple[Xid, ...]:
    """A kernel-log fixture of bare messages, stamped `at` as journalctl -o short-unix would."""
    return parse_xids("".join(f"{at} node kernel: {line}\n" for line in fixture(KLOG / name).splitlines()))


def ctime_epoch(ctime: str) -> int:
    return calendar.timegm(time.strptime(ctime, "%a %b %d %H:%M:%S %Y"))


def only(findings: dict[str, tuple[Finding, ...]], key: str = BUS) -> tuple[Finding, ...]:
    assert set(findings) == {key}, findings
    return findings[key]


# --- the checks and their defaults ------------------------------------------------


def test_the_checks_are_the_ones_the_host_variables_name() -> None:
    assert CHECKS == HEALTH_CHECKS
    assert set(DEFAULT_LEVEL) == set(WHY) == set(CHECKS)
    assert all(WHY[c].strip() for c in CHECKS)


def test_default_levels_follow_nvidia_docs() -> None:
    warn = {"ecc_corrected", "persistence"}
    assert {c for c in CHECKS if DEFAULT_LEVEL[c] is Level.WARN} == warn
    assert all(DEFAULT_LEVEL[c] is Level.FAIL for c in CHECKS if c not in warn)
    assert {48, 63, 64, 74, 79, 92, 94, 95} <= XID_ACTION
    assert not {13, 31, 43, 45, 68, 69} & XID_ACTION  # application errors: restart the application
    assert set(XID_NAMES) == {13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 154}


def test_policy_downgrades_and_ignores() -> None:
    policy = HealthPolicy(warn=frozenset({"pcie_width"}), ignore=frozenset({"persistence"}))
    assert policy.level("pcie_width", Level.FAIL) is Level.WARN
    assert policy.level("persistence", Level.WARN) is None
    assert policy.level("xid", Level.FAIL) is Level.FAIL
    assert policy.level("xid", Level.WARN) is Level.WARN  # a warning never becomes a failure


def test_policy_refuses_an_unknown_check() -> None:
    with pytest.raises(ValueError, match=r"unknown health check.*pcie_speed"):
        HealthPolicy(warn=frozenset({"pcie_speed"}))


def test_policy_of_a_host() -> None:
    host = Host("gpu-01", "gpu-01", health_warn=("fabric",), health_ignore=("xid", "persistence"))
    assert HealthPolicy.of(host) == HealthPolicy(frozenset({"fabric"}), frozenset({"xid", "persistence"}))
    assert HealthPolicy.of(Host("gpu-02", "gpu-02")) == DEFAULTS


# --- real captures -----------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["h200_drv590.48.01_1gpu_q_idle.txt", "8x-h100-80gb-hbm3_drv535.183.01_q_one-gpu-busy.txt"]
)
def test_healthy_hopper_nodes_have_no_finding(name: str) -> None:
    gpus = parse_health(fixture(SMI / name))
    assert judge(gpus, (), DEFAULTS) == {g.bus_id: () for g in gpus}


def test_a100_with_persistence_off_only_warns() -> None:
    """Driver 460 prints no Fabric section: the fabric is not judged, not failed."""
    gpus = parse_health(fixture(SMI / "8x-a100-sxm4-40gb_drv460.32.03_q_idle-persistence-off_gpu1-and-gpu5-of-8.txt"))
    off = (Finding("persistence", Level.WARN, "persistence mode off"),)
    assert judge(gpus, (), DEFAULTS) == {"00000001:00:00.0": off, "0000000B:00:00.0": off}
    assert fails(judge(gpus, (), DEFAULTS)) == []


def test_a100_after_xid_63_fails_on_the_pending_remap_and_the_xid() -> None:
    text = fixture(SMI / "8x-a100-sxm4-80gb_drv510.73.08_q_excerpt-remap-pending-after-xid63.txt")
    gpus = parse_health("".join(line for line in text.splitlines(keepends=True) if line.strip() != "[...]"))
    xids = message_xids("a100-sxm4-80gb_message_xid-63-row-remapper.log", T0)
    assert judge(gpus, xids, DEFAULTS) == {"00000000:10:1C.0": (
        Finding("ecc_corrected", Level.WARN, "177 correctable ECC errors (volatile)"),
        Finding("remap_pending", Level.FAIL, "row remapping pending: reset the GPU to apply"),
        Finding("xid", Level.FAIL, "Xid 63 at 11:02:13: ECC page retirement or row remapping recording event"),
    )}


def test_xid_119_on_no_listed_gpu_is_judged_under_the_node() -> None:
    """The dmesg --ctime stamps, read as UTC, become the short-unix seconds journalctl would print."""
    lines = fixture(KLOG / "h100-xe9680_dmesg-ctime_xid-119-gsp-rpc-timeout.log").splitlines()
    text = "".join(f"{ctime_epoch(line[1:25])} node kernel: {line[27:]}\n" for line in lines)
    found = judge([gpu()], parse_xids(text), DEFAULTS)
    assert found == {BUS: (), "": (
        Finding("xid", Level.FAIL, "Xid 119 at 16:24:18: GSP RPC Timeout (5 times, last at 16:30:13)"),
    )}


def test_application_xids_since_boot_warn() -> None:
    """Xid 13, 31 and 109 (not in the table: its own text) as one node logged them, before any reset."""
    lines = fixture(KLOG / "gpud-readme_dmesg-ctime_xid-13-31-109.log").splitlines()
    text = "".join(f"{T0 + i} node kernel: {line[27:]}\n" for i, line in enumerate(lines))
    found = judge([gpu()], parse_xids(text), DEFAULTS)
    assert found[""] == (
        Finding("xid", Level.WARN, "Xid 13 at 11:02:14: Graphics Engine Exception (3 times, last at 11:02:16)"),
        Finding("xid", Level.WARN, "Xid 109 at 11:02:17: pid=1797828, name=pt_main_thread, Ch 00000008, "
                                   "errorString CTX SWITCH TIMEOUT, Info 0x58005 (2 times, last at 11:02:21)"),
        Finding("xid", Level.WARN, "Xid 31 at 11:02:18: GPU memory page fault"),
    )
    assert fails(found) == []


# --- Xids before and during the reset ------------------------------------------------


def test_any_xid_logged_during_the_reset_fails() -> None:
    old = Xid(T0, PCI, 13, "pid=1, name=python3, Graphics Exception")
    new = Xid(T0 + 60, PCI, 13, "pid=2, name=python3, Graphics Exception")
    found = judge([gpu()], [old, new], DEFAULTS, before={old})
    assert only(found) == (
        Finding("xid", Level.WARN, "Xid 13 at 11:02:13: Graphics Engine Exception"),
        Finding("xid", Level.FAIL, "Xid 13 at 11:03:13: Graphics Engine Exception during the reset"),
    )


def test_without_a_reset_no_xid_is_during_one() -> None:
    xid = Xid(T0, PCI, 13, "pid=1")
    assert only(judge([gpu()], [xid], DEFAULTS, before=None))[0].level is Level.WARN
    assert only(judge([gpu()], [xid], DEFAULTS, before=()))[0].level is Level.FAIL


def test_fallen_off_the_bus_fails_even_from_before_the_reset() -> None:
    (xid,) = message_xids("message_xid-79-fallen-off-the-bus.log", T0)
    found = judge([gpu(bus_id="00000000:44:00.0")], [xid], DEFAULTS, before={xid})
    assert only(found, "00000000:44:00.0") == (
        Finding("xid", Level.FAIL, "Xid 79 at 11:02:13: GPU has fallen off the bus"),
    )


def test_an_xid_on_another_domain_joins_its_gpu() -> None:
    (xid,) = message_xids("kmsg_xid-149-netir-domain-0019.log", T0)
    found = judge([gpu(bus_id="00000019:01:00.0")], [xid], DEFAULTS)
    assert only(found, "00000019:01:00.0")[0].detail.startswith("Xid 149 at 11:02:13: NETIR Fatal XC0 i0 Link -1")


def test_host_policy_over_xids() -> None:
    (xid,) = message_xids("message_xid-79-fallen-off-the-bus.log", T0)
    gpus = [gpu(bus_id="00000000:44:00.0")]
    warned = judge(gpus, [xid], HealthPolicy(warn=frozenset({"xid"})))
    assert [f.level for f in warned["00000000:44:00.0"]] == [Level.WARN]
    assert judge(gpus, [xid], HealthPolicy(ignore=frozenset({"xid"}))) == {"00000000:44:00.0": ()}


# --- each GPU check ------------------------------------------------------------


@pytest.mark.parametrize(
    ("facts", "finding"),
    [
        ({"ecc_uncorrected": 2}, Finding("ecc_uncorrected", Level.FAIL, "2 uncorrectable ECC errors (volatile)")),
        ({"ecc_uncorrected": 1}, Finding("ecc_uncorrected", Level.FAIL, "1 uncorrectable ECC error (volatile)")),
        ({"ecc_corrected": 1}, Finding("ecc_corrected", Level.WARN, "1 correctable ECC error (volatile)")),
        ({"retired_pending": True},
         Finding("retired_pending", Level.FAIL, "page retirement pending: reset the GPU to retire the pages")),
        ({"remap_pending": True},
         Finding("remap_pending", Level.FAIL, "row remapping pending: reset the GPU to apply")),
        ({"remap_failed": True},
         Finding("remap_failed", Level.FAIL, "row remapping failed: no spare row left in the bank (RMA criterion)")),
        ({"persistence": False}, Finding("persistence", Level.WARN, "persistence mode off")),
        ({"fabric_state": "In Progress", "fabric_status": None},
         Finding("fabric", Level.FAIL, "fabric state In Progress, status N/A")),
        ({"fabric_status": "Failure"}, Finding("fabric", Level.FAIL, "fabric state Completed, status Failure")),
        ({"pcie_width": 8}, Finding("pcie_width", Level.FAIL, "PCIe link x8, capable of x16")),
    ],
)
def test_each_check(facts: dict[str, object], finding: Finding) -> None:
    assert only(judge([gpu(**facts)], (), DEFAULTS)) == (finding,)


@pytest.mark.parametrize(
    "facts",
    [
        {"persistence": None, "ecc_corrected": None, "ecc_uncorrected": None, "retired_pending": None,
         "remap_pending": None, "remap_failed": None, "pcie_width": None, "pcie_width_max": None},
        {"fabric_state": None, "fabric_status": None},  # a GPU without a fabric (or a driver without the section)
        {"pcie_gen": 1},  # an idle GPU lowers its link generation on purpose
        {"ecc_corrected": 0, "retired_pending": False},
    ],
)
def test_what_is_unknown_or_normal_is_no_finding(facts: dict[str, object]) -> None:
    assert only(judge([gpu(**facts)], (), DEFAULTS)) == ()


def test_downgraded_and_ignored_checks() -> None:
    sick = gpu(pcie_width=4, persistence=False)
    policy = HealthPolicy(warn=frozenset({"pcie_width"}), ignore=frozenset({"persistence"}))
    assert only(judge([sick], (), policy)) == (Finding("pcie_width", Level.WARN, "PCIe link x4, capable of x16"),)


# --- fails and the report shape --------------------------------------------------


def test_fails_puts_the_most_telling_first() -> None:
    sick = gpu(pcie_width=8, remap_pending=True, ecc_uncorrected=3, persistence=False)
    xid = Xid(T0, PCI, 79, "GPU has fallen off the bus.")
    assert [f.check for f in fails(judge([sick], [xid], DEFAULTS))] == [
        "xid", "ecc_uncorrected", "remap_pending", "pcie_width",
    ]


def test_a_finding_is_check_level_detail_in_json() -> None:
    finding = Finding("xid", Level.FAIL, "Xid 79 at 11:02:13: GPU has fallen off the bus")
    assert json.loads(json.dumps(dataclasses.asdict(finding))) == {
        "check": "xid", "level": "fail", "detail": "Xid 79 at 11:02:13: GPU has fallen off the bus",
    }


def test_the_readme_states_the_default_policy_as_declared() -> None:
    """README's health table is the rules in fleet/reset/health.py, row for row."""
    from fleet.reset.health import RULES

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for check, level, why in RULES:
        assert f"| `{check}` | {level.value} | {why} |" in readme
    assert ", ".join(map(str, sorted(XID_ACTION))) in " ".join(readme.split())
