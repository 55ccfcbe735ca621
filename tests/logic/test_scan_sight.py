"""Whether the holder scan saw every process: "nothing found" is never read as "nothing there".

The real scan (GNU find over /proc) runs here against files that children of this
test hold, once as this user and, as root, once as nobody (setpriv): nobody may
not read root's fd tables, and the scan says which ones it could not read. Then
the verdicts on what a scan and ps printed (`scan_blindness`, `ps_blindness`),
the one-line error (`blind_error`), and the scan step failing on a blind look.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from support import scripted_node
from support.hidden_holders import TABLE_WAYS, HiddenHolders, hidden_holders
from support.processes import NOBODY

from fleet.inventory.host import Host
from fleet.model.errors import StepFailed
from fleet.model.hostlog import NoLog
from fleet.model.report import Reason, StepName
from fleet.node.budget import TimeBudget
from fleet.node.node import Node
from fleet.node.probes.procs import HolderRow, HolderScan, PsRow, holders_scan_argv, parse_ps, parse_scan, ps_argv
from fleet.reset.holders import Scan, blind_error, ps_blindness, scan, scan_blindness
from fleet.transport.scripted import Answer, Reply, ScriptedTransport

__all__ = ["hidden_holders"]  # the fixture, used by name

PERMISSION_DENIED = "permission denied on /proc/*/fd of"


class Holding:
    """Children that hold a file open (as their stdin) and sleep; killed by pid and reaped after the test."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def hold(self, path: Path, prefix: Sequence[str] = ()) -> int:
        path.touch()
        with path.open("rb") as file:
            child = subprocess.Popen([*prefix, "sleep", "120"], stdin=file, cwd="/")
        self.started.append(child)
        deadline = time.monotonic() + 10
        while os.stat(f"/proc/{child.pid}/fd").st_uid != self.uid(prefix) or not self.sleeping(child.pid):
            assert time.monotonic() < deadline, "the child did not start sleep as the user asked for"
            time.sleep(0.01)
        return child.pid

    @staticmethod
    def sleeping(pid: int) -> bool:
        """setpriv (when asked for) has switched user and exec'd sleep."""
        return Path(f"/proc/{pid}/comm").read_text().strip() == "sleep"

    @staticmethod
    def uid(prefix: Sequence[str]) -> int:
        return 65534 if prefix else os.geteuid()

    def end(self) -> None:
        for child in self.started:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
            child.wait()


@pytest.fixture
def holding() -> Iterator[Holding]:
    kids = Holding()
    yield kids
    kids.end()


def run_scan(globs: Sequence[str], prefix: Sequence[str] = ()) -> tuple[HolderScan, subprocess.CompletedProcess[str]]:
    done = subprocess.run([*prefix, *holders_scan_argv(globs)], capture_output=True, text=True, check=False,
                          timeout=60, cwd="/")
    assert done.returncode in (0, 1), done.stderr
    return parse_scan(done.stdout), done


def me() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def needs_root_and_setpriv() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the scan is run again as another user (nobody)")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")


# --- the real scan ------------------------------------------------------------------------------


def test_the_scan_as_this_user_finds_the_holder_and_sees_init(holding: Holding, tmp_path: Path) -> None:
    device = tmp_path / "nvidia0"
    pid = holding.hold(device)
    seen, done = run_scan([str(tmp_path / "nvidia*")])
    assert seen.rows == (HolderRow(pid, me(), (str(device),)),)
    assert seen.init_seen
    assert pid not in seen.unreadable
    if os.geteuid() == 0:
        assert seen.unreadable == ()  # root reads every fd table
        assert scan_blindness(seen, done.returncode, done.stderr) is None


def test_the_scan_as_nobody_says_whose_fd_tables_it_could_not_read(holding: Holding, tmp_path: Path) -> None:
    """root's holder is invisible to nobody's scan: the scan says so, and the verdict is blind, not "clean"."""
    needs_root_and_setpriv()
    rooted, mine = tmp_path / "nvidia0", tmp_path / "nvidia1"
    root_pid = holding.hold(rooted)
    nobody_pid = holding.hold(mine, prefix=NOBODY)
    globs = [str(tmp_path / "nvidia*")]

    as_root, done = run_scan(globs)
    assert {row.pid: row for row in as_root.rows} == {
        root_pid: HolderRow(root_pid, "root", (str(rooted),)),
        nobody_pid: HolderRow(nobody_pid, "nobody", (str(mine),)),
    }
    assert (as_root.init_seen, as_root.unreadable) == (True, ())
    assert scan_blindness(as_root, done.returncode, done.stderr) is None

    as_nobody, done = run_scan(globs, prefix=NOBODY)
    assert as_nobody.rows == (HolderRow(nobody_pid, "nobody", (str(mine),)),)  # its own process: readable
    assert as_nobody.init_seen  # /proc/1 is listed: no hidepid here
    assert {1, os.getpid(), root_pid} <= set(as_nobody.unreadable)
    assert nobody_pid not in as_nobody.unreadable
    why = scan_blindness(as_nobody, done.returncode, done.stderr)
    assert why == f"{PERMISSION_DENIED} {len(as_nobody.unreadable)} processes"
    host = Host(name="gpu-b02", address="gpu-b02", user="nobody")
    assert blind_error(host, why) == (
        f"cannot see every process on gpu-b02 as nobody ({why}): run as root or set become")


@pytest.mark.parametrize("way", TABLE_WAYS)
def test_the_scan_sees_a_holder_a_leaders_fd_table_does_not_show(hidden_holders: HiddenHolders, way: str,
                                                                 tmp_path: Path) -> None:
    """A thread's own file table, a process whose leader thread is gone, a mapping whose fd was closed: each holds
    the device, and the scan names the process (its pid, not a thread's)."""
    device = tmp_path / "nvidia0"
    device.touch()
    pid = hidden_holders.hold(way, device)
    fd_table = {os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")}
    assert str(device) not in fd_table  # what a scan of /proc/PID/fd alone would have missed
    seen, done = run_scan([str(tmp_path / "nvidia*")])
    assert [(row.pid, row.devices) for row in seen.rows] == [(pid, (str(device),))], done.stderr
    assert hidden_holders.alive(pid)


def test_the_scan_sees_a_device_held_under_a_path_in_another_mount_namespace(hidden_holders: HiddenHolders) -> None:
    """nobody bind-mounts the device on a file of its own choosing, in its own namespace, and opens it there: the
    link reads that path, which no glob matches; the scan still names the device (by its inode)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("unshare") is None:
        pytest.skip("needs root, setpriv and unshare: the holder runs as nobody (CI has them)")
    folder = Path(tempfile.mkdtemp(prefix="fleet-elsewhere-"))
    try:
        folder.chmod(0o755)
        device, target = folder / "dev" / "nvidia0", folder / "gpu"
        device.parent.mkdir(mode=0o755)
        device.write_bytes(b"")
        device.chmod(0o644)
        target.write_bytes(b"")
        pid = hidden_holders.elsewhere(device, target)
        links = {os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")}
        assert str(target) in links and str(device) not in links  # its link names the other path
        seen, done = run_scan([str(device.parent / "nvidia*")])
        assert [(row.pid, row.user, row.devices) for row in seen.rows] == [(pid, "nobody", (str(device),))], (
            done.stderr)
    finally:
        hidden_holders.end()
        shutil.rmtree(folder)


def test_ps_here_lists_pid_1() -> None:
    """ps on pid 1 and a live pid: it sees every process, so it vouches for the holders."""
    done = subprocess.run(ps_argv([1, os.getpid()]), capture_output=True, text=True, check=False)
    rows = parse_ps(done.stdout)
    assert set(rows) == {1, os.getpid()}
    assert ps_blindness(rows, done.returncode, done.stderr) is None


# --- the verdicts ------------------------------------------------------------------------------------

SAW_ALL = HolderScan((HolderRow(7, "root", ("/dev/nvidia0",)),), init_seen=True)


def test_a_scan_that_saw_init_and_read_every_fd_table_sees_everything() -> None:
    assert scan_blindness(SAW_ALL, 0, "") is None
    assert scan_blindness(HolderScan((), init_seen=True), 0, "") is None  # no holder: clean, truly
    assert scan_blindness(HolderScan((), init_seen=True), 1, "find: '/proc/99/fd': No such file") is None


@pytest.mark.parametrize(("unreadable", "count"), [((77,), "1 process"), ((12, 77, 4242), "3 processes")])
def test_unreadable_fd_tables_make_the_scan_blind(unreadable: tuple[int, ...], count: str) -> None:
    seen = HolderScan(SAW_ALL.rows, init_seen=True, unreadable=unreadable)
    assert scan_blindness(seen, 0, "") == f"{PERMISSION_DENIED} {count}"
    assert scan_blindness(HolderScan((), True, unreadable), 1, "") == f"{PERMISSION_DENIED} {count}"


def test_an_empty_scan_with_exit_1_did_not_run() -> None:
    """What a sudo refusal looks like: nothing printed, not even `init`, and exit 1."""
    seen = parse_scan("")
    assert seen == HolderScan()
    assert scan_blindness(seen, 1, "sudo: a password is required\n") == (
        "the holder scan did not run: exit 1: sudo: a password is required")
    assert scan_blindness(seen, None, "") == "the holder scan did not run: exit None: (no output)"


def test_a_scan_without_init_has_proc_1_hidden() -> None:
    """hidepid: /proc/1 (and every other user's process) is not even listed."""
    assert scan_blindness(HolderScan((), init_seen=False), 0, "") == "/proc/1 is hidden from it (hidepid)"
    assert scan_blindness(HolderScan(SAW_ALL.rows, init_seen=False), 1, "") == "/proc/1 is hidden from it (hidepid)"


INIT = PsRow(pid=1, ppid=0, user="root", args="/sbin/init")
HOLDER = PsRow(pid=4242, ppid=1, user="alice", args="python3 train.py")


def test_ps_that_lists_pid_1_sees_everything() -> None:
    assert ps_blindness({1: INIT, 4242: HOLDER}, 0, "") is None
    assert ps_blindness({1: INIT}, 1, "") is None  # the holders exited: ps exits 1, and that is an answer


def test_ps_without_pid_1_cannot_vouch_for_the_holders() -> None:
    assert ps_blindness({4242: HOLDER}, 0, "") == "ps cannot see pid 1 (hidepid)"
    assert ps_blindness({4242: HOLDER}, 1, "") == "ps cannot see pid 1 (hidepid)"


@pytest.mark.parametrize(
    ("rows", "status", "stderr", "why"),
    [
        ({}, 1, "sudo: a password is required\n", "ps did not run: exit 1: sudo: a password is required"),
        ({}, 0, "", "ps did not run: exit 0: (no output)"),
        ({4242: HOLDER}, 127, "ps: not found", "ps did not run: exit 127: ps: not found"),
        ({}, None, "", "ps did not run: exit None: (no output)"),
    ],
)
def test_ps_that_did_not_run(rows: dict[int, PsRow], status: int | None, stderr: str, why: str) -> None:
    assert ps_blindness(rows, status, stderr) == why


def test_blind_error_without_become() -> None:
    host = Host(name="gpu-b02", address="10.0.0.2", user="fleetops")
    assert blind_error(host, "permission denied on /proc/*/fd of 3 processes") == (
        "cannot see every process on gpu-b02 as fleetops (permission denied on /proc/*/fd of 3 processes): "
        "run as root or set become")


def test_blind_error_with_become() -> None:
    host = Host(name="gpu-b02", address="10.0.0.2", user="fleetops", become=True)
    assert blind_error(host, "the holder scan did not run: exit 1: sudo: a password is required") == (
        "cannot see every process on gpu-b02 as fleetops through sudo (the holder scan did not run: exit 1: "
        "sudo: a password is required): allow fleet's commands in sudoers (NOPASSWD) or run as root")


def test_blind_error_without_a_user() -> None:
    assert blind_error(Host(name="gpu-b02", address="10.0.0.2"), "ps cannot see pid 1 (hidepid)") == (
        "cannot see every process on gpu-b02 as the login user (ps cannot see pid 1 (hidepid)): "
        "run as root or set become")


# --- the scan step on a blind look ---------------------------------------------------------------


def node(find: Answer, ps: Answer | None = None, *, become: bool = False,
         log: scripted_node.Log | None = None) -> Node:
    script: list[tuple[tuple[str, ...], Answer]] = [(scripted_node.SCAN, find)]
    if ps is not None:  # the holders' description is one batch: ps, their exe links, lineage and cgroups
        script += [(("ps", "-ww"), ps), (scripted_node.EXE, Reply(stdout="")),
                   (scripted_node.LINEAGE, Reply(stdout="")), (("grep",), Reply(stdout=""))]
    host = Host(name="gpu-b02", address="10.0.0.2", user="fleetops", become=become, command_timeout=1.0)
    return Node(host, ScriptedTransport(script=script, become=become), log if log is not None else NoLog())


def in_turn(*replies: Reply) -> Answer:
    """One reply a call, in order (a node whose answer changes between two looks)."""
    left = iter(replies)
    return lambda argv: next(left)


def scans(n: Node) -> int:
    """How many holder scans the node was asked."""
    transport = n.transport
    assert isinstance(transport, ScriptedTransport)
    return sum(1 for argv in transport.ran if argv[:4] == scripted_node.SCAN)


async def look(n: Node) -> Scan:
    return await scan(n, StepName.VERIFY, TimeBudget(window=0.0, slack=5.0))


async def test_the_step_fails_when_fd_tables_were_unreadable() -> None:
    """Nothing found among what could be read is not "no holders": the step fails, saying why and what to do."""
    n = node(Reply(stdout="init\0unreadable\tbob\t/proc/77/task/77/fd\0unreadable\talice\t/proc/78/map_files\0",
                   exit_status=0),
             Reply(stdout=scripted_node.ps("   77     1 bob      python3\n   78     1 alice    python3\n")))
    with pytest.raises(StepFailed) as info:
        await look(n)
    assert str(info.value) == ("cannot see every process on gpu-b02 as fleetops (permission denied on /proc/*/fd "
                               "of 2 processes): run as root or set become")
    assert info.value.reason is Reason.BLIND_SCAN
    assert scans(n) == 2  # looked once more: unreadable both times


async def test_an_fd_table_unreadable_because_its_process_exited_mid_scan_hides_nothing() -> None:
    """find's -readable is false for a /proc/PID/fd whose process exited between the listing and the look
    (seen as root, mid-kill): a process that is gone is no blind spot; one still there is."""
    n = node(Reply(stdout="init\0unreadable\troot\t/proc/77/task/77/fd\0unreadable\talice\t/proc/78/task/80/fd\0",
                   exit_status=1),
             Reply(stdout=scripted_node.ps("   78     1 alice    python3\n")))
    with pytest.raises(StepFailed, match=r"permission denied on /proc/\*/fd of 1 process\)"):
        await look(n)
    gone = node(Reply(stdout="init\0unreadable\troot\t/proc/77/task/77/fd\0", exit_status=1),
                Reply(stdout=scripted_node.ps("")))
    assert await look(gone) == Scan()
    assert scans(gone) == 1  # a table whose process is gone hides nothing: no second look


async def test_a_ps_that_cannot_vouch_never_makes_an_unreadable_table_gone() -> None:
    """ps failed, printing nothing (or hidepid hid pid 1 from it): its silence is no "the process is gone", and the
    unreadable table keeps the scan blind."""
    for silent in (Reply(stdout="", stderr="ps: fatal error\n", exit_status=1),
                   Reply(stdout=" 4242     1 root     python3 train.py\n")):  # hidepid: no pid 1
        n = node(Reply(stdout="init\0unreadable\talice\t/proc/78/task/80/fd\0", exit_status=1), silent)
        with pytest.raises(StepFailed, match=r"permission denied on /proc/\*/fd of 1 process\)"):
            await look(n)


async def test_a_table_unreadable_while_its_thread_tore_down_is_looked_at_again() -> None:
    """A killed process's last threads, its leader a zombie that ps still lists: its table read as unreadable.
    The second look, whole, reads it and stands alone: clean when it finds nothing, its holder judged when it
    finds one; logged as `scan_unreadable` with the pids."""
    tearing = Reply(stdout="init\0unreadable\troot\t/proc/77/task/79/fd\0", exit_status=0)
    log = scripted_node.Log()
    n = node(in_turn(tearing, Reply(stdout=scripted_node.scan(""))),
             Reply(stdout=scripted_node.ps("   77     1 root     [python3] <defunct>\n")), log=log)
    assert await look(n) == Scan()
    assert scans(n) == 2
    assert log.first("scan_unreadable") == {"pids": [77], "looking": "again"}

    holds = scripted_node.scan("root\t/proc/77/task/79/fd/3\t/dev/nvidia0")
    found = node(in_turn(tearing, Reply(stdout=holds)),
                 Reply(stdout=scripted_node.ps("   77     1 root     python3 train.py\n")))
    assert [(h.pid, h.devices) for h in (await look(found)).holders] == [(77, ("/dev/nvidia0",))]


async def test_the_step_fails_when_sudo_refused_the_scan() -> None:
    n = node(Reply(stdout="", stderr="sudo: a password is required\n", exit_status=1), become=True)
    with pytest.raises(StepFailed) as info:
        await look(n)
    assert str(info.value) == (
        "cannot see every process on gpu-b02 as fleetops through sudo (the holder scan did not run: exit 1: "
        "sudo: a password is required): allow fleet's commands in sudoers (NOPASSWD) or run as root")


async def test_the_step_fails_when_ps_cannot_see_pid_1() -> None:
    n = node(Reply(stdout=scripted_node.scan("root\t/proc/4242/task/4242/fd/3\t/dev/nvidia0\n")),
             Reply(stdout=" 4242     1 root     python3 train.py\n"))
    with pytest.raises(StepFailed, match=r"as fleetops \(ps cannot see pid 1 \(hidepid\)\): run as root or set become"):
        await look(n)


async def test_a_scan_that_saw_everything_and_found_nothing_is_clean() -> None:
    """It saw /proc/1 and read every fd table: no holder is no holder (find's exit 1 for a pid that vanished
    mid-scan changes nothing)."""
    assert await look(node(Reply(stdout=scripted_node.scan("")))) == Scan()
    vanished = Reply(stdout="init\0", stderr="find: '/proc/99/fd': No such file or directory\n", exit_status=1)
    assert await look(node(vanished)) == Scan()
