"""Process probes: who holds the GPU device files (the holder scan), ps, exe, alive, and the signal.

What each exit status means is declared with the probe:

* the holder scan and the exe lookup run GNU find, which exits 1 when it met
  an unreadable entry (permission denied, process gone mid-scan): 0 and 1 are
  answers, and stdout is parsed;
* ps (`ps`, `alive`) exits 1 when no listed pid exists: every status is
  an answer ("none alive"; the parsers return an empty result on "");
* `kill` exits 1 when a pid is gone or may not be signalled: the kill step reads
  its stderr.

Reading other users' /proc/PID/fd and exe links, and signalling their processes,
needs root; ps does not.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from fleet.node.probe import ANY_EXIT, Probe
from fleet.node.probes.parse import ProbeParseError, lines, parse_int

SIGNALS = frozenset({"TERM", "KILL"})

_FD_PATH = re.compile(r"/proc/(\d+)/fd/\d+")
_PID_DIR = re.compile(r"/proc/(\d+)")
_DELETED = " (deleted)"


@dataclass(frozen=True)
class HolderRow:
    """A row of the holder scan: a process with at least one open file matching the device globs
    (not yet judged: see `fleet.reset.protection.Holder`)."""

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


def parse_holders(text: str) -> tuple[HolderRow, ...]:
    """One HolderRow per pid, sorted by pid, its devices sorted and unique."""
    users: dict[int, str] = {}
    devices: dict[int, set[str]] = {}
    for lineno, line in lines(text):
        pid, user, device = _holder_line(lineno, line)
        users.setdefault(pid, user)
        devices.setdefault(pid, set()).add(device)
    return tuple(HolderRow(pid, users[pid], tuple(sorted(devices[pid]))) for pid in sorted(users))


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


# --- the probes -------------------------------------------------------------

FIND_ANSWERS = frozenset({0, 1})  # GNU find: 1 = some entry could not be read; what it printed stands


def holder_scan(devices: Sequence[str]) -> Probe[tuple[HolderRow, ...]]:
    return Probe(tuple(holders_scan_argv(devices)), "holder scan", parse_holders, needs_root=True,
                 ok_exits=FIND_ANSWERS)


def ps(pids: Sequence[int]) -> Probe[dict[int, PsRow]]:
    return Probe(tuple(ps_argv(pids)), "ps", parse_ps, ok_exits=ANY_EXIT)


def exe(pids: Sequence[int]) -> Probe[dict[int, str]]:
    return Probe(tuple(exe_argv(pids)), "exe lookup", parse_exe, needs_root=True, ok_exits=ANY_EXIT)


def alive(pids: Sequence[int]) -> Probe[frozenset[int]]:
    return Probe(tuple(alive_argv(pids)), "ps", parse_pids, ok_exits=ANY_EXIT)


def kill(signal: str, pids: Sequence[int]) -> Probe[str]:
    return Probe(tuple(kill_argv(signal, pids)), "kill", str, needs_root=True, ok_exits=ANY_EXIT)
