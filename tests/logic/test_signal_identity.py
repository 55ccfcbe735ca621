"""The identity-checked signal (signal.sh) run for real against children of this test.

A process is signalled only while it is still the one fleet judged: the same
start time, executable and owner. A reused pid (simulated by a start time that
does not match: writing /proc/sys/kernel/ns_last_pid would affect the whole
machine), another executable or another owner is `changed` and is left alone; a
dead pid or a zombie is `gone`; a look (ALIVE) signals nothing.

The children block SIGTERM, so a TERM sent to one stays pending (/proc/PID/status
ShdPnd) where the test can see it: "was it signalled?" is read, never guessed
from timing.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.processes import (
    NOBODY,
    Children,
    dead_pid,
    identity_of,
    run_signal,
    start_time,
    state,
    term_pending,
)
from support.processes import children as children  # the fixture: children killed by pid after the test

from fleet.node.probes import procs
from fleet.node.probes.procs import ALIVE, Identity


def other_user(user: str) -> str:
    return "nobody" if user != "nobody" else "root"


# --- the program -------------------------------------------------------------------


def test_the_program_is_signal_sh_without_its_comments() -> None:
    source = (Path(procs.__file__).parent / "signal.sh").read_text().splitlines()
    code = [line for line in source if line.strip() and not line.lstrip().startswith("#")]
    assert procs.SIGNAL_SH.splitlines() == code
    assert any(line.startswith("#") for line in source)


# --- one target at a time ---------------------------------------------------------------


def test_the_right_identity_is_sent_the_signal(children: Children) -> None:
    child = children.blocking_term()
    assert not term_pending(child.pid)
    assert run_signal("TERM", [identity_of(child.pid)]) == {child.pid: "sent"}
    assert term_pending(child.pid)


def test_kill_reaches_the_right_identity(children: Children) -> None:
    child = children.blocking_term()
    assert run_signal("SIGKILL", [identity_of(child.pid)]) == {child.pid: "sent"}
    assert child.wait(timeout=10) == -signal.SIGKILL


def test_a_reused_pid_is_changed_and_not_signalled(children: Children) -> None:
    """What a reused pid looks like: the process at that pid started later than the one judged."""
    child = children.blocking_term()
    judged = identity_of(child.pid)
    earlier = Identity(pid=judged.pid, start=judged.start - 1, exe=judged.exe, user=judged.user)
    assert run_signal("TERM", [earlier]) == {child.pid: "changed"}
    assert run_signal("KILL", [earlier]) == {child.pid: "changed"}
    assert not term_pending(child.pid)
    assert child.poll() is None  # not even the KILL reached it


def test_another_executable_is_changed_and_not_signalled(children: Children) -> None:
    child = children.blocking_term()
    judged = identity_of(child.pid)
    other = Identity(pid=child.pid, start=judged.start, exe=b"/usr/bin/not-this-one", user=judged.user)
    assert run_signal("TERM", [other]) == {child.pid: "changed"}
    assert not term_pending(child.pid)


@pytest.mark.parametrize("name", [b"caf\xe9", b"a\nb\tc d", b"\\0101%s$(x)\xff\n"],
                         ids=["latin1", "newline", "escapes"])
def test_an_executable_path_of_any_bytes_is_itself_and_only_itself(children: Children, tmp_path: Path,
                                                                    name: bytes) -> None:
    """Compared as bytes on the node: a path that is not UTF-8 (or holds newlines, backslashes) is signalled
    when it is the one judged; another path that reads the same once decoded (both not UTF-8) is not."""
    folder = os.path.join(bytes(tmp_path), name)
    os.mkdir(folder)
    exe = os.path.join(folder, b"sleep" + name)
    shutil.copy(b"/bin/sleep", exe)
    child = children.plain([os.fsdecode(exe), "120"])
    deadline = time.monotonic() + 10
    while os.readlink(f"/proc/{child.pid}/exe".encode()) != exe:
        assert time.monotonic() < deadline, "the child did not exec"
        time.sleep(0.01)
    judged = identity_of(child.pid)
    assert judged.exe == exe
    lookalike = exe.replace(b"\xe9", b"\xe8").replace(b"\xff", b"\xfe").replace(b"\t", b" ")
    other = Identity(pid=child.pid, start=judged.start, exe=lookalike, user=judged.user)
    assert run_signal("KILL", [other]) == {child.pid: "changed"}
    assert child.poll() is None
    assert run_signal("KILL", [judged]) == {child.pid: "sent"}
    assert child.wait(timeout=10) == -signal.SIGKILL


def test_printf_b_gives_every_byte_back_through_the_nodes_sh() -> None:
    """How signal.sh reads the exe it is given (`printf '%bx'`, the x keeping final newlines), on /bin/sh."""
    raw = bytes(range(1, 256)) + b"\\0101\\c%s\n\n"
    done = subprocess.run(["sh", "-c", "want=$(printf '%bx' \"$1\"); printf '%s' \"${want%x}\"", "sh",
                           procs.printf_b(raw)], capture_output=True, check=False, timeout=30)
    assert done.returncode == 0 and done.stdout == raw


def test_another_owner_is_changed_and_not_signalled(children: Children) -> None:
    child = children.blocking_term()
    judged = identity_of(child.pid)
    stranger = Identity(pid=child.pid, start=judged.start, exe=judged.exe, user=other_user(judged.user))
    assert run_signal("TERM", [stranger]) == {child.pid: "changed"}
    assert not term_pending(child.pid)


def test_an_executable_not_recorded_is_not_checked(children: Children) -> None:
    """The exe lookup may not have read the link: start time and owner still decide."""
    child = children.blocking_term()
    judged = identity_of(child.pid)
    unread_exe = Identity(pid=child.pid, start=judged.start, exe=None, user=judged.user)
    assert run_signal("TERM", [unread_exe]) == {child.pid: "sent"}
    assert term_pending(child.pid)


def test_a_deleted_executable_is_still_the_same_process(children: Children, tmp_path: Path) -> None:
    """A binary replaced by a package upgrade reads `PATH (deleted)`: the process is still the one judged."""
    binary = tmp_path / "sleeper"
    shutil.copy2(shutil.which("sleep") or "/bin/sleep", binary)
    try:
        child = children.plain([str(binary), "120"])
    except OSError as exc:
        pytest.skip(f"cannot run a copied binary from {tmp_path}: {exc}")
    deadline = time.monotonic() + 10
    while os.readlink(f"/proc/{child.pid}/exe") != str(binary):  # exec'd
        assert time.monotonic() < deadline
        time.sleep(0.01)
    judged = identity_of(child.pid)
    binary.unlink()
    assert os.readlink(f"/proc/{child.pid}/exe") == f"{binary} (deleted)"
    assert run_signal("TERM", [judged]) == {child.pid: "sent"}
    assert child.wait(timeout=10) == -signal.SIGTERM


def test_a_dead_pid_is_gone() -> None:
    pid = dead_pid()
    assert run_signal("TERM", [Identity(pid=pid, start=12345, exe=b"/usr/bin/true", user="root")]) == {pid: "gone"}
    assert run_signal(ALIVE, [Identity(pid=pid, start=12345, exe=None, user="root")]) == {pid: "gone"}


def test_a_zombie_is_gone_and_stays_unreaped(children: Children) -> None:
    """A child that exited and was not reaped holds no files and no memory: gone, whatever it was."""
    child, judged = children.zombie()
    assert run_signal("TERM", [judged]) == {child.pid: "gone"}
    assert run_signal(ALIVE, [judged]) == {child.pid: "gone"}
    assert state(child.pid) == "Z"
    assert child.wait(timeout=10) == -signal.SIGKILL


def test_alive_only_looks(children: Children) -> None:
    child = children.blocking_term()
    judged = identity_of(child.pid)
    assert run_signal(ALIVE, [judged]) == {child.pid: "alive"}
    assert run_signal(ALIVE, [Identity(pid=child.pid, start=judged.start + 1, exe=judged.exe, user=judged.user)]) == {
        child.pid: "changed"}
    assert not term_pending(child.pid)
    assert child.poll() is None


# --- several targets in one command ---------------------------------------------------------


def test_several_targets_each_get_their_own_verdict(children: Children) -> None:
    right, reused = children.blocking_term(), children.blocking_term()
    zombie, was = children.zombie()
    dead = dead_pid()
    judged = identity_of(reused.pid)
    targets = [
        identity_of(right.pid),
        Identity(pid=reused.pid, start=judged.start - 1, exe=judged.exe, user=judged.user),
        Identity(pid=dead, start=99, exe=None, user="root"),
        was,
    ]
    assert run_signal("TERM", targets) == {right.pid: "sent", reused.pid: "changed", dead: "gone",
                                           zombie.pid: "gone"}
    assert (term_pending(right.pid), term_pending(reused.pid)) == (True, False)
    assert run_signal(ALIVE, targets) == {right.pid: "alive", reused.pid: "changed", dead: "gone",
                                          zombie.pid: "gone"}


# --- a user who may not signal the process -----------------------------------------------------


def test_a_refused_kill_is_denied(children: Children) -> None:
    """signal.sh run as nobody against root's child: the identity holds, the kill is refused."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the test signals root's child as another user")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    child = children.blocking_term()
    judged = identity_of(child.pid)
    # nobody may not read root's exe link
    unread_exe = Identity(pid=child.pid, start=judged.start, exe=None, user=judged.user)
    assert run_signal("TERM", [unread_exe], prefix=NOBODY) == {child.pid: "denied"}
    assert run_signal(ALIVE, [unread_exe], prefix=NOBODY) == {child.pid: "alive"}
    assert run_signal("TERM", [judged], prefix=NOBODY) == {child.pid: "changed"}  # the exe cannot be vouched for
    assert not term_pending(child.pid)


def unnamed_uid() -> int:
    """A uid with no passwd entry (a container's user, seen from the host)."""
    for uid in range(4321, 5321):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise AssertionError("no free uid")


def test_a_process_of_a_user_without_a_name_is_still_the_one_judged(children: Children, tmp_path: Path) -> None:
    """The scan records a nameless owner as its uid (find's %u): signal.sh must match it by uid (a container's
    users, seen from the host, often have no name there)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the child runs as a uid with no name")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    uid = unnamed_uid()
    device = tmp_path / "nvidia0"
    device.touch()
    with device.open("rb") as file:
        child = children.track(subprocess.Popen(
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "120"], stdin=file, cwd="/"))
    deadline = time.monotonic() + 10
    while os.stat(f"/proc/{child.pid}/fd").st_uid != uid or Path(f"/proc/{child.pid}/comm").read_text() != "sleep\n":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    scan = procs.parse_scan(subprocess.run(procs.holders_scan_argv([str(tmp_path / "nvidia*")]), capture_output=True,
                                           text=True, check=False).stdout)
    (row,) = scan.rows
    assert (row.pid, row.user) == (child.pid, str(uid))  # how the scan, and so fleet, records the owner
    exe = os.fsencode(os.readlink(f"/proc/{child.pid}/exe"))
    judged = Identity(pid=child.pid, start=start_time(child.pid), exe=exe, user=row.user)
    assert run_signal("TERM", [judged]) == {child.pid: "sent"}
