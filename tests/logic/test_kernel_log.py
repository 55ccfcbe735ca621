"""The kernel-log read: kernel_log.sh and xids.awk run here (real sh, real awk) over what the real journalctl
printed (tests/fixtures/journalctl, captured from systemd 252: see its SOURCES.md), and over Xid storms.

A fake `journalctl` first on PATH replays a capture: its stdout, its stderr, its exit status. Only a read that
ran to its end (exit 0, the summary's end line, a cursor) is a `KernelLog`; anything else is `KernelLogUnread`
with journalctl's own words.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.paths import FIXTURES

from fleet.node.probes.kernel_log import (
    GROUPS,
    HANG,
    PIDS_APART,
    KernelLog,
    KernelLogUnread,
    Xid,
    read,
    read_argv,
    reading,
)
from fleet.transport.base import OUTPUT_LIMIT, CommandResult

CAPTURES = FIXTURES / "journalctl"
_SPEC = importlib.util.spec_from_file_location("journal_capture", CAPTURES / "capture.py")
assert _SPEC is not None and _SPEC.loader is not None
CAPTURE_SCRIPT = importlib.util.module_from_spec(_SPEC)  # its journal writer and messages
_SPEC.loader.exec_module(CAPTURE_SCRIPT)
MIB = 1024 * 1024
# A real Xid 13 line with no pid (tests/fixtures/kernel-log/gpud-readme_dmesg-ctime_xid-13-31-109.log).
XID_13 = ("NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on "
          "(GPC 7, TPC 7, SM 0): Illegal Instruction Parameter")
XID_79 = "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus"  # (message_xid-79-fallen-off-the-bus.log)
CURSOR = "s=60435406595b49c2ad6597c8b8ca1832;i=d;b=0f1e2d3c4b5a69788796a5b4c3d2e1f0;m=132e4a4d40;t=620f6fe6f13c0;x=1"
# (a cursor of journalctl's form; the fake journalctl answers whatever it is given)


def capture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CAPTURES / f"{name}.json").read_text())
    return data


@dataclass(frozen=True)
class Ran:
    """What the read printed here, and the journalctl argv it ran."""

    result: CommandResult
    journalctl_argv: list[str]


def run_read(tmp_path: Path, stdout: str, stderr: str = "", status: int = 0, cursor: str | None = None) -> Ran:
    """The probe's argv, run here with a journalctl on PATH that prints `stdout` and `stderr` and exits `status`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "out").write_bytes(stdout.encode("utf-8", "surrogateescape"))  # a capture's bytes, as printed
    (tmp_path / "err").write_text(stderr)
    fake = bin_dir / "journalctl"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {shlex.quote(str(tmp_path / "argv"))}\n'
                    f"cat {shlex.quote(str(tmp_path / 'out'))}\ncat {shlex.quote(str(tmp_path / 'err'))} >&2\n"
                    f"exit {status}\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    argv = read_argv(cursor)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30, check=False)
    ran = (tmp_path / "argv").read_text().splitlines()
    return Ran(CommandResult(argv=tuple(argv), exit_status=done.returncode, stdout=done.stdout, stderr=done.stderr,
                             duration_s=0.1), ran)


def replay(tmp_path: Path, name: str, cursor: str | None = None) -> Ran:
    got = capture(name)
    return run_read(tmp_path, got["stdout"], got["stderr"], got["exit_status"], cursor)


def short_unix(at: float, message: str) -> str:
    return f"{at:.6f} gpu-a01 kernel: {message}\n"


# --- the command ---------------------------------------------------------------


def test_the_read_asks_journalctl_what_the_captures_answer(tmp_path: Path) -> None:
    """No --grep, no -q (its hints say why a read saw nothing); the cursor after, when given."""
    assert replay(tmp_path, "since-boot").journalctl_argv == capture("since-boot")["fleet_argv"][1:]
    after = capture("after-cursor-two-new")["fleet_argv"]
    cursor = after[-1].removeprefix("--after-cursor=")
    assert replay(tmp_path, "after-cursor-two-new", cursor).journalctl_argv == after[1:]


def test_the_probe_needs_root_reads_every_exit_and_names_a_hang() -> None:
    probe = read()
    assert probe.argv[:2] == ("sh", "-c") and probe.argv[3] == "fleet-kernel-log"
    assert probe.needs_root and probe.ok_exits is None and probe.hang == HANG
    assert read(CURSOR).argv[-1] == CURSOR


@pytest.mark.parametrize("bad", ["", "s=1;$(reboot)", "s=1 i=2", "s=1;i=2;", "--grep=x", "S=1", "s=xyz"])
def test_a_cursor_is_checked_before_it_goes_anywhere(bad: str) -> None:
    with pytest.raises(ValueError, match="not a journal cursor"):
        read_argv(bad)


def test_the_programs_are_posix() -> None:
    """sh -n parses the shell program; awk (here mawk or gawk) parses the awk one."""
    argv = read_argv()
    assert subprocess.run(["sh", "-n", "-c", argv[2]], check=False).returncode == 0
    check = subprocess.run(["awk", argv[4]], input="", capture_output=True, text=True, check=False)
    assert check.returncode == 125 and check.stdout == "end - 0 0 0\n"  # no journalctl status came: no answer


# --- what the real journalctl printed ---------------------------------------------------


def test_a_whole_boot_read_keeps_each_kind_of_xid_once_with_its_count(tmp_path: Path) -> None:
    got = capture("since-boot")
    log = reading(replay(tmp_path, "since-boot").result)
    assert log.cursor == got["stdout"].splitlines()[-1].removeprefix("-- cursor: ")
    assert log.lines == 7
    assert [(x.pci, x.code, x.count, x.pid) for x in log.xids] == [
        ("0000:cb:00", 13, 3, None), ("0000:cb:00", 109, 1, 1797828), ("0000:cb:00", 31, 1, 626486),
        ("0000:cb:00", 109, 1, 1158578), ("0000:44:00", 79, 1, None),
    ]
    thirteen = log.xids[0]
    assert (thirteen.at, thirteen.last) == (1725018189.0, 1725018189.0)
    assert thirteen.detail.endswith("Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter")
    assert log.xids[1].process == "pt_main_thread" and thirteen.process is None


def test_what_came_after_the_cursor(tmp_path: Path) -> None:
    log = reading(replay(tmp_path, "after-cursor-two-new", CURSOR).result)
    assert [(x.pci, x.code, x.pid, x.process) for x in log.xids] == [
        ("0000:dc:00", 45, 1818990, "python3"), ("0000:ed:00", 45, 1818992, "python3")]
    assert log.cursor == capture("after-cursor-two-new")["stdout"].splitlines()[-1].removeprefix("-- cursor: ")


@pytest.mark.parametrize("name", ["after-cursor-nothing-new", "quiet-after-cursor-nothing-new"])
def test_nothing_after_the_cursor_is_a_whole_read_with_no_xid(tmp_path: Path, name: str) -> None:
    log = reading(replay(tmp_path, name, CURSOR).result)
    assert log == KernelLog(capture(name)["stdout"].splitlines()[-1].removeprefix("-- cursor: "), (), 0)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("no-journal-files", "journalctl exited 1: No journal files were found."),
        ("no-journal-files-in-directory", "journalctl exited 1: No journal files were found."),
        ("no-permission", "journalctl exited 1: Hint: You are currently not seeing messages from other users and "
                          "the system."),
        ("quiet-no-permission", "journalctl exited 1: nothing on stderr"),
        ("bad-cursor", "journalctl exited 1: Failed to seek to cursor: Invalid argument"),
        # what `--grep` answers for no match: a whole read, but never "no Xids" by fleet's rule (exit 1)
        ("grep-no-match", "journalctl exited 1: nothing on stderr"),
    ],
)
def test_a_read_that_did_not_run_to_its_end_is_no_answer(tmp_path: Path, name: str, why: str) -> None:
    ran = replay(tmp_path, name)
    assert ran.result.exit_status == capture(name)["exit_status"]  # journalctl's status is the command's
    with pytest.raises(KernelLogUnread) as caught:
        reading(ran.result)
    assert caught.value.why == why


def test_exit_0_without_a_cursor_read_no_kernel_message(tmp_path: Path) -> None:
    """A journalctl that exits 0 having read nothing (newer versions, a user's own journal): no cursor, no answer."""
    hint = capture("no-permission")["stderr"]
    ran = run_read(tmp_path, "-- No entries --\n", hint, 0)
    with pytest.raises(KernelLogUnread, match=r"read no kernel message of this boot \(it named no cursor\): Hint: You"):
        reading(ran.result)


def test_no_journalctl_at_all(tmp_path: Path) -> None:
    """A node without journalctl (no systemd): sh says so, and that is why."""
    for tool in ("sh", "awk"):
        (tmp_path / tool).symlink_to(shutil.which(tool) or tool)
    argv = read_argv()
    done = subprocess.run(argv, capture_output=True, text=True, env={"PATH": str(tmp_path)}, timeout=30, check=False)
    with pytest.raises(KernelLogUnread, match=r"journalctl exited 127: .*journalctl.*not found"):
        reading(CommandResult(argv=tuple(argv), exit_status=done.returncode, stdout=done.stdout, stderr=done.stderr,
                              duration_s=0.1))


def test_output_cut_anywhere_is_no_answer(tmp_path: Path) -> None:
    """The transport's bound, a batch ended early: without the end line, never "no Xids"."""
    whole = replay(tmp_path, "since-boot").result
    for cut in range(len(whole.stdout)):
        part = CommandResult(argv=whole.argv, exit_status=0, stdout=whole.stdout[:cut], stderr="", duration_s=0.1)
        if part.stdout.endswith(whole.stdout.splitlines()[-1]):
            continue  # the whole end line is there (only its newline cut): the read is whole
        with pytest.raises(KernelLogUnread):
            reading(part)


def test_an_xid_line_fleet_cannot_read_is_no_answer(tmp_path: Path) -> None:
    text = short_unix(1.0, "NVRM: Xid (PCI:0000:cb:00): garbled") + f"-- cursor: {CURSOR}\n"
    with pytest.raises(KernelLogUnread, match="an Xid line fleet cannot read"):
        reading(run_read(tmp_path, text).result)


# --- bytes: what journald keeps is what the kernel wrote -------------------------------------------------

# The Xid 13 of the `bytes` capture names a thread whose name the kernel cut at 15 bytes, mid-character.
CUT_NAME: bytes = CAPTURE_SCRIPT.CUT_NAME


def test_an_xid_naming_a_thread_cut_mid_utf8_is_seen_with_the_name_as_the_kernel_wrote_it(tmp_path: Path) -> None:
    """The real journalctl's -a output (tests/fixtures/journalctl/bytes.json): every Xid is read, whatever its bytes;
    a name comes back escaped in the text and exact as bytes; a message of two lines is one Xid, its name whole."""
    log = reading(replay(tmp_path, "bytes").result)
    assert [(x.code, x.pid, x.process_name) for x in log.xids] == [
        (13, 4242, CUT_NAME), (43, 4243, b"caf\xe9"), (31, 4245, b"a\nb"),
    ]
    assert log.xids[0].process == "py\\xe6\\x97\\xa5\\xe6\\x9c\\xac\\xe8\\xaa\\x9e\\xe3\\x83\\x86\\xe3"
    assert log.xids[2].detail == "pid=4245, name=a\\x0ab, MMU Fault" and log.lines == 3
    assert CUT_NAME.decode("utf-8", "replace").endswith("\ufffd")  # not UTF-8: what `[N blob data]` hid


def test_a_real_journal_holding_an_xid_whose_thread_name_is_cut_mid_utf8(tmp_path: Path) -> None:
    """The read itself (kernel_log.sh, xids.awk) over the real journalctl reading a journal that the real
    systemd-journal-remote wrote (capture.py's BYTES, as journald keeps them): the Xid 13 is seen, its name exact."""
    if shutil.which("journalctl") is None or not Path(CAPTURE_SCRIPT.REMOTE).exists():
        pytest.skip("needs journalctl and systemd-journal-remote (apt-get install systemd-journal-remote)")
    journal = tmp_path / "system.journal"
    CAPTURE_SCRIPT.write_journal(journal, [(1_700_000_000_000_000 + i, m) for i, m in enumerate(CAPTURE_SCRIPT.BYTES)],
                                 1_600_000_000_000_000)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "journalctl"
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("journalctl")} --file={shlex.quote(str(journal))} "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(read_argv(), capture_output=True, text=True, env=env, timeout=30, check=False)
    log = reading(CommandResult(argv=tuple(read_argv()), exit_status=done.returncode, stdout=done.stdout,
                                stderr=done.stderr, duration_s=0.1))
    assert [(x.code, x.pid, x.process_name) for x in log.xids] == [
        (13, 4242, CUT_NAME), (43, 4243, b"caf\xe9"), (31, 4245, b"a\nb"),
    ]


def test_a_journalctl_that_prints_blob_data_is_no_answer(tmp_path: Path) -> None:
    """Without -a (bytes-without-a.json) the Xid 13 and 43 are `[N blob data]`: the read says so, never "no Xid"."""
    with pytest.raises(KernelLogUnread, match=r"^3 kernel messages journalctl did not print as their bytes"):
        reading(replay(tmp_path, "bytes-without-a").result)


def test_a_further_line_with_no_message_before_it_is_no_answer(tmp_path: Path) -> None:
    text = "                                  b, MMU Fault\n" + f"-- cursor: {CURSOR}\n"
    with pytest.raises(KernelLogUnread, match="did not print as their bytes"):
        reading(run_read(tmp_path, text).result)


def test_a_name_inside_another_message_makes_no_xid(tmp_path: Path) -> None:
    """A process may name itself `NVRM: Xid (` (15 bytes): the kernel prints it inside its own messages, whose
    text starts elsewhere; a thread name holding a newline cannot start a message's first line either."""
    text = (short_unix(1.0, "traps: NVRM: Xid ([7] general protection fault ip:0 sp:0 error:0")
            + short_unix(2.0, "NVRM: Xid (PCI:0000:cb:00): 13, pid=9, name=x")
            + " " * (len(short_unix(2.0, "")) - 1) + "NVRM: Xid (PCI:0, y\n"
            + f"-- cursor: {CURSOR}\n")
    log = reading(run_read(tmp_path, text).result)
    assert [(x.code, x.pid, x.detail) for x in log.xids] == [(13, 9, "pid=9, name=x\\x0aNVRM: Xid (PCI:0, y")]


# --- storms ----------------------------------------------------------------------


def test_more_than_a_mib_of_xid_13_before_an_xid_79(tmp_path: Path) -> None:
    """What made the old read clip (journalctl prints oldest first; the transport keeps 1 MiB): 8,000 Xid 13 lines,
    then the Xid that matters. The summary is a few hundred bytes and ends with the 79."""
    storm = "".join(short_unix(1725018189 + i / 1000, XID_13) for i in range(8000))
    text = storm + short_unix(1725018198, XID_79) + f"-- cursor: {CURSOR}\n"
    assert len(text) > OUTPUT_LIMIT == MIB
    ran = run_read(tmp_path, text)
    assert len(ran.result.stdout) < 1024
    log = reading(ran.result)
    assert [(x.code, x.count) for x in log.xids] == [(13, 8000), (79, 1)]
    assert (log.xids[0].at, log.xids[0].last) == (1725018189.0, 1725018196.999)
    assert log.lines == 8001


def test_a_storm_of_many_pids_is_folded_and_a_storm_of_kinds_is_no_answer(tmp_path: Path) -> None:
    pids = "".join(short_unix(1.0 + pid, f"NVRM: Xid (PCI:0000:cb:00): 45, pid={pid}, name=python3, Ch 00000001")
                   for pid in range(100, 100 + 3 * PIDS_APART))
    log = reading(run_read(tmp_path, pids + f"-- cursor: {CURSOR}\n").result)
    assert [(x.pid, x.count, x.folded) for x in log.xids] == [
        *((100 + i, 1, False) for i in range(PIDS_APART)), (None, 2 * PIDS_APART, True)]
    kinds = "".join(short_unix(1.0, f"NVRM: Xid (PCI:0000:{bus:02x}:00): {code}, x")
                    for bus in range(GROUPS // 8 + 1) for code in range(1, 9))
    ran = run_read(tmp_path, kinds + f"-- cursor: {CURSOR}\n")
    assert len(ran.result.stdout) < GROUPS * 200
    with pytest.raises(KernelLogUnread, match=f"8 Xid lines of more than {GROUPS} kinds were not kept"):
        reading(ran.result)


def test_a_kept_line_is_cut_at_its_width_but_still_read(tmp_path: Path) -> None:
    long = XID_79 + ", " + "x" * 2000
    log = reading(run_read(tmp_path, short_unix(5.0, long) + f"-- cursor: {CURSOR}\n").result)
    (xid,) = log.xids
    assert (xid.code, xid.pci) == (79, "0000:44:00") and len(xid.detail) < 600


def test_groups_are_xids() -> None:
    assert Xid(at=1.0, pci="0000:cb:00", code=45, detail="pid=7, name=python3, Ch 00000001").pid == 7
    assert Xid(at=1.0, pci="0000:cb:00", code=45, detail="pid=7, name=python3, Ch 00000001", folded=True).pid is None
    assert Xid(at=1.0, pci="0000:cb:00", code=13, detail="pid='<unknown>', name=<unknown>, x").pid is None
