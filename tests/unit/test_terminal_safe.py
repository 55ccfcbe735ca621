"""What a node said, as a person may safely see it (fleet.text.terminal_safe): nothing in it acts on a terminal."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.model.report import HostReport, HostStatus, Reason, RunReport
from fleet.report.render import human_lines
from fleet.slurm.policy import failed_reason
from fleet.text import terminal_safe, terminal_safe_lines


@pytest.mark.parametrize(("said", "seen"), [
    ("\r\x1b[2Kgpu-b01 clean\x1b[8m", "\\x0d\\x1b[2Kgpu-b01 clean\\x1b[8m"),
    ("a\nb\tc", "a\\x0ab\\x09c"),
    ("\x7f\x9b31m", "\\x7f\\x9b31m"),
    ("evil\u202etxt.exe\u2066\u2028", "evil\\u202etxt.exe\\u2066\\u2028"),
    ("python3.11 caf\u00e9 \u4e2d", "python3.11 caf\u00e9 \u4e2d"),  # text that shows is left as it is
    ("runs-\udcff", "runs-\\xff"),  # a byte that is not UTF-8 (surrogate escape), as printable says it
])
def test_every_character_that_acts_is_written_as_its_escape(said: str, seen: str) -> None:
    assert terminal_safe(said) == seen


@given(st.text())
def test_nothing_shown_acts_on_a_terminal(said: str) -> None:
    out = terminal_safe(said)
    out.encode("utf-8")  # a UTF-8 writer takes it
    assert not [c for c in out if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or c in "\u202a\u202b\u202c\u202d\u202e"
                "\u2066\u2067\u2068\u2069\u200e\u200f\u061c\u2028\u2029"]


def test_fleets_own_lines_keep_their_breaks() -> None:
    said = terminal_safe_lines("gpu-b01 failed: \x1b[8m\nreset of 1 hosts\n")
    assert said == "gpu-b01 failed: \\x1b[8m\nreset of 1 hosts\n"


def test_a_nodes_newline_never_forges_a_summary_line() -> None:
    """An error carrying `\\ngpu-b02 clean` stays on its host's line; the tally is fleet's."""
    report = RunReport(run_id="run-1", command="check", started_at="2026-12-06T08:00:00+00:00", duration_s=1.0, hosts={
        "gpu-b01": HostReport(name="gpu-b01", status=HostStatus.FAILED, duration_s=1.0, error="pid 7 x\ngpu-b02 clean",
                              reason=Reason.HOLDERS_LEFT)})
    lines = human_lines(report)
    assert lines[0] == "gpu-b01 failed holders_left: pid 7 x\\x0agpu-b02 clean"
    assert all("\n" not in line for line in lines)


def test_a_slurm_reason_holds_no_byte_that_acts() -> None:
    assert failed_reason("run-1", "pid 7 \x1b[8mx") == "fleet: run run-1: pid 7 \\x1b[8mx"
