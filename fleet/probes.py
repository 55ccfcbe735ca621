"""Remote probes: for each, the argv to run and a pure parser of its stdout.

Nothing here does I/O. A probe is a function returning an argv list (no shell,
no quoting: the transport quotes once) and a parser from the command's stdout
text to frozen dataclasses. Malformed output raises `ProbeParseError`, whose
message names the 1-based line number and shows the line, clipped.

nvidia-smi marks missing values as `[N/A]`, `N/A`, `[Not Supported]` and other
bracketed notes, or leaves them empty: all of those parse as None.

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

SETTLE_FIELDS = ("index", "memory.used")
VERIFY_FIELDS = (
    "index",
    "uuid",
    "pci.bus_id",
    "name",
    "memory.used",
    "memory.total",
    "ecc.errors.uncorrected.volatile.total",
)
COMPUTE_APPS_FIELDS = ("gpu_uuid", "pid", "process_name", "used_gpu_memory")
SMI_FORMAT = "--format=csv,noheader,nounits"
SMI_SEPARATOR = ", "

# Values nvidia-smi prints when it has none; any other "[...]" note counts too.
NULL_VALUES = frozenset(
    {
        "",
        "N/A",
        "[N/A]",
        "[Not Supported]",
        "[Unknown Error]",
        "[Requested functionality has been deprecated]",
        "[GPU is lost]",
    }
)
# /proc/PID/comm holds at most this many characters (TASK_COMM_LEN - 1).
COMM_LEN = 15
SIGNALS = frozenset({"TERM", "KILL"})
LINE_CLIP = 120

_MIB = re.compile(r"(-?\d+)(?: MiB)?")
_UNIT_SUFFIX = re.compile(r" \[[^\]]*\]$")
_FD_PATH = re.compile(r"/proc/(\d+)/fd/\d+")
_PID_DIR = re.compile(r"/proc/(\d+)")
_DELETED = " (deleted)"


class ProbeParseError(ValueError):
    """A probe printed something its parser cannot read."""

    def __init__(self, lineno: int, line: str, reason: str) -> None:
        self.lineno = lineno
        self.line = line
        self.reason = reason
        super().__init__(f"line {lineno}: {reason}: {_clip(line)!r}")


@dataclass(frozen=True)
class GpuRow:
    index: int
    memory_used_mib: int | None
    uuid: str | None = None
    pci_bus_id: str | None = None
    name: str | None = None
    memory_total_mib: int | None = None
    ecc_uncorrected: int | None = None


@dataclass(frozen=True)
class ComputeApp:
    gpu_uuid: str | None
    pid: int
    process_name: str
    used_mib: int | None


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


# --- shared parsing helpers -------------------------------------------------


def _lines(text: str) -> Iterator[tuple[int, str]]:
    """Non-blank lines with their 1-based numbers; a final newline is optional."""
    for lineno, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if line.strip():
            yield lineno, line


def field_value(raw: str) -> str | None:
    """One nvidia-smi value, None when it is a not-available marker."""
    value = raw.strip()
    if value in NULL_VALUES or (value.startswith("[") and value.endswith("]")):
        return None
    return value


def parse_mib(raw: str | None) -> int | None:
    """A memory value: `123` or `123 MiB`; anything else (N/A, ...) is None."""
    if raw is None:
        return None
    match = _MIB.fullmatch(raw.strip())
    return int(match.group(1)) if match else None


def _optional_int(value: str | None) -> int | None:
    if value is None or not value.lstrip("-").isdigit():
        return None
    return int(value)


def _int(text: str, lineno: int, line: str, what: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ProbeParseError(lineno, line, f"{what} is not an integer") from None


def _split_csv(line: str, lineno: int, expected: int) -> list[str]:
    columns = line.split(SMI_SEPARATOR)
    if len(columns) != expected:
        raise ProbeParseError(lineno, line, f"expected {expected} columns, got {len(columns)}")
    return columns


def _pid_list(pids: Sequence[int]) -> str:
    if not pids:
        raise ValueError("no pids given")
    if any(pid < 1 for pid in pids):
        raise ValueError(f"invalid pid in {list(pids)}")
    return ",".join(str(pid) for pid in pids)


# --- nvidia-smi --query-gpu -------------------------------------------------


def gpu_query_argv(nvidia_smi: str, fields: Sequence[str]) -> list[str]:
    if not fields or any(not f or "," in f or " " in f for f in fields):
        raise ValueError(f"bad nvidia-smi field list: {list(fields)}")
    return [nvidia_smi, "--query-gpu=" + ",".join(fields), SMI_FORMAT]


def parse_gpu_query(text: str, fields: Sequence[str]) -> tuple[GpuRow, ...]:
    """Rows of `--query-gpu=FIELDS --format=csv,noheader,nounits`."""
    if "index" not in fields:
        raise ValueError("the field list must contain 'index'")
    rows = []
    for lineno, line in _lines(text):
        columns = _split_csv(line, lineno, len(fields))
        values = {name: field_value(raw) for name, raw in zip(fields, columns, strict=True)}
        rows.append(_gpu_row(values, lineno, line))
    return tuple(rows)


def _gpu_row(values: dict[str, str | None], lineno: int, line: str) -> GpuRow:
    return GpuRow(
        index=_int(values["index"] or "", lineno, line, "GPU index"),
        memory_used_mib=parse_mib(values.get("memory.used")),
        uuid=values.get("uuid"),
        pci_bus_id=values.get("pci.bus_id"),
        name=values.get("name"),
        memory_total_mib=parse_mib(values.get("memory.total")),
        ecc_uncorrected=_optional_int(values.get("ecc.errors.uncorrected.volatile.total")),
    )


def parse_gpu_csv_with_header(text: str) -> list[dict[str, str | None]]:
    """Rows of `--format=csv` (header line first), keyed by field name less its ` [unit]`."""
    lines = _lines(text)
    first = next(lines, None)
    if first is None:
        return []
    header = [_UNIT_SUFFIX.sub("", name.strip()) for name in first[1].split(SMI_SEPARATOR)]
    rows = []
    for lineno, line in lines:
        columns = _split_csv(line, lineno, len(header))
        rows.append({name: field_value(raw) for name, raw in zip(header, columns, strict=True)})
    return rows


# --- nvidia-smi --query-compute-apps -----------------------------------------


def compute_apps_argv(nvidia_smi: str) -> list[str]:
    return [nvidia_smi, "--query-compute-apps=" + ",".join(COMPUTE_APPS_FIELDS), SMI_FORMAT]


def parse_compute_apps(text: str) -> tuple[ComputeApp, ...]:
    """Rows of `compute_apps_argv`; a process name may itself contain ", "."""
    return tuple(_compute_app(lineno, line) for lineno, line in _lines(text))


def _compute_app(lineno: int, line: str) -> ComputeApp:
    left = line.split(SMI_SEPARATOR, 2)
    right = left[-1].rsplit(SMI_SEPARATOR, 1)
    if len(left) != 3 or len(right) != 2:
        raise ProbeParseError(lineno, line, f"expected {len(COMPUTE_APPS_FIELDS)} columns")
    return ComputeApp(
        gpu_uuid=field_value(left[0]),
        pid=_int(left[1], lineno, line, "pid"),
        process_name=right[0],
        used_mib=parse_mib(field_value(right[1])),
    )


# --- nvidia-smi failures ------------------------------------------------------

# (substring, one-line meaning), first match wins; matched in stdout and stderr.
_SMI_FAILURES = (
    ("couldn't communicate with the NVIDIA driver", "NVIDIA driver not loaded"),
    ("Driver/library version mismatch", "NVML driver/library version mismatch (reboot or reload needed)"),
    ("GPU is lost", "GPU fallen off the bus"),
    ("fallen off the bus", "GPU fallen off the bus"),
    ("Unable to determine the device handle", "GPU fallen off the bus"),
    ("No devices were found", "no NVIDIA devices found"),
    ("No supported GPUs were found", "no supported NVIDIA GPUs found"),
    ("In use by another client", "GPU reset refused"),
)


def classify_smi_failure(exit_status: int | None, stdout: str, stderr: str) -> str:
    """One line for humans saying why nvidia-smi failed."""
    status = "was ended by a signal" if exit_status is None else f"exited {exit_status}"
    first = _first_line(stderr) or _first_line(stdout) or "no output"
    if exit_status == 127:
        return f"nvidia-smi not found (exit 127): {first}"
    for needle, meaning in _SMI_FAILURES:
        detail = _line_with(needle, stderr) or _line_with(needle, stdout)
        if detail is not None:
            return f"{meaning} (nvidia-smi {status}): {_clip(detail)}"
    return f"nvidia-smi {status}: {_clip(first)}"


def _first_line(text: str) -> str | None:
    return next((line.strip() for _, line in _lines(text)), None)


def _line_with(needle: str, text: str) -> str | None:
    return next((line.strip() for _, line in _lines(text) if needle in line), None)


def _clip(line: str) -> str:
    return line if len(line) <= LINE_CLIP else line[:LINE_CLIP] + "..."


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
    for lineno, line in _lines(text):
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
    for lineno, line in _lines(text):
        parts = line.split(None, 3)
        if len(parts) != 4:
            raise ProbeParseError(lineno, line, "expected pid, ppid, user and comm")
        pid = _int(parts[0], lineno, line, "pid")
        rows[pid] = PsRow(pid, _int(parts[1], lineno, line, "ppid"), parts[2], parts[3])
    return rows


def exe_argv(pids: Sequence[int]) -> list[str]:
    _pid_list(pids)
    links = [f"/proc/{pid}/exe" for pid in pids]
    return ["find", *links, "-maxdepth", "0", "-printf", r"%h\t%l\n"]


def parse_exe(text: str) -> dict[int, str]:
    """pid -> executable path; unreadable links (empty target) are left out."""
    exes = {}
    for lineno, line in _lines(text):
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
    for lineno, line in _lines(text):
        pid, _, stat = line.strip().partition(" ")
        if not stat.strip().startswith("Z"):
            alive.add(_int(pid, lineno, line, "pid"))
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
    for lineno, line in _lines(text):
        key, sep, value = line.partition("=")
        if not sep:
            raise ProbeParseError(lineno, line, "expected Key=value")
        if key == "MainPID":
            _int(value, lineno, line, "MainPID")
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
