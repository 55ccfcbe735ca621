"""Process probes: argv shapes, parsers, the probes' declarations, and round trips on this machine."""

from __future__ import annotations

import ast
import inspect
import os
import pwd
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import pytest

from fleet.node import probes
from fleet.node.probe import ANY_EXIT
from fleet.node.probes import lineage, parse, procs, smi, units
from fleet.node.probes.parse import ProbeParseError
from fleet.node.probes.procs import (
    HolderRow,
    PsRow,
    alive_argv,
    exe_argv,
    holders_scan_argv,
    kill_argv,
    parse_exe,
    parse_holders,
    parse_pids,
    parse_ps,
    ps_argv,
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
    assert holders_scan_argv(["/dev/nvidia*", "/dev/dri/*"]) == [
        "find", "/proc", "-mindepth", "1", "-maxdepth", "3",
        "(", "-regex", "/proc/[0-9]+/fd/[0-9]+",
        "(", "-lname", "/dev/nvidia*", "-o", "-lname", "/dev/dri/*", ")",
        "-printf", "%u\\t%p\\t%l\\n", ")",
        "-o", "(", "-not", "-regex", "/proc/[0-9]+\\(/fd\\)?", "-prune", ")",
    ]  # fmt: skip


def test_holders_scan_argv_one_glob() -> None:
    argv = holders_scan_argv(["/dev/nvidia*"])
    assert argv[9:13] == ["(", "-lname", "/dev/nvidia*", ")"]


@pytest.mark.parametrize("devices", [[], [""]])
def test_holders_scan_argv_needs_globs(devices: list[str]) -> None:
    with pytest.raises(ValueError, match="device globs"):
        holders_scan_argv(devices)


def test_parse_holders_groups_sorts_and_dedups() -> None:
    text = (
        "alice\t/proc/4242/fd/7\t/dev/nvidia0\n"
        "bob\t/proc/17/fd/3\t/dev/nvidiactl\n"
        "alice\t/proc/4242/fd/9\t/dev/nvidiactl\n"
        "alice\t/proc/4242/fd/8\t/dev/nvidia0\n"
        "\n"
        "1000\t/proc/99/fd/4\t/dev/nvidia-uvm"
    )
    assert parse_holders(text) == (
        HolderRow(17, "bob", ("/dev/nvidiactl",)),
        HolderRow(99, "1000", ("/dev/nvidia-uvm",)),
        HolderRow(4242, "alice", ("/dev/nvidia0", "/dev/nvidiactl")),
    )


def test_parse_holders_empty() -> None:
    assert parse_holders("") == ()


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("alice /proc/1/fd/2 /dev/nvidia0", "expected user<TAB>"),
        ("\t/proc/4242/fd/7\t/dev/nvidia0", "expected user<TAB>"),
        ("alice\t/proc/4242/fd/7\t", "expected user<TAB>"),
        ("alice\t/proc/self/fd/7\t/dev/nvidia0", "not a /proc/PID/fd/N path"),
        ("alice\t/proc/4242/fd\t/dev/nvidia0", "not a /proc/PID/fd/N path"),
    ],
)
def test_parse_holders_malformed(line: str, reason: str) -> None:
    with pytest.raises(ProbeParseError, match=f"line 2: {reason}"):
        parse_holders("alice\t/proc/1/fd/1\t/dev/nvidia0\n" + line)


def test_holders_scan_finds_this_process(tmp_path: Path) -> None:
    """The real find argv, run here, finds the fd this test holds open."""
    device = tmp_path / "nvidia0"
    with device.open("w"):
        done = subprocess.run(
            holders_scan_argv([str(tmp_path / "nvidia*")]), capture_output=True, text=True, check=False
        )
    assert done.returncode in (0, 1), done.stderr
    holders = {h.pid: h for h in parse_holders(done.stdout)}
    assert holders == {os.getpid(): HolderRow(os.getpid(), pwd.getpwuid(os.geteuid()).pw_name, (str(device),))}


# --- process details -------------------------------------------------------


def test_process_argv_shapes() -> None:
    assert ps_argv([1, 2, 3]) == ["ps", "-ww", "-o", "pid=,ppid=,user:32=,args=", "-p", "1,2,3"]
    assert exe_argv([1, 20]) == [
        "find",
        "/proc/1/exe",
        "/proc/20/exe",
        "-maxdepth",
        "0",
        "-printf",
        "%h\\t%l\\n",
    ]
    assert alive_argv([1, 2]) == ["ps", "-o", "pid=,stat=", "-p", "1,2"]


@pytest.mark.parametrize("make", [ps_argv, exe_argv, alive_argv])
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
        1: PsRow(1, 0, "root", "/sbin/init splash"),
        812: PsRow(812, 1, "nvidia-persistenced", "/usr/bin/nvidia-persistenced --user nvidia-persistenced"),
        4242: PsRow(4242, 4200, "alice", "/usr/lib/firefox/firefox -contentproc  -isForBrowser"),
        155: PsRow(155, 2, "root", "[kworker/0:1-events]"),
        160: PsRow(160, 1, "root", ""),
        77777: PsRow(77777, 4242, "bob", "python3 train.py --lr 3e-4"),
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
    assert PsRow(1, 0, "root", args).argv0 == argv0


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
        "/proc/1\t\n"  # permission denied: find prints an empty target
        "/proc/4242\t/usr/bin/python3.11\n"
        "/proc/77\t/opt/my app/train (deleted)\n"
    )
    assert parse_exe(text) == {4242: "/usr/bin/python3.11", 77: "/opt/my app/train"}


@pytest.mark.parametrize(
    "line", ["/proc/4242 /usr/bin/python3", "/proc/self\t/usr/bin/x", "4242\t/usr/bin/x"]
)
def test_parse_exe_malformed(line: str) -> None:
    with pytest.raises(ProbeParseError, match="line 1: expected /proc/PID<TAB>target"):
        parse_exe(line)


def test_parse_pids() -> None:
    assert parse_pids("    1\n 4242\n\n77777") == frozenset({1, 4242, 77777})
    assert parse_pids("") == frozenset()


def test_parse_pids_counts_a_zombie_as_dead() -> None:
    assert parse_pids("    1 Ss\n 4242 Z\n 4243 Sl+\n") == frozenset({1, 4243})


def test_parse_pids_malformed() -> None:
    with pytest.raises(ProbeParseError, match="line 2: pid is not an integer: 'zombie'"):
        parse_pids("1\nzombie\n")


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
    assert parse_ps(done.stdout) == {pid: PsRow(pid, os.getppid(), pwd.getpwuid(os.geteuid()).pw_name, args)}


def test_exe_round_trip_on_this_process() -> None:
    pid, dead = os.getpid(), _dead_pid()
    done = _run(exe_argv([pid, dead]))
    assert done.returncode == 1  # the dead pid's link is missing
    assert parse_exe(done.stdout) == {pid: os.readlink(f"/proc/{pid}/exe")}


def test_alive_round_trip() -> None:
    pid, dead = os.getpid(), _dead_pid()
    assert parse_pids(_run(alive_argv([pid, dead])).stdout) == frozenset({pid})
    done = _run(alive_argv([dead]))
    assert (done.returncode, parse_pids(done.stdout)) == (1, frozenset())


# --- signals -------------------------------------------------------


@pytest.mark.parametrize(
    ("signal", "name"), [("TERM", "TERM"), ("SIGTERM", "TERM"), ("KILL", "KILL"), ("sigkill", "KILL")]
)
def test_kill_argv(signal: str, name: str) -> None:
    assert kill_argv(signal, [4242, 77]) == ["kill", "-s", name, "--", "4242", "77"]


@pytest.mark.parametrize("signal", ["HUP", "SIGINT", "9", "", "SIGSIGTERM"])
def test_kill_argv_rejects_other_signals(signal: str) -> None:
    with pytest.raises(ValueError, match="only TERM and KILL"):
        kill_argv(signal, [4242])


@pytest.mark.parametrize("pids", [[], [1], [0], [-1], [4242, 1], [-4242]])
def test_kill_argv_never_init_or_groups(pids: list[int]) -> None:
    with pytest.raises(ValueError, match="must be > 1"):
        kill_argv("TERM", pids)


# --- the probes -------------------------------------------------------


def test_the_probes_run_those_argvs_and_say_which_exits_are_answers() -> None:
    scan = procs.holder_scan(["/dev/nvidia*"])
    assert (scan.argv, scan.ok_exits) == (tuple(holders_scan_argv(["/dev/nvidia*"])), frozenset({0, 1}))
    assert scan.parse("alice\t/proc/7/fd/3\t/dev/nvidia0\n") == (HolderRow(7, "alice", ("/dev/nvidia0",)),)
    assert (procs.ps([1, 2]).argv, procs.ps([1, 2]).ok_exits) == (tuple(ps_argv([1, 2])), ANY_EXIT)
    assert (procs.exe([1]).argv, procs.exe([1]).ok_exits) == (tuple(exe_argv([1])), ANY_EXIT)
    assert (procs.alive([3]).argv, procs.alive([3]).ok_exits) == (tuple(alive_argv([3])), ANY_EXIT)
    assert procs.alive([3]).parse(" 3 Z\n") == frozenset()
    kill = procs.kill("SIGTERM", [4242])
    assert (kill.argv, kill.ok_exits) == (tuple(kill_argv("TERM", [4242])), ANY_EXIT)
