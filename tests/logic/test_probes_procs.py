"""Process probes: argv shapes, parsers, the probes' declarations, and round trips on this machine."""

from __future__ import annotations

import ast
import fnmatch
import inspect
import os
import pwd
import re
import stat
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import pytest
from support.processes import Children, dead_pid, identity_of, run_signal, state
from support.processes import children as children  # the fixture: children killed by pid after the test

from fleet.node import probes
from fleet.node.probe import ANY_EXIT
from fleet.node.probes import lineage, parse, procs, smi, units
from fleet.node.probes.parse import ProbeParseError
from fleet.node.probes.procs import (
    ALIVE,
    SCAN_SH,
    SIGNAL_SH,
    HolderRow,
    HolderScan,
    Identity,
    PsRow,
    exe_argv,
    holders_scan_argv,
    maps_pattern,
    parse_exe,
    parse_ps,
    parse_scan,
    parse_verdicts,
    ps_argv,
    signal_argv,
)

# --- the package -------------------------------------------------------

PROBE_MODULES = (parse, smi, procs, units, lineage)


def declared(module: ModuleType) -> set[str]:
    """The public names a module's own source declares at top level (def, class, assignment)."""
    names: set[str] = set()
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return {name for name in names if not name.startswith("_")}


def test_the_package_is_no_facade() -> None:
    """`fleet.node.probes` re-exports nothing: every name is imported from the submodule that declares it."""
    exported = {name for name, value in vars(probes).items()
                if not name.startswith("_") and not isinstance(value, ModuleType)}
    assert exported == set()
    assert vars(smi)["ProbeParseError"] is vars(procs)["ProbeParseError"] is parse.ProbeParseError


@pytest.mark.parametrize("module", [smi, procs, units, lineage], ids=["smi", "procs", "units", "lineage"])
def test_each_public_name_is_declared_in_one_probe_module(module: ModuleType) -> None:
    """What moved between modules (UnitState, the unit argvs, ...) lives only where it moved to."""
    mine = declared(module)
    assert mine
    others = {other.__name__: declared(other) & mine for other in PROBE_MODULES if other is not module}
    assert {name: both for name, both in others.items() if both} == {}


# --- GPU holders -------------------------------------------------------


def test_holders_scan_argv_shape() -> None:
    """scan.sh, with the maps pre-filter (a regex no narrower than the globs) and the globs, each one argument."""
    assert holders_scan_argv(["/dev/nvidia*", "/dev/nvidia-caps/*"]) == [
        "sh", "-c", SCAN_SH, "fleet-scan", "[[:space:]](/dev/nvidia.*|/dev/nvidia-caps/.*)", "/proc/devices",
        "/dev/nvidia*", "/dev/nvidia-caps/*"]


@pytest.mark.parametrize(("glob", "path"), [
    ("/dev/nvidia*", "/dev/nvidia0"), ("/dev/nvidia*", "/dev/nvidia-uvm (deleted)"),
    ("/dev/nvidia?", "/dev/nvidia7"), ("/dev/nvidia[0-9]", "/dev/nvidia3"), ("/dev/nvidia[!c]*", "/dev/nvidia1"),
    ("/srv/sim.1/dev/nvidia*", "/srv/sim.1/dev/nvidia0"),
])
def test_the_maps_regex_matches_every_path_a_glob_does(glob: str, path: str) -> None:
    """The pre-filter may let more through (the globs decide on map_files), never less."""
    assert fnmatch.fnmatchcase(path, glob)
    line = f"7f3a10000000-7f3a10001000 rw-s 00000000 00:05 1234                       {path}"
    assert re.search(maps_pattern([glob]).replace("[[:space:]]", r"\s"), line)
    assert not re.search(maps_pattern(["/dev/nvidia*"]).replace("[[:space:]]", r"\s"),
                         "7f3a1000-7f3a1001 r--p 00000000 08:01 99 /usr/lib/libc.so.6")


def test_the_scan_program_is_plain_posix_sh() -> None:
    assert "\n#" not in SCAN_SH and "{ find \"$@\"" in SCAN_SH


@pytest.mark.parametrize("devices", [[], [""]])
def test_holders_scan_argv_needs_globs(devices: list[str]) -> None:
    with pytest.raises(ValueError, match="device globs"):
        holders_scan_argv(devices)


def holders_of(text: str) -> tuple[HolderRow, ...]:
    """Just the holders of a scan's output."""
    return parse_scan(text).rows


def test_parse_holders_groups_sorts_and_dedups() -> None:
    text = (
        "hit\talice\t/proc/4242/task/4242/fd/7\t/dev/nvidia0\0"
        "hit\tbob\t/proc/17/task/17/fd/3\t/dev/nvidiactl\0"
        "hit\talice\t/proc/4242/task/4242/fd/9\t/dev/nvidiactl\0"
        "hit\talice\t/proc/4242/task/4242/fd/8\t/dev/nvidia0\0"
        "hit\t1000\t/proc/99/task/99/fd/4\t/dev/nvidia-uvm\0"
        "hit\talice\t/proc/4242/task/4250/fd/5\t/dev/nvidia0\0"  # a thread's own file table: its process holds it
        "hit\talice\t/proc/4242/map_files/7f3a10000000-7f3a10001000\t/dev/nvidia1\0"  # a mapping
    )
    assert holders_of(text) == (
        HolderRow(17, "bob", ("/dev/nvidiactl",)),
        HolderRow(99, "1000", ("/dev/nvidia-uvm",)),
        HolderRow(4242, "alice", ("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl")),
    )


def test_parse_holders_empty() -> None:
    assert holders_of("") == ()
    assert parse_scan("") == HolderScan((), init_seen=False, unreadable=())


def test_parse_scan_tells_what_the_scan_could_not_see() -> None:
    """`init` (it saw /proc/1) and `unreadable` (an fd table it may not read) lines beside the holders."""
    text = (
        "hit\talice\t/proc/4242/task/4242/fd/7\t/dev/nvidia0\0"
        "init\0"
        "unreadable\tbob\t/proc/77/task/77/fd\0"
        "unreadable\troot\t/proc/12/task/12/fd\0"
        "unreadable\tbob\t/proc/77/task/77/fd\0"
        "unreadable\tuser with spaces\t/proc/5/task/5/fd\0"
    )
    assert parse_scan(text) == HolderScan(
        rows=(HolderRow(4242, "alice", ("/dev/nvidia0",)),), init_seen=True, unreadable=(5, 12, 77)
    )
    assert holders_of(text) == (HolderRow(4242, "alice", ("/dev/nvidia0",)),)
    assert parse_scan("hit\talice\t/proc/4242/task/4242/fd/7\t/dev/nvidia0\0").init_seen is False


@pytest.mark.parametrize("line", ["unreadable\tbob\t/proc/self", "unreadable\tbob\t/proc/77/fd", "unreadable\tbob"])
def test_parse_scan_malformed_unreadable_line(line: str) -> None:
    with pytest.raises(ProbeParseError, match="line 2: expected unreadable<TAB>user<TAB>/proc/PID"):
        parse_scan("init\0" + line + "\0")


NOT_A_PROC_PATH = "not a /proc/PID/task/TID/fd/N or /proc/PID/map_files/RANGE path"


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("alice /proc/1/task/1/fd/2 /dev/nvidia0", "expected a hit, dev, id, unreadable or init record"),
        ("hit alice /proc/1/task/1/fd/2 /dev/nvidia0", "expected a hit, dev, id, unreadable or init record"),
        ("hit\t\t/proc/4242/task/4242/fd/7\t/dev/nvidia0", "expected user<TAB>"),
        ("hit\talice\t/proc/4242/task/4242/fd/7\t", "expected user<TAB>"),
        ("hit\talice\t/proc/self/fd/7\t/dev/nvidia0", NOT_A_PROC_PATH),
        ("hit\talice\t/proc/4242/fd\t/dev/nvidia0", NOT_A_PROC_PATH),
    ],
)
def test_parse_holders_malformed(line: str, reason: str) -> None:
    with pytest.raises(ProbeParseError, match=f"line 2: {reason}"):
        holders_of("hit\talice\t/proc/1/task/1/fd/1\t/dev/nvidia0\0" + line + "\0")


def test_holders_scan_finds_this_process(tmp_path: Path) -> None:
    """The real find argv, run here, finds the fd this test holds open."""
    device = tmp_path / "nvidia0"
    with device.open("w"):
        done = subprocess.run(
            holders_scan_argv([str(tmp_path / "nvidia*")]), capture_output=True, text=True, check=False
        )
    assert done.returncode in (0, 1), done.stderr
    holders = {h.pid: h for h in holders_of(done.stdout)}
    assert holders == {os.getpid(): HolderRow(os.getpid(), pwd.getpwuid(os.geteuid()).pw_name, (str(device),))}
    seen = parse_scan(done.stdout)
    assert seen.init_seen  # /proc/1 is there for every scan that ran (no hidepid here)
    assert os.getpid() not in seen.unreadable


def test_a_device_found_by_its_identity_is_named_as_the_globs_name_it() -> None:
    """`dev` records carry the identity; `id` records say which path the globs named it by (the first, when two
    name one device), a character device by its number, any other file by its inode; a character device of the
    driver's that no glob names is `char MAJOR:MINOR` (decimal), a named file gone before its record `inode`."""
    text = (
        "id\t21b6\tcc3:0\ti5:300\t/dev/nvidia0\0"
        "id\t21b6\tcc3:0\ti5:301\t/dev/nvidia-zero\0"
        "id\t81a4\tc0:0\ti5:1234\t/srv/sim/dev/nvidia1\0"
        "dev\tnobody\t/proc/40/task/41/fd/8\tcc3:0\0"  # a bind mount: the link reads /tmp/gpu
        "dev\tnobody\t/proc/40/map_files/7f00-7f01\ti5:1234\0"  # a hard link, mapped
        "dev\talice\t/proc/50/task/50/fd/3\tcc3:7\0"  # a mknod copy of a minor none names
        "hit\talice\t/proc/50/task/50/fd/4\t/dev/nvidiactl\0"
        "dev\tbob\t/proc/60/task/60/fd/3\ti5:99\0"
        "init\0"
    )
    assert parse_scan(text) == HolderScan((
        HolderRow(40, "nobody", ("/dev/nvidia0", "/srv/sim/dev/nvidia1")),
        HolderRow(50, "alice", ("/dev/nvidiactl", "char 195:7")),
        HolderRow(60, "bob", ("inode 5:99",)),
    ), init_seen=True)


@pytest.mark.parametrize(("line", "reason"), [
    ("failed", "an open file's identity could not be read"),
    ("dev\tbob\t/proc/4/task/4/fd/3\t/dev/nvidia0", "not a device identity"),
    ("id\t21b6\tcc3:0\t/dev/nvidia0", "expected id<TAB>MODE<TAB>c..<TAB>i..<TAB>PATH"),
    ("id\tcrw\tcc3:0\ti5:300\t/dev/nvidia0", "not a hex number"),
    ("id\t21b6\tx195\ti5:300\t/dev/nvidia0", "not a device identity"),
])
def test_an_identity_the_scan_could_not_read_is_unreadable_output(line: str, reason: str) -> None:
    with pytest.raises(ProbeParseError, match=f"line 2: {reason}"):
        parse_scan("init\0" + line + "\0")


@pytest.mark.parametrize("status", [0, 1, 2])
def test_finds_complaints_reach_stderr_as_their_first_lines_and_a_count(tmp_path: Path, status: int) -> None:
    """A node whose pid 1 keeps its descriptors even from root makes find say so once an entry (14,700 lines, 700
    KB): the scan passes on the first 20 and counts the rest, its records and find's status untouched. Here a find
    that says 5,000 lines and prints one record stands for it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    real = subprocess.run(["sh", "-c", "command -v find"], capture_output=True, text=True, check=True).stdout.strip()
    fake = bin_dir / "find"
    fake.write_text(f"#!/bin/sh\n[ \"$1\" = /proc/1 ] && exec {real} \"$@\"\n"
                    "i=0; while [ $i -lt 5000 ]; do echo \"find: '/proc/1/task/1/fd/$i': Permission denied\" >&2;"
                    f" i=$((i + 1)); done; printf 'init\\0'; exit {status}\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(holders_scan_argv([str(tmp_path / "nvidia*")]), capture_output=True, text=True,
                          check=False, timeout=60, env=env)
    lines = done.stderr.splitlines()
    assert done.returncode == status and done.stdout == "init\0"
    assert lines[:2] == ["find: '/proc/1/task/1/fd/0': Permission denied",
                         "find: '/proc/1/task/1/fd/1': Permission denied"]
    assert len(lines) == 21 and lines[-1] == "fleet-scan: 4980 more lines of find's not kept"


def run_scan(globs: Sequence[str], driver_devices: str = procs.DRIVER_DEVICES) -> HolderScan:
    argv = holders_scan_argv(globs)
    argv[5] = driver_devices
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    return parse_scan(done.stdout)


def mine(scan: HolderScan, pid: int) -> tuple[str, ...]:
    return next((row.devices for row in scan.rows if row.pid == pid), ())


def test_a_device_held_under_another_path_is_seen_by_its_inode(tmp_path: Path) -> None:
    """A file held by a path no glob matches (a hard link here; a bind mount reads the same) is the device."""
    device = tmp_path / "dev" / "nvidia0"
    device.parent.mkdir()
    device.write_bytes(b"")
    other = tmp_path / "elsewhere"
    os.link(device, other)
    with other.open("rb"):
        scan = run_scan([str(device.parent / "nvidia*")])
    assert mine(scan, os.getpid()) == (str(device),)


@pytest.fixture
def char_device(tmp_path: Path) -> Path:
    """A character device node with /dev/full's numbers (1:7), named like a GPU's."""
    if os.geteuid() != 0:
        pytest.skip("mknod needs root (CI is root)")
    path = tmp_path / "nvidia9"
    os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 7))
    return path


def test_a_character_device_is_seen_by_its_number_whatever_its_path(char_device: Path) -> None:
    with open("/dev/full", "rb"):
        scan = run_scan([str(char_device.parent / "nvidia*")])
    assert mine(scan, os.getpid()) == (str(char_device),)


def test_the_drivers_majors_count_whole(char_device: Path, tmp_path: Path) -> None:
    """/proc/devices' nvidia* character majors count whole when a named device is of one: a minor no glob names (a
    mknod copy's) is still the driver's. Here /proc/devices is a file that says major 1 is the driver's (block
    majors and other names never count)."""
    devices = tmp_path / "devices"
    devices.write_text("Character devices:\n  1 nvidia-frontend\n  4 tty\n\nBlock devices:\n  5 nvidia\n")
    with open("/dev/zero", "rb"):
        scan = run_scan([str(char_device.parent / "nvidia*")], str(devices))
    assert "char 1:5" in mine(scan, os.getpid())  # (and whatever else of major 1 this process holds: /dev/null)
    devices.write_text("Character devices:\n  1 mem\n\nBlock devices:\n  1 nvidia\n")
    with open("/dev/zero", "rb"):
        scan = run_scan([str(char_device.parent / "nvidia*")], str(devices))
    assert mine(scan, os.getpid()) == ()


def test_a_driver_list_the_scan_cannot_read_ends_it(char_device: Path, tmp_path: Path) -> None:
    argv = holders_scan_argv([str(char_device.parent / "nvidia*")])
    argv[5] = str(tmp_path / "no-such-file")
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 3 and done.stdout.startswith("id\t")


# --- process details -------------------------------------------------------


def test_process_argv_shapes() -> None:
    assert ps_argv([1, 2, 3]) == ["ps", "-ww", "-o", "pid=,ppid=,user:32=,args=", "-p", "1,2,3"]
    assert exe_argv([1, 20]) == [
        "env", "LC_ALL=C", "QUOTING_STYLE=c", "stat", "-c", "%N", "--", "/proc/1/exe", "/proc/20/exe"]
    assert signal_argv(ALIVE, [Identity(pid=2, start=77, exe=None, user="root")]) == [
        "sh", "-c", SIGNAL_SH, "fleet-signal", "-", "2", "77", "", "root"]


def looks_at(pids: Sequence[int]) -> list[str]:
    """The identity-checked look (signal.sh with ALIVE) at these pids."""
    return signal_argv(ALIVE, [Identity(pid=pid, start=100, exe=None, user="root") for pid in pids])


@pytest.mark.parametrize("make", [ps_argv, exe_argv, looks_at])
@pytest.mark.parametrize("pids", [[], [0], [5, -1]])
def test_process_argv_rejects_bad_pids(make: Callable[[Sequence[int]], list[str]], pids: list[int]) -> None:
    with pytest.raises(ValueError, match="pid"):
        make(pids)


def test_parse_ps_right_aligned_and_spaces_in_args() -> None:
    text = (
        "    1     0 root                             /sbin/init splash\n"
        "  812     1 nvidia-persistenced              /usr/bin/nvidia-persistenced --user nvidia-persistenced\n"
        " 4242  4200 alice                            /usr/lib/firefox/firefox -contentproc  -isForBrowser\n"
        "  155     2 root                             [kworker/0:1-events]\n"
        "  160     1 root\n"
        "77777  4242 bob                              python3 train.py --lr 3e-4"
    )
    assert parse_ps(text) == {
        1: PsRow(pid=1, ppid=0, user="root", args="/sbin/init splash"),
        812: PsRow(pid=812, ppid=1, user="nvidia-persistenced",
                   args="/usr/bin/nvidia-persistenced --user nvidia-persistenced"),
        4242: PsRow(pid=4242, ppid=4200, user="alice", args="/usr/lib/firefox/firefox -contentproc  -isForBrowser"),
        155: PsRow(pid=155, ppid=2, user="root", args="[kworker/0:1-events]"),
        160: PsRow(pid=160, ppid=1, user="root", args=""),
        77777: PsRow(pid=77777, ppid=4242, user="bob", args="python3 train.py --lr 3e-4"),
    }


@pytest.mark.parametrize(
    ("args", "argv0"),
    [
        ("/usr/bin/nvidia-persistenced --verbose", "nvidia-persistenced"),
        ("python3 train.py", "python3"),
        ("sshd: root@notty", "sshd:"),
        ("", None),
        ("/", None),
    ],
)
def test_ps_row_argv0_is_the_first_words_basename(args: str, argv0: str | None) -> None:
    assert PsRow(pid=1, ppid=0, user="root", args=args).argv0 == argv0


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("  12    1", "expected pid, ppid, user and args"),
        ("  x    1 root sh", "pid is not"),
        ("1 y root sh", "ppid"),
    ],
)
def test_parse_ps_malformed(line: str, reason: str) -> None:
    with pytest.raises(ProbeParseError, match=f"line 1: {reason}"):
        parse_ps(line)


def test_parse_exe() -> None:
    text = (
        '"/proc/1/exe"\n'  # permission denied: stat names the link, and no target
        '"/proc/4242/exe" -> "/usr/bin/python3.11"\n'
        '"/proc/77/exe" -> "/opt/my app/train (deleted)"\n'
        '"/proc/78/exe" -> "/tmp/a\\nb\\t\\"\\\\\\377\\303\\251"\n'
    )
    assert parse_exe(text) == {4242: b"/usr/bin/python3.11", 77: b"/opt/my app/train",
                               78: b'/tmp/a\nb\t"\\\xff\xc3\xa9'}


@pytest.mark.parametrize(
    "line", ["/proc/4242/exe -> /usr/bin/python3", '"/proc/self/exe" -> "/usr/bin/x"',
             '"/proc/4242/exe" -> "/usr/bin/x', '"/proc/4242/exe" -> "a"b"', "/proc/4242\t/usr/bin/x"]
)
def test_parse_exe_malformed(line: str) -> None:
    with pytest.raises(ProbeParseError, match='line 1: expected "/proc/PID/exe" -> "TARGET"'):
        parse_exe(line)


def test_parse_verdicts() -> None:
    text = "sent 4242\ngone 77\n\nchanged 78\ndenied 79\nalive 80"
    assert parse_verdicts(text) == {4242: "sent", 77: "gone", 78: "changed", 79: "denied", 80: "alive"}
    assert parse_verdicts("") == {}


def test_a_real_zombie_child_is_gone(children: Children) -> None:
    """A child that exited and is not reaped yet holds nothing: signal.sh says `gone` and signals nothing."""
    zombie, judged = children.zombie()
    assert run_signal(ALIVE, [judged]) == {zombie.pid: "gone"}
    assert run_signal("KILL", [judged]) == {zombie.pid: "gone"}
    assert state(zombie.pid) == "Z"


def test_a_process_whose_leader_thread_exited_while_another_lives_is_alive_and_signalled(
        children: Children) -> None:
    """The leader is a zombie, another thread still holds the process's files and memory: signal.sh judges it
    through that thread (`alive`), and its SIGTERM reaches the process (`sent`): it ends."""
    child, judged = children.leaderless()
    assert state(child.pid) == "Z"
    assert run_signal(ALIVE, [judged]) == {child.pid: "alive"}
    assert run_signal("TERM", [judged]) == {child.pid: "sent"}
    assert child.wait(timeout=30) == -15


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("zombie", "expected '<sent|alive|gone|changed|denied> PID'"),
        ("killed 7", "expected '<sent|alive|gone|changed|denied> PID'"),
        ("kill: (7): Operation not permitted", "expected '<sent|"),
        ("sent seven", "pid is not an integer: 'sent seven'"),
        ("sent", "pid is not an integer"),
    ],
)
def test_parse_verdicts_malformed(line: str, reason: str) -> None:
    with pytest.raises(ProbeParseError, match=f"line 2: {re.escape(reason)}"):
        parse_verdicts("sent 1\n" + line)


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_ps_round_trip_on_this_process() -> None:
    pid = os.getpid()
    done = _run(ps_argv([pid]))
    assert done.returncode == 0, done.stderr
    args = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ").decode()
    user = pwd.getpwuid(os.geteuid()).pw_name
    assert parse_ps(done.stdout) == {pid: PsRow(pid=pid, ppid=os.getppid(), user=user, args=args)}


def test_exe_round_trip_on_this_process() -> None:
    pid, dead = os.getpid(), _dead_pid()
    done = _run(exe_argv([pid, dead]))
    assert done.returncode == 1  # the dead pid's link is missing
    assert parse_exe(done.stdout) == {pid: os.fsencode(os.readlink(f"/proc/{pid}/exe"))}


def test_alive_round_trip(children: Children) -> None:
    """signal.sh's look, run here: a live child is alive (and not signalled), a dead pid is gone."""
    child = children.plain()
    dead = dead_pid()
    live = identity_of(child.pid)
    gone = Identity(pid=dead, start=live.start, exe=None, user=live.user)
    assert run_signal(ALIVE, [live, gone]) == {child.pid: "alive", dead: "gone"}
    assert run_signal(ALIVE, [Identity(pid=dead, start=1, exe=None, user="root")]) == {dead: "gone"}
    assert child.poll() is None


# --- signals -------------------------------------------------------

TARGETS = [Identity(pid=4242, start=9001, exe=b"/usr/bin/python3.11", user="alice"),
           Identity(pid=77, start=12, exe=None, user="root")]


@pytest.mark.parametrize(
    ("signal", "name"),
    [("TERM", "TERM"), ("SIGTERM", "TERM"), ("KILL", "KILL"), ("sigkill", "KILL"), (ALIVE, "-")],
)
def test_signal_argv(signal: str, name: str) -> None:
    assert signal_argv(signal, TARGETS) == [
        "sh", "-c", SIGNAL_SH, "fleet-signal", name,
        "4242", "9001", "/usr/bin/python3.11", "alice",
        "77", "12", "", "root",
    ]  # fmt: skip


@pytest.mark.parametrize("signal", ["HUP", "SIGINT", "9", "", "SIGSIGTERM", "--", "SIG-"])
def test_signal_argv_rejects_other_signals(signal: str) -> None:
    with pytest.raises(ValueError, match="only TERM and KILL"):
        signal_argv(signal, TARGETS)


@pytest.mark.parametrize("pids", [[], [1], [0], [-1], [4242, 1], [-4242]])
@pytest.mark.parametrize("signal", ["TERM", "KILL", ALIVE])
def test_signal_argv_never_init_or_groups(signal: str, pids: list[int]) -> None:
    with pytest.raises(ValueError, match="must be > 1"):
        signal_argv(signal, [Identity(pid=pid, start=5, exe=None, user="root") for pid in pids])


# --- the probes -------------------------------------------------------


def test_the_probes_run_those_argvs_and_say_which_exits_are_answers() -> None:
    scan = procs.holder_scan(["/dev/nvidia*"])
    assert (scan.argv, scan.ok_exits, scan.needs_root) == (
        tuple(holders_scan_argv(["/dev/nvidia*"])), frozenset({0, 1}), True)
    assert scan.parse("hit\talice\t/proc/7/task/7/fd/3\t/dev/nvidia0\0init\0") == HolderScan(
        (HolderRow(7, "alice", ("/dev/nvidia0",)),), init_seen=True)
    assert (procs.ps([1, 2]).argv, procs.ps([1, 2]).ok_exits) == (tuple(ps_argv([1, 2])), ANY_EXIT)
    assert (procs.exe([1]).argv, procs.exe([1]).ok_exits) == (tuple(exe_argv([1])), ANY_EXIT)
    look = procs.signal(ALIVE, TARGETS)
    assert (look.argv, look.ok_exits, look.needs_root) == (tuple(signal_argv(ALIVE, TARGETS)), frozenset({0}), True)
    assert look.parse("gone 4242\nalive 77\n") == {4242: "gone", 77: "alive"}
    kill = procs.signal("SIGTERM", TARGETS)
    assert (kill.argv, kill.ok_exits, kill.needs_root) == (tuple(signal_argv("TERM", TARGETS)), frozenset({0}), True)


def test_ps_is_always_asked_about_pid_1_too() -> None:
    """A ps that cannot see every process (hidepid) shows it by leaving pid 1 out."""
    assert procs.ps([4242, 77]).argv == tuple(ps_argv([1, 77, 4242]))
    assert procs.ps([1, 4242]).argv == tuple(ps_argv([1, 4242]))
    assert procs.ps([4242]).needs_root is True


def test_a_maps_regex_grep_cannot_read_ends_the_scan_never_no_mapping() -> None:
    """grep says 2 both for a process that ended while it read and for a pattern it cannot read: the pattern is
    tried first, so a bad one fails the scan (exit 3) rather than reading as "no process maps a device"."""
    argv = holders_scan_argv(["/dev/nvidia*"])
    argv[4] = "[[:space:]](/dev/nvidia("  # unbalanced: grep -E refuses it
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 3 and done.stdout == ""
