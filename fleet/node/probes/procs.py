"""Node process and systemd probes: who holds the GPU device files, ps, exe, alive, kill, units.

Exit statuses are the caller's business, but some are answers, not failures:

* `holders_scan_argv` and `exe_argv` run GNU find, which exits 1 when it met
  an unreadable entry (permission denied, process gone mid-scan): accept exit
  0 or 1 and parse stdout.
* `alive_argv` and `ps_argv` run ps, which exits 1 when no listed pid exists:
  treat that as "none alive" (the parsers return an empty result on "").
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from fleet.node.probes._parse import ProbeParseError, lines, parse_int

# /proc/PID/comm holds at most this many characters (TASK_COMM_LEN - 1).
COMM_LEN = 15
# What OpenSSH's daemon is called: since 9.8 it runs sessions as sshd-session (and sshd-auth).
SSHD_NAMES = frozenset({"sshd", "sshd-session", "sshd-auth"})
SIGNALS = frozenset({"TERM", "KILL"})

_FD_PATH = re.compile(r"/proc/(\d+)/fd/\d+")
_PID_DIR = re.compile(r"/proc/(\d+)")
_DELETED = " (deleted)"


@dataclass(frozen=True)
class Holder:
    """A process with at least one open file matching the device globs."""

    pid: int
    user: str
    devices: tuple[str, ...]


@dataclass(frozen=True)
class PsRow:
    """`ps` on one process: its parent, its user and its command line (argv joined by spaces)."""

    pid: int
    ppid: int
    user: str
    args: str = ""

    @property
    def argv0(self) -> str | None:
        """The basename of the command line's first word (a name the process chose, never cut)."""
        words = self.args.split(None, 1)
        if not words:
            return None
        return posixpath.basename(words[0]) or None


@dataclass(frozen=True)
class UnitState:
    active_state: str
    sub_state: str | None
    main_pid: int | None

    @property
    def is_down(self) -> bool:
        return self.active_state in {"inactive", "failed"}


def _pid_list(pids: Sequence[int]) -> str:
    if not pids:
        raise ValueError("no pids given")
    if any(pid < 1 for pid in pids):
        raise ValueError(f"invalid pid in {list(pids)}")
    return ",".join(str(pid) for pid in pids)


# --- processes holding GPU device files ----------------------------------------


def holders_scan_argv(devices: Sequence[str]) -> list[str]:
    """One GNU find over /proc listing fds whose link target matches a device glob.

    It descends only into /proc/PID and /proc/PID/fd and prunes everything else.
    Each hit prints `user<TAB>/proc/PID/fd/N<TAB>target`. Exit 1 with stdout is
    still an answer (fds it could not read).
    """
    if not devices or not all(devices):
        raise ValueError(f"bad device globs: {list(devices)}")
    lname: list[str] = []
    for glob in devices:
        lname += ["-o", "-lname", glob] if lname else ["-lname", glob]
    select = ["(", "-regex", "/proc/[0-9]+/fd/[0-9]+", "(", *lname, ")", "-printf", r"%u\t%p\t%l\n", ")"]
    prune = ["(", "-not", "-regex", r"/proc/[0-9]+\(/fd\)?", "-prune", ")"]
    return ["find", "/proc", "-mindepth", "1", "-maxdepth", "3", *select, "-o", *prune]


def parse_holders(text: str) -> tuple[Holder, ...]:
    """One Holder per pid, sorted by pid, its devices sorted and unique."""
    users: dict[int, str] = {}
    devices: dict[int, set[str]] = {}
    for lineno, line in lines(text):
        pid, user, device = _holder_line(lineno, line)
        users.setdefault(pid, user)
        devices.setdefault(pid, set()).add(device)
    return tuple(Holder(pid, users[pid], tuple(sorted(devices[pid]))) for pid in sorted(users))


def _holder_line(lineno: int, line: str) -> tuple[int, str, str]:
    parts = line.split("\t", 2)
    if len(parts) != 3 or not parts[0] or not parts[2]:
        raise ProbeParseError(lineno, line, "expected user<TAB>/proc/PID/fd/N<TAB>target")
    match = _FD_PATH.fullmatch(parts[1])
    if match is None:
        raise ProbeParseError(lineno, line, "not a /proc/PID/fd/N path")
    return int(match.group(1)), parts[0], parts[2]


# --- process details -------------------------------------------------------


def ps_argv(pids: Sequence[int]) -> list[str]:
    """pid, ppid, user and the full command line (last: it may hold spaces; -ww: never cut).

    comm is not asked of ps: beside args, two columns with spaces could not be
    told apart. The lineage probe reads it from /proc/PID/stat instead.
    """
    return ["ps", "-ww", "-o", "pid=,ppid=,user:32=,args=", "-p", _pid_list(pids)]


def parse_ps(text: str) -> dict[int, PsRow]:
    """`pid ppid user args` per line; args is the rest of the line, spaces and all (may be empty)."""
    rows = {}
    for lineno, line in lines(text):
        parts = line.split(None, 3)
        if len(parts) < 3:
            raise ProbeParseError(lineno, line, "expected pid, ppid, user and args")
        pid = parse_int(parts[0], lineno, line, "pid")
        args = parts[3] if len(parts) == 4 else ""
        rows[pid] = PsRow(pid, parse_int(parts[1], lineno, line, "ppid"), parts[2], args)
    return rows


def exe_argv(pids: Sequence[int]) -> list[str]:
    _pid_list(pids)
    links = [f"/proc/{pid}/exe" for pid in pids]
    return ["find", *links, "-maxdepth", "0", "-printf", r"%h\t%l\n"]


def parse_exe(text: str) -> dict[int, str]:
    """pid -> executable path; unreadable links (empty target) are left out."""
    exes = {}
    for lineno, line in lines(text):
        directory, sep, target = line.partition("\t")
        match = _PID_DIR.fullmatch(directory)
        if not sep or match is None:
            raise ProbeParseError(lineno, line, "expected /proc/PID<TAB>target")
        if target:
            exes[int(match.group(1))] = target.removesuffix(_DELETED)
    return exes


def alive_argv(pids: Sequence[int]) -> list[str]:
    """`ps -o pid=,stat= -p ...`: the state column tells a zombie (dead, not yet reaped) apart."""
    return ["ps", "-o", "pid=,stat=", "-p", _pid_list(pids)]


def parse_pids(text: str) -> frozenset[int]:
    """Pids that are alive; a zombie (stat Z) holds no files and no GPU memory, so it counts as dead."""
    alive = set()
    for lineno, line in lines(text):
        pid, _, stat = line.strip().partition(" ")
        if not stat.strip().startswith("Z"):
            alive.add(parse_int(pid, lineno, line, "pid"))
    return frozenset(alive)


# --- signals -------------------------------------------------------


def kill_argv(signal: str, pids: Sequence[int]) -> list[str]:
    """`kill -s TERM|KILL -- PID...`; never init, never a process group."""
    name = signal.upper().removeprefix("SIG")
    if name not in SIGNALS:
        raise ValueError(f"refusing to send {signal!r}: only TERM and KILL")
    if not pids or any(pid <= 1 for pid in pids):
        raise ValueError(f"refusing to signal pids {list(pids)}: each must be > 1")
    return ["kill", "-s", name, "--", *(str(pid) for pid in pids)]


# --- systemd -------------------------------------------------------


def _unit(unit: str) -> str:
    if not unit.strip():
        raise ValueError("empty unit name")
    return unit


def unit_state_argv(unit: str) -> list[str]:
    return ["systemctl", "show", "--property=ActiveState,SubState,MainPID", "--", _unit(unit)]


def unit_stop_argv(unit: str) -> list[str]:
    return ["systemctl", "stop", "--no-block", "--", _unit(unit)]


def unit_kill_argv(unit: str) -> list[str]:
    return ["systemctl", "kill", "--kill-whom=all", "--signal=SIGKILL", "--", _unit(unit)]


def unit_restart_argv(unit: str) -> list[str]:
    """`systemctl show --property=Restart`: whether systemd brings the unit's process back."""
    return ["systemctl", "show", "--property=Restart", "--", _unit(unit)]


def parse_unit_restart(text: str) -> str | None:
    """The Restart= value (`no`, `always`, `on-failure`, ...); None when not shown or empty."""
    for _, line in lines(text):
        key, sep, value = line.partition("=")
        if sep and key.strip() == "Restart" and value.strip():
            return value.strip()
    return None


def parse_unit_state(text: str) -> UnitState:
    """`Key=value` lines in any order; MainPID=0 means no main process."""
    props: dict[str, str] = {}
    last = (1, "")
    for lineno, line in lines(text):
        key, sep, value = line.partition("=")
        if not sep:
            raise ProbeParseError(lineno, line, "expected Key=value")
        if key == "MainPID":
            parse_int(value, lineno, line, "MainPID")
        props[key] = value.strip()
        last = (lineno, line)
    if not props.get("ActiveState"):
        raise ProbeParseError(*last, "no ActiveState")
    main_pid = int(props.get("MainPID") or 0)
    return UnitState(props["ActiveState"], props.get("SubState") or None, main_pid or None)


# --- protection policy -------------------------------------------------------


def _exe_base(exe: str | None) -> str | None:
    if not exe:
        return None
    return posixpath.basename(exe.removesuffix(_DELETED)) or None


def full_name(comm: str, argv0: str | None, exe: str | None) -> str:
    """The process's name, uncut: comm, unless the kernel cut it to 15 characters and argv[0]'s
    or the executable's basename is the longer name it was cut from."""
    if len(comm) == COMM_LEN:
        for candidate in (argv0, _exe_base(exe)):
            if candidate and len(candidate) > COMM_LEN and candidate.startswith(comm):
                return candidate
    return comm


def is_protected(
    comm: str, exe: str | None, protected_names: Sequence[str], name: str | None = None
) -> str | None:
    """The protected name this process matches, or None.

    A name matches exactly the process's full `name` (argv[0]'s basename, or
    `full_name`), the basename of its executable or its comm, or a comm the
    kernel cut to 15 characters from it; a shorter prefix never matches.
    """
    base = _exe_base(exe)
    for protected in protected_names:
        if comm in (protected, protected[:COMM_LEN]) or protected in (base, name):
            return protected
    return None


def is_sshd(comm: str, exe: str | None, name: str | None = None) -> bool:
    """Whether the process is OpenSSH's daemon, by any of its names (sshd, sshd-session, sshd-auth)."""
    return bool({comm, _exe_base(exe), name} & SSHD_NAMES)
