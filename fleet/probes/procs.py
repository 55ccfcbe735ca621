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

from fleet.probes._parse import ProbeParseError, lines, parse_int

# /proc/PID/comm holds at most this many characters (TASK_COMM_LEN - 1).
COMM_LEN = 15
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
    pid: int
    ppid: int
    user: str
    comm: str


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
    return ["ps", "-ww", "-o", "pid=,ppid=,user:32=,comm=", "-p", _pid_list(pids)]


def parse_ps(text: str) -> dict[int, PsRow]:
    """`pid ppid user comm` per line; comm is the rest of the line, spaces and all."""
    rows = {}
    for lineno, line in lines(text):
        parts = line.split(None, 3)
        if len(parts) != 4:
            raise ProbeParseError(lineno, line, "expected pid, ppid, user and comm")
        pid = parse_int(parts[0], lineno, line, "pid")
        rows[pid] = PsRow(pid, parse_int(parts[1], lineno, line, "ppid"), parts[2], parts[3])
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


def is_protected(comm: str, exe: str | None, protected_names: Sequence[str]) -> str | None:
    """The protected name this process matches, or None.

    A name matches the full comm, the comm the kernel cut to 15 characters, or
    the basename of the executable; a shorter prefix never matches.
    """
    base = posixpath.basename(exe.removesuffix(_DELETED)) if exe else None
    for name in protected_names:
        if comm in (name, name[:COMM_LEN]) or base == name:
            return name
    return None
