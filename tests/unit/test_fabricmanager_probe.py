"""The fabric manager's version as verify reads it (fleet.node.probes.fabricmanager): from the real captures of
`nv-fabricmanager --version` (tests/fixtures/fabricmanager/SOURCES.md), a node without it (exit 127), one that
fails, garbage, and bytes that were not UTF-8; and its record both ways through the JSON report's codec."""

from __future__ import annotations

import pytest
from support.paths import FIXTURES

from fleet.model.codec import host_from_document, host_to_document
from fleet.model.errors import DocumentError
from fleet.model.fabric import FabricManager, FmState
from fleet.model.report import HostReport, HostStatus
from fleet.node.probes.fabricmanager import ARGV, NOT_FOUND, probe, reading, version_of
from fleet.node.probes.parse import ProbeParseError
from fleet.transport.base import CommandResult

FM = FIXTURES / "fabricmanager"


def ran(status: int, stdout: str = "", stderr: str = "") -> CommandResult:
    return CommandResult(argv=ARGV, exit_status=status, stdout=stdout, stderr=stderr, duration_s=0.01)


@pytest.mark.parametrize(("capture", "version"), [("fm450.102.04_version.txt", "450.102.04"),
                                                  ("fm535.161.08_version.txt", "535.161.08"),
                                                  ("fm610.57.04_version_build-info.txt", "610.57.04")])
def test_each_real_capture_reads_as_its_version(capture: str, version: str) -> None:
    assert reading(ran(0, (FM / capture).read_text())) == FabricManager.present(version)


def test_the_610_build_info_line_without_a_final_newline_is_read_over() -> None:
    text = (FM / "fm610.57.04_version_build-info.txt").read_text()
    assert not text.endswith("\n") and "Build Info - Branch:" in text
    assert version_of(text) == "610.57.04"


@pytest.mark.parametrize("capture", ["not-installed_stderr.txt", "h200-drv580.159.04_not-installed_stderr.txt"])
def test_a_node_without_nv_fabricmanager_has_none_absent_not_unknown(capture: str) -> None:
    said = (FM / capture).read_text()
    found = reading(ran(NOT_FOUND, "", said))
    assert found == FabricManager.absent() and found.state is FmState.ABSENT and found.why is None


def test_a_failing_binary_is_not_observed_with_its_status_and_error() -> None:
    found = reading(ran(1, "", "nv-fabricmanager: error while loading shared libraries: libnvfm.so.1\n"))
    assert found.state is FmState.NOT_OBSERVED and found.version is None
    assert found.why == ("nv-fabricmanager --version exited 1: nv-fabricmanager: error while loading shared "
                         "libraries: libnvfm.so.1")
    assert reading(ran(126, "", "permission denied")).state is FmState.NOT_OBSERVED  # found, cannot run
    # 127 with a version printed is no "command not found": never absent
    assert reading(ran(NOT_FOUND, "Fabric Manager version is : 535.161.08\n")).state is FmState.NOT_OBSERVED


@pytest.mark.parametrize("stdout", [
    "", "\n\n", "Segmentation fault\n", "Fabric Manager version is : \n", "Fabric Manager version is : unknown\n",
    "Fabric Manager version is : 535.161.08\nFabric Manager version is : 535.161.08\n",
    "Fabric Manager version is : 535.161.08\nsomething else\n", "Fabric Manager version is : 535\n",
])
def test_garbage_is_not_observed_never_a_version(stdout: str) -> None:
    found = reading(ran(0, stdout))
    assert found.state is FmState.NOT_OBSERVED and (found.why or "").startswith("unreadable nv-fabricmanager")
    with pytest.raises(ProbeParseError):
        version_of(stdout)


def test_bytes_that_are_not_utf8_are_not_observed() -> None:
    raw = b"Fabric Manager version is : 535.\xff161.08\n"
    for decoded in (raw.decode("utf-8", errors="replace"), raw.decode("utf-8", errors="surrogateescape")):
        assert reading(ran(0, decoded)).state is FmState.NOT_OBSERVED
    arabic = "Fabric Manager version is : ٥٣٥.١٦١\n"  # digits of another script are no version either
    assert reading(ran(0, arabic)).state is FmState.NOT_OBSERVED


def test_the_probe_takes_every_exit_status_and_no_root() -> None:
    asked = probe()
    assert asked.argv == ARGV and not asked.needs_root and not asked.driver
    assert all(asked.answered(ran(status)) for status in (0, 1, 126, 127))


@pytest.mark.parametrize("found", [FabricManager.present("535.161.08"), FabricManager.absent(),
                                   FabricManager.unread("nv-fabricmanager --version exited 1: x"), None])
def test_the_record_goes_through_the_json_report_both_ways(found: FabricManager | None) -> None:
    host = HostReport(name="gpu-b01", status=HostStatus.CLEAN, fabric_manager=found)
    document = host_to_document(host)
    assert ("fabric_manager" in document) is (found is not None)
    assert host_from_document("gpu-b01", document) == host


@pytest.mark.parametrize(("value", "error"), [
    ({"state": "present", "version": None, "why": None}, "hosts.x.fabric_manager: a fabric manager present has no"),
    ({"state": "absent", "version": "1.2", "why": None}, "hosts.x.fabric_manager: a fabric manager absent has a"),
    ({"state": "gone", "version": None, "why": None}, "hosts.x.fabric_manager.state: 'gone' is no FmState"),
    ({"state": "present", "version": 535, "why": None}, "hosts.x.fabric_manager.version: expected a string or null"),
    ({"state": "not_observed", "version": None}, "hosts.x.fabric_manager.why: missing"),
    ("535.161.08", "fabric_manager: expected an object"),
])
def test_the_codec_is_strict(value: object, error: str) -> None:
    document = {**host_to_document(HostReport(name="x", status=HostStatus.CLEAN)), "fabric_manager": value}
    with pytest.raises(DocumentError, match=error.replace(".", r"\.")):
        host_from_document("x", document, "hosts.x")
