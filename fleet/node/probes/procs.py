"""Process probes: who holds the GPU device files (the holder scan), ps, exe, and the identity-checked signal.

What each exit status means is declared with the probe:

* the holder scan and the exe lookup run GNU find, which exits 1 when it met
  an unreadable entry (permission denied, process gone mid-scan): 0 and 1 are
  answers, and stdout is parsed. Whether the scan saw every process is decided
  from what it printed (`HolderScan`), never from find's localised messages;
* ps exits 1 when no listed pid exists: every status is an answer (ps is always
  asked about pid 1 too, so a ps that cannot see every process shows it);
* `signal` runs signal.sh, which says per process what it did (sent, alive,
  gone, changed, denied): a refused kill is a verdict, not an English message.

What other users control never comes back raw (`fleet.node.probes.escapes`): the holder scan's
records end in NUL (a device file's link target can hold a newline, never a NUL), the exe links
come C-quoted by GNU stat and are read back as bytes, and ps's command lines come from procps,
which prints no control character. An executable is who a process is: it is compared as bytes,
here and on the node (signal.sh), never as text with what is not UTF-8 replaced.

Reading other users' /proc entries (fd tables, exe links, and under hidepid any
of them) and signalling their processes needs root: all of these probes say so.
"""

from __future__ import annotations

import functools
import posixpath
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources

from fleet.node.probe import ANY_EXIT, Probe
from fleet.node.probes.escapes import C_QUOTED, EscapeError, c_link_pattern, unescape
from fleet.node.probes.parse import ProbeParseError, lines, parse_int

SIGNALS = frozenset({"TERM", "KILL"})

_FD_PATH = re.compile(r"/proc/(\d+)/(?:task/\d+/fd/\d+|map_files/[0-9a-f]+-[0-9a-f]+)")
# A device's identity as the scan prints it: c<major>:<minor> (hex) for a character device, i<st_dev>:<st_ino>
_TOKEN = re.compile(r"c(?P<major>[0-9a-f]+):(?P<minor>[0-9a-f]+)|i\d+:\d+")
# The driver's character devices are found by their numbers, in the majors /proc/devices lists for them
DRIVER_DEVICES = "/proc/devices"

_TABLE_PATH = re.compile(r"/proc/(\d+)/(?:task/\d+/fd|map_files)")
_DELETED = b" (deleted)"
_EXE_LINK = c_link_pattern(r"/proc/(?P<pid>\d+)/exe")
# Bytes an executable path may hold as they are in signal.sh's argument; any other is a `printf %b` escape.
_PLAIN_BYTES = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._+-"
_PLAIN = frozenset(_PLAIN_BYTES)


@dataclass(frozen=True)
class HolderRow:
    """A row of the holder scan: a process with at least one open file matching the device globs
    (not yet judged: see `fleet.reset.protection.Holder`)."""

    pid: int
    user: str
    devices: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
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


@dataclass(frozen=True)
class HolderScan:
    """What one holder scan saw: the holders, and whether it saw everything.

    `init_seen`: /proc/1 was visible to the scan (it is not, when /proc is mounted
    hidepid=2 for a user, or when sudo refused to run the scan: nothing ran at all).
    `unreadable`: pids whose fd table the scan could not read (another user's
    process, for a scan that does not run as root).
    """

    rows: tuple[HolderRow, ...] = ()
    init_seen: bool = False
    unreadable: tuple[int, ...] = ()


def holders_scan_argv(devices: Sequence[str]) -> list[str]:
    """The holder scan: `sh -c SCAN_SH fleet-scan MAPS_RE /proc/devices GLOB...` (scan.sh beside this file), one GNU
    find over every thread's file table and the mappings of every process whose maps name a device file.

    A process holds a device through any of its threads' file tables (a thread may have its own:
    `unshare(CLONE_FILES)`; the leader thread may have exited while the others live on), so every
    /proc/PID/task/TID/fd is read, not /proc/PID/fd alone; and through a mapping that outlived its fd
    (`mmap`, then `close`): /proc/PID/map_files of each process whose /proc/PID/maps names a file a glob could
    match (MAPS_RE, a superset of the globs) or a named device's inode is read too (its links need root to read,
    which the scan runs as: a scan that is not root is blind anyway, /proc/1's tables being root's).
    A device is what it is, not what its path says: the files the globs name are looked at first (a character
    device by its number, any other file by its inode), and an open file or mapping whose link text no glob
    matches is still a hit when it is one of them, or a character device of the driver's majors (/proc/devices'
    nvidia and nvidia-* entries, when a named device is of one): a bind mount, a mknod copy, a path in another
    mount namespace.
    Records, each begun by its kind and ended by NUL (`parse_scan`): `id<TAB>MODE<TAB>c<major>:<minor><TAB>
    i<st_dev>:<st_ino><TAB>PATH` a named device (its raw mode and number in hex, its inode),
    `hit<TAB>user<TAB>/proc/PID/task/TID/fd/N<TAB>target` (or `.../map_files/RANGE`) a link a glob matches,
    `dev<TAB>user<TAB>LINK<TAB>TOKEN` one that is a device by its identity, `unreadable<TAB>user<TAB>FOLDER` a file
    table or map_files folder it may not read (and does not enter), `init` /proc/1's first thread (so that a scan
    that saw nothing can be told from one that saw no holder), `failed` an identity it could not read. A target is
    a path, which may hold newlines (a file in a user's own mount namespace), but no NUL, so no target can forge a
    record.
    """
    if not devices or not all(devices) or any(len(g.split()) != 1 for g in devices):
        raise ValueError(f"bad device globs: {list(devices)}")
    return ["sh", "-c", SCAN_SH, "fleet-scan", maps_pattern(devices), DRIVER_DEVICES, *devices]


def maps_pattern(devices: Sequence[str]) -> str:
    """An extended regex that matches every /proc/PID/maps line whose path a glob matches (and maybe more: the scan
    then reads that process's map_files, where the globs decide): `*` any text, `?` and a bracket any character."""
    return "[[:space:]](" + "|".join(_glob_regex(g) for g in devices) + ")"


def _glob_regex(glob: str) -> str:
    out, i = [], 0
    while i < len(glob):
        c = glob[i]
        if c == "*":
            out.append(".*")
        elif c in "?[":
            out.append(".")
            close = glob.find("]", i + 2) if c == "[" else -1
            i = close if close != -1 else i
        else:
            out.append("\\" + c if c in ".+()|{}^$\\" else c)
        i += 1
    return "".join(out)


# The holder scan, a POSIX sh program (scan.sh beside this file), its comment lines dropped.
SCAN_SH = "\n".join(
    line for line in (resources.files("fleet.node.probes") / "scan.sh").read_text().splitlines()
    if line.strip() and not line.lstrip().startswith("#")
)


def parse_scan(text: str) -> HolderScan:
    """The holders (one HolderRow per pid, sorted, devices sorted and unique), `init` and `unreadable` records
    (each ended by a NUL; one not ended, cut, is unreadable output; so is `failed`, an identity the scan could not
    read). A device found by its identity is named by the path the globs named it by (`id` records), or, a
    character device of the driver's that none names, as `char MAJOR:MINOR`."""
    users: dict[int, str] = {}
    devices: dict[int, set[str]] = {}
    names: dict[str, str] = {}
    by_identity: list[tuple[int, str, str]] = []
    init_seen, unreadable = False, set()
    for lineno, line in records(text):
        kind, _, rest = line.partition("\t")
        if line == "init":
            init_seen = True
        elif kind == "unreadable":
            unreadable.add(_unreadable_pid(lineno, line))
        elif kind == "id":
            mode, char, inode, path = _split(lineno, line, rest, 4, "id<TAB>MODE<TAB>c..<TAB>i..<TAB>PATH")
            token = char if stat.S_ISCHR(_hex(lineno, line, mode)) else inode
            names.setdefault(_token(lineno, line, token), path)
        elif kind == "hit":
            pid, user, device = _holder_line(lineno, line, rest)
            users.setdefault(pid, user)
            devices.setdefault(pid, set()).add(device)
        elif kind == "dev":
            pid, user, token = _holder_line(lineno, line, rest)
            by_identity.append((pid, user, _token(lineno, line, token)))
        elif line == "failed":
            raise ProbeParseError(lineno, line, "an open file's identity could not be read (stat or grep failed)")
        else:
            raise ProbeParseError(lineno, line, "expected a hit, dev, id, unreadable or init record")
    for pid, user, token in by_identity:
        users.setdefault(pid, user)
        devices.setdefault(pid, set()).add(names.get(token) or _unnamed(token))
    rows = tuple(HolderRow(pid, users[pid], tuple(sorted(devices[pid]))) for pid in sorted(users))
    return HolderScan(rows, init_seen, tuple(sorted(unreadable)))


def records(text: str) -> Iterator[tuple[int, str]]:
    """NUL-ended records with their 1-based numbers; text after the last NUL (a cut record) is a
    ProbeParseError."""
    *whole, rest = text.split("\0")
    if rest:
        raise ProbeParseError(len(whole) + 1, rest, "a record not ended by NUL (cut output)")
    yield from enumerate(whole, start=1)


def _split(lineno: int, line: str, rest: str, count: int, form: str) -> list[str]:
    parts = rest.split("\t", count - 1)
    if len(parts) != count or not all(parts):
        raise ProbeParseError(lineno, line, f"expected {form}")
    return parts


def _token(lineno: int, line: str, token: str) -> str:
    if _TOKEN.fullmatch(token) is None:
        raise ProbeParseError(lineno, line, "not a device identity (c<major>:<minor> or i<dev>:<inode>)")
    return token


def _hex(lineno: int, line: str, text: str) -> int:
    try:
        return int(text, 16)
    except ValueError:
        raise ProbeParseError(lineno, line, f"not a hex number: {text!r}") from None


def _unnamed(token: str) -> str:
    """A device no `id` record names, by its identity: a character device of the driver's majors that no glob names
    (`char 195:7`), or a named file that was gone when the records were written (`inode 65024:1234`)."""
    match = _TOKEN.fullmatch(token)
    if match is not None and match.group("major") is not None:
        return f"char {int(match.group('major'), 16)}:{int(match.group('minor'), 16)}"
    return f"inode {token[1:]}"


def _unreadable_pid(lineno: int, line: str) -> int:
    match = _TABLE_PATH.fullmatch(line.rsplit("\t", 1)[-1])
    if match is None:
        raise ProbeParseError(lineno, line, "expected unreadable<TAB>user<TAB>/proc/PID/task/TID/fd or map_files")
    return int(match.group(1))


def _holder_line(lineno: int, line: str, rest: str) -> tuple[int, str, str]:
    """(pid, user, last field) of `user<TAB>/proc/...<TAB>target or identity`."""
    user, path, last = _split(lineno, line, rest, 3, "user<TAB>/proc/PID/task/TID/fd/N<TAB>target")
    match = _FD_PATH.fullmatch(path)
    if match is None:
        raise ProbeParseError(lineno, line, "not a /proc/PID/task/TID/fd/N or /proc/PID/map_files/RANGE path")
    return int(match.group(1)), user, last


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
        rows[pid] = PsRow(pid=pid, ppid=parse_int(parts[1], lineno, line, "ppid"), user=parts[2], args=args)
    return rows


def exe_argv(pids: Sequence[int]) -> list[str]:
    """GNU stat's %N of each /proc/PID/exe, C-quoted (`"/proc/P/exe" -> "TARGET"`: one ASCII line, every
    byte of the target kept); a link it cannot read prints `"/proc/P/exe"` alone."""
    _pid_list(pids)
    return [*C_QUOTED, "stat", "-c", "%N", "--", *(f"/proc/{pid}/exe" for pid in pids)]


def parse_exe(text: str) -> dict[int, bytes]:
    """pid -> executable path, as bytes (" (deleted)" dropped); unreadable links are left out."""
    exes = {}
    for lineno, line in lines(text):
        match = _EXE_LINK.fullmatch(line)
        if match is None:
            raise ProbeParseError(lineno, line, 'expected "/proc/PID/exe" -> "TARGET"')
        if match.group("target") is None:
            continue
        try:
            target = unescape(match.group("target"))
        except EscapeError as exc:
            raise ProbeParseError(lineno, line, str(exc)) from None
        if target:
            exes[int(match.group("pid"))] = target.removesuffix(_DELETED)
    return exes


# --- signals: only to the process that was judged ----------------------------------------------------------

# The identity-checked signal, a POSIX sh program (signal.sh beside this file), its comment lines dropped.
SIGNAL_SH = "\n".join(
    line for line in (resources.files("fleet.node.probes") / "signal.sh").read_text().splitlines()
    if line.strip() and not line.lstrip().startswith("#")
)
# Only ask who of them is still alive (and still the same process): no signal is sent.
ALIVE = "-"
VERDICTS = frozenset({"sent", "alive", "gone", "changed", "denied"})


@dataclass(frozen=True, kw_only=True)
class Identity:
    """A process as fleet judged it: its pid, start time (clock ticks since boot), executable and owner."""

    pid: int
    start: int
    exe: bytes | None
    user: str


def signal_argv(signal: str, targets: Sequence[Identity]) -> list[str]:
    """`sh -c SIGNAL_SH fleet-signal SIG PID START EXE USER ...`: TERM or KILL (or ALIVE: no signal) to each
    target that is still the process fleet judged; never init, never a process group."""
    name = signal if signal == ALIVE else signal.upper().removeprefix("SIG")
    if name not in SIGNALS and signal != ALIVE:
        raise ValueError(f"refusing to send {signal!r}: only TERM and KILL")
    if not targets or any(t.pid <= 1 for t in targets):
        raise ValueError(f"refusing to signal pids {[t.pid for t in targets]}: each must be > 1")
    words = [w for t in targets for w in (str(t.pid), str(t.start), printf_b(t.exe or b""), t.user)]
    return ["sh", "-c", SIGNAL_SH, "fleet-signal", name, *words]


def printf_b(raw: bytes) -> str:
    """Bytes as an ASCII argument that sh's `printf %b` turns back into them: each byte outside
    [A-Za-z0-9/._+-] as `\\0ooo`. A path of those bytes only (nearly every one: `/usr/bin/python3.11`) is its
    ASCII text as it is, told by deleting them (in C, not a byte at a time)."""
    if not raw.translate(None, _PLAIN_BYTES):
        return raw.decode("ascii")
    return "".join(chr(b) if b in _PLAIN else f"\\0{b:03o}" for b in raw)


def parse_verdicts(text: str) -> dict[int, str]:
    """pid -> what signal.sh did with it: sent, alive, gone, changed or denied."""
    verdicts = {}
    for lineno, line in lines(text):
        verdict, _, pid = line.partition(" ")
        if verdict not in VERDICTS:
            raise ProbeParseError(lineno, line, "expected '<sent|alive|gone|changed|denied> PID'")
        verdicts[parse_int(pid, lineno, line, "pid")] = verdict
    return verdicts


# --- the probes -------------------------------------------------------------

FIND_ANSWERS = frozenset({0, 1})  # GNU find: 1 = some entry could not be read; what it printed stands


def holder_scan(devices: Sequence[str]) -> Probe[HolderScan]:
    """Exit 1 is an answer (an entry vanished or could not be read); whether the scan saw everything is
    in what it printed (`HolderScan`), never in find's (localised) messages."""
    return _holder_scan(tuple(devices))


@functools.lru_cache(maxsize=256)
def _holder_scan(devices: tuple[str, ...]) -> Probe[HolderScan]:
    """Made once for every host and scan with the same device globs (a probe is a value: frozen, no answer)."""
    return Probe(argv=tuple(holders_scan_argv(devices)), what="holder scan", parse=parse_scan, needs_root=True,
                 ok_exits=FIND_ANSWERS)


def ps(pids: Sequence[int]) -> Probe[dict[int, PsRow]]:
    """ps on the pids and on pid 1: a ps that does not list pid 1 cannot see every process (hidepid)."""
    return Probe(argv=tuple(ps_argv(sorted({1, *pids}))), what="ps", parse=parse_ps, needs_root=True, ok_exits=ANY_EXIT)


def exe(pids: Sequence[int]) -> Probe[dict[int, bytes]]:
    return Probe(argv=tuple(exe_argv(pids)), what="exe lookup", parse=parse_exe, needs_root=True, ok_exits=ANY_EXIT)


def signal(name: str, targets: Sequence[Identity]) -> Probe[dict[int, str]]:
    """Signal (or, with ALIVE, look at) each target that is still the process fleet judged."""
    return Probe(argv=tuple(signal_argv(name, targets)), what="signal", parse=parse_verdicts, needs_root=True)
