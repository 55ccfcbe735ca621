"""Process and systemd probes: argv shapes, parsers, and round trips on this machine."""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import pytest

from fleet.inventory.host import BUILTIN_PROTECTED
from fleet.node import probes
from fleet.node.probes import (
    Holder,
    ProbeParseError,
    PsRow,
    UnitState,
    alive_argv,
    exe_argv,
    full_name,
    holders_scan_argv,
    is_protected,
    is_sshd,
    kill_argv,
    parse_exe,
    parse_holders,
    parse_pids,
    parse_ps,
    parse_unit_restart,
    parse_unit_state,
    ps_argv,
    unit_kill_argv,
    unit_restart_argv,
    unit_state_argv,
    unit_stop_argv,
)

# --- the package -------------------------------------------------------


@pytest.mark.parametrize("module", [probes.smi, probes.procs, probes.lineage], ids=["smi", "procs", "lineage"])
def test_the_package_reexports_every_public_name(module: ModuleType) -> None:
    """`from fleet import probes; probes.X` reaches every public name that smi and procs define."""
    defined = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, ModuleType)
        and getattr(value, "__module__", module.__name__) == module.__name__
    }
    assert defined
    assert all(getattr(probes, name) is getattr(module, name) for name in defined)
    assert defined <= set(probes.__all__)
    assert probes.ProbeParseError is probes._parse.ProbeParseError


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
        Holder(17, "bob", ("/dev/nvidiactl",)),
        Holder(99, "1000", ("/dev/nvidia-uvm",)),
        Holder(4242, "alice", ("/dev/nvidia0", "/dev/nvidiactl")),
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
    assert holders == {os.getpid(): Holder(os.getpid(), pwd.getpwuid(os.geteuid()).pw_name, (str(device),))}


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


# --- systemd -------------------------------------------------------


def test_unit_argv_shapes() -> None:
    unit = "-weird@1.service"
    assert unit_state_argv(unit) == [
        "systemctl",
        "show",
        "--property=ActiveState,SubState,MainPID",
        "--",
        unit,
    ]
    assert unit_stop_argv(unit) == ["systemctl", "stop", "--no-block", "--", unit]
    assert unit_kill_argv(unit) == ["systemctl", "kill", "--kill-whom=all", "--signal=SIGKILL", "--", unit]
    assert unit_restart_argv(unit) == ["systemctl", "show", "--property=Restart", "--", unit]


@pytest.mark.parametrize(
    ("text", "restart"),
    [
        ("Restart=always\n", "always"),
        ("Id=x.service\nRestart=on-failure\n", "on-failure"),
        ("Restart=\n", None),
        ("", None),
        ("Failed to get properties: Access denied\n", None),
    ],
)
def test_parse_unit_restart(text: str, restart: str | None) -> None:
    assert parse_unit_restart(text) == restart


@pytest.mark.parametrize("make", [unit_state_argv, unit_stop_argv, unit_kill_argv, unit_restart_argv])
def test_unit_argv_rejects_empty(make: Callable[[str], list[str]]) -> None:
    with pytest.raises(ValueError, match="empty unit"):
        make(" ")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ActiveState=active\nSubState=running\nMainPID=1234\n", UnitState("active", "running", 1234)),
        ("MainPID=0\nActiveState=inactive\nSubState=dead", UnitState("inactive", "dead", None)),
        ("SubState=failed\nActiveState=failed\nMainPID=0\n", UnitState("failed", "failed", None)),
        (
            "ActiveState=deactivating\nSubState=stop-sigterm\nMainPID=77\nId=x.service\n",
            UnitState("deactivating", "stop-sigterm", 77),
        ),
        ("ActiveState=activating\nSubState=\n", UnitState("activating", None, None)),
    ],
)
def test_parse_unit_state(text: str, expected: UnitState) -> None:
    assert parse_unit_state(text) == expected


@pytest.mark.parametrize(
    ("state", "down"), [("inactive", True), ("failed", True), ("active", False), ("deactivating", False)]
)
def test_unit_is_down(state: str, down: bool) -> None:
    assert UnitState(state, None, None).is_down is down


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("SubState=dead\nMainPID=0\n", "line 2: no ActiveState"),
        ("", "line 1: no ActiveState"),
        ("ActiveState=\nMainPID=0", "line 2: no ActiveState"),
        ("ActiveState=active\nMainPID=abc\n", "line 2: MainPID is not an integer"),
        ("ActiveState=active\nFailed to get properties\n", "line 2: expected Key=value"),
    ],
)
def test_parse_unit_state_malformed(text: str, reason: str) -> None:
    with pytest.raises(ProbeParseError, match=reason):
        parse_unit_state(text)


# --- protection policy -------------------------------------------------------


@pytest.mark.parametrize("name", BUILTIN_PROTECTED)
def test_builtin_names_match_full_and_kernel_cut_comm(name: str) -> None:
    assert is_protected(name, None, BUILTIN_PROTECTED) == name
    matched = is_protected(name[:15], None, BUILTIN_PROTECTED)
    assert matched is not None
    assert matched[:15] == name[:15]


@pytest.mark.parametrize(
    ("comm", "exe", "names", "expected"),
    [
        ("nvidia-persiste", None, ("nvidia-persistenced",), "nvidia-persistenced"),
        ("nvidia-persiste", None, ("nvidia",), None),
        ("nvidia", None, ("nvidia-persistenced",), None),
        ("nvidia-persist", None, ("nvidia-persistenced",), None),
        ("nvidia-persistenced", None, ("nvidia-persiste",), None),
        ("nv-hostengine", None, ("nv-hostengine",), "nv-hostengine"),
        ("python3", "/usr/bin/python3.11", BUILTIN_PROTECTED, None),
        ("python3", None, BUILTIN_PROTECTED, None),
        ("sshd-session", "/usr/lib/openssh/sshd-session", ("sshd",), None),
        ("exporter", "/usr/bin/dcgm-exporter", BUILTIN_PROTECTED, "dcgm-exporter"),
        ("exporter", "/usr/bin/dcgm-exporter (deleted)", ("dcgm-exporter",), "dcgm-exporter"),
        ("trainer", "", ("trainer-x",), None),
        ("my-daemon", None, ("other", "my-daemon"), "my-daemon"),
    ],
)
def test_is_protected(comm: str, exe: str | None, names: tuple[str, ...], expected: str | None) -> None:
    assert is_protected(comm, exe, names) == expected


@pytest.mark.parametrize(
    ("comm", "argv0", "exe", "name"),
    [
        ("nvidia-persiste", "nvidia-persistenced", "/usr/bin/nvidia-persistenced", "nvidia-persistenced"),
        ("nvidia-persiste", None, "/usr/bin/nvidia-persistenced (deleted)", "nvidia-persistenced"),
        ("nv-fabricmanage", "nv-fabricmanager", None, "nv-fabricmanager"),
        ("nvidia-persiste", "python3", "/usr/bin/python3.11", "nvidia-persiste"),  # cut, origin unknown
        ("python3", "python3.11", "/usr/bin/python3.11", "python3"),  # not cut: comm is the name
        ("my-daemon", "my-daemon-with-a-long-name", None, "my-daemon"),  # 9 characters: never cut
        ("nvidia-persiste", "nvidia-persiste", None, "nvidia-persiste"),
    ],
)
def test_full_name_uncuts_comm_from_argv0_or_exe(comm: str, argv0: str | None, exe: str | None, name: str) -> None:
    assert full_name(comm, argv0, exe) == name


@pytest.mark.parametrize(
    ("comm", "exe", "name", "names", "expected"),
    [
        ("nvidia-persiste", None, "nvidia-persistenced", ("nvidia-persistenced",), "nvidia-persistenced"),
        ("exporter", None, "dcgm-exporter", BUILTIN_PROTECTED, "dcgm-exporter"),  # comm renamed, argv0 tells
        ("python3", "/usr/bin/python3.11", "python3", ("python3.1",), None),
        ("my-inference-su", None, "my-inference-supervisor", ("my-inference-supervisor",), "my-inference-supervisor"),
        ("train", None, "trainer", ("train-x", "trainer-x"), None),
    ],
)
def test_is_protected_by_full_name(
    comm: str, exe: str | None, name: str, names: tuple[str, ...], expected: str | None
) -> None:
    assert is_protected(comm, exe, names, name) == expected


@pytest.mark.parametrize(
    ("comm", "exe", "name", "expected"),
    [
        ("sshd", "/usr/sbin/sshd", "sshd:", True),
        ("sshd-session", "/usr/lib/openssh/sshd-session", "sshd-session", True),
        ("sshd-auth", None, None, True),
        ("x", "/usr/lib/openssh/sshd-session", None, True),
        ("sshd-keygen", "/usr/libexec/openssh/sshd-keygen", "sshd-keygen", False),
        ("python3", "/usr/bin/python3", "python3", False),
    ],
)
def test_is_sshd_knows_every_name_of_openssh(comm: str, exe: str | None, name: str | None, expected: bool) -> None:
    assert is_sshd(comm, exe, name) is expected
