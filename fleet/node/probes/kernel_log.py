"""The kernel log's Xid events, read so that "no Xid" is only ever said of a read that provably ran to its end.

`read(cursor)` runs `kernel_log.sh` (beside this file): `journalctl -k -b -a -o short-unix --no-pager --show-cursor
[--after-cursor=CURSOR]` piped through the awk program `xids.awk` (bytes: LC_ALL=C), which keeps the Xid lines
summarised (one
group per PCI address, Xid code and pid: its count, first and last line; bounded, so a storm of one Xid is one
group and never reaches the transport's 1 MiB cut) and passes journalctl's cursor line through, then says how
journalctl ended. `-a`: journald keeps a kernel message as the bytes the kernel wrote, and without it journalctl
prints one that is not printable UTF-8 (an Xid naming a thread whose name the kernel cut at 15 bytes, mid-
character) as `[N blob data]`, an Xid no pattern sees. Each kept line comes back with every byte outside printable
ASCII, and every backslash, written `\\xNN` (`Xid.detail`; `Xid.process_name` has the thread's name as bytes), and a
message's further lines joined to it; an entry journalctl printed as blob data anyway, or a further line with no
entry before it, makes the read unreadable. No `--grep`: journalctl exits 1 both when a pattern matches nothing
and on its errors, and a journalctl built without pattern matching refuses it (`Compiled without pattern matching
support`).

What proves a read whole, and nothing less (`reading`): journalctl exited 0, the summary's end line came (the
output was not cut), and journalctl printed the cursor of the last kernel message it read (`-- cursor: ...`,
printed only after its loop ended without error; none when it could read no kernel message of this boot: no
journal files, a user outside the journal's groups, kernel messages not collected). Anything else is
`KernelLogUnread`, with why, never "no Xids". The captures this rests on are in tests/fixtures/journalctl/.

The cursor is the baseline of a reset: the read as the reset begins names it, and verify reads only what came
after it (`--after-cursor`): the Xids logged during the reset, whatever the boot logged before.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass, replace
from importlib import resources

from fleet.node.probe import ANY_EXIT, Probe, first_line
from fleet.node.probes.parse import LINE_CLIP, ProbeParseError, lines
from fleet.transport.base import CommandResult, clip


def _program(name: str) -> str:
    """A program beside this file, its comment lines dropped (they are for readers, not for the wire)."""
    text = (resources.files("fleet.node.probes") / name).read_text()
    return "\n".join(line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))


KERNEL_LOG_SH = _program("kernel_log.sh")
XIDS_AWK = _program("xids.awk")
# What xids.awk keeps (its BEGIN block says the same): pids apart per address and code, groups, line width.
PIDS_APART = 8
GROUPS = 256
WIDTH = 512
HANG = "journalctl did not answer within {s} s ({bound})"
FOLDED = "*"  # the pid of a group of lines of more pids than the read keeps apart
STATUS_NEVER_CAME = 125  # xids.awk's exit when journalctl's status line never reached it

# journalctl's cursor: `s=<seqnum id>;i=<seqnum>;b=<boot id>;m=<monotonic>;t=<realtime>;x=<hash>`, hex each.
_CURSOR = re.compile(r"[a-z]=[0-9a-f]{1,64}(?:;[a-z]=[0-9a-f]{1,64}){0,15}")
_SHORT_UNIX = re.compile(r"(\d+(?:\.\d+)?)\s+(.*)")
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-9A-Fa-f])?\): "
    r"(\d+)(?:,\s*(.*))?"
)
_BUS_ID = re.compile(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.[0-9A-Fa-f]")
_PID = re.compile(r"pid=(\d+)(?:,|$)")
_NAME = re.compile(r"name=([^,]+)")
_ESCAPED = re.compile(r"\\x([0-9a-f]{2})")
XID_MARK = "NVRM: Xid"


class KernelLogUnread(Exception):
    """The kernel log was not read to its end: `why`, in words an operator can act on."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass(frozen=True, kw_only=True)
class Xid:
    """An Xid event of the kernel log, or a group of them (the same PCI address, code and pid): the first one's
    time and text, how many, and when the last one was logged."""

    at: float        # seconds since the epoch (journalctl -o short-unix)
    pci: str         # "0000:1b:00" (domain:bus:device, lowercase), the key `pci_of_bus_id` gives a GPU
    code: int
    detail: str      # the message after the code: "pid=1234, name=python3, GPU has fallen off the bus."
    count: int = 1
    last_at: float | None = None  # the last one's time, when count > 1
    folded: bool = False  # lines of more pids than the read keeps apart: whose they are is not known

    @property
    def pid(self) -> int | None:
        """The pid the line names (`pid=1234,`); None for `pid='<unknown>'`, none at all, or a folded group."""
        found = None if self.folded else _PID.match(self.detail)
        return int(found.group(1)) if found else None

    @property
    def process(self) -> str | None:
        """The process name the line gives (`name=python3`), when it gives one."""
        found = _NAME.search(self.detail) if self.pid is not None else None
        return found.group(1).strip() if found and found.group(1) != "<unknown>" else None

    @property
    def process_name(self) -> bytes | None:
        """The process (thread) name as the kernel wrote it, bytes (`process` is its escaped text)."""
        name = self.process
        return None if name is None else unescape(name)

    @property
    def last(self) -> float:
        return self.at if self.last_at is None else self.last_at


@dataclass(frozen=True)
class KernelLog:
    """A kernel-log read that ran to its end: the Xid groups, first met first, the cursor of the last kernel
    message read (a later read's baseline) and how many Xid lines there were."""

    cursor: str
    xids: tuple[Xid, ...] = ()
    lines: int = 0


def read_argv(cursor: str | None = None) -> list[str]:
    """`sh -c KERNEL_LOG_SH fleet-kernel-log XIDS_AWK [CURSOR]`: this boot's kernel log, or what came after CURSOR."""
    if cursor is not None and not _CURSOR.fullmatch(cursor):
        raise ValueError(f"not a journal cursor: {cursor!r}")
    return ["sh", "-c", KERNEL_LOG_SH, "fleet-kernel-log", XIDS_AWK, *([] if cursor is None else [cursor])]


def read(cursor: str | None = None) -> Probe[str]:
    """The kernel log needs root on most systems (the systemd-journal or adm group otherwise). Every exit status
    is read (`reading` says what it means); a hang fails the read with HANG. The read since boot is the same for
    every host: made once (a probe is a value: frozen, no answer); one after a host's cursor is that host's."""
    return _since_boot() if cursor is None else _read(cursor)


@functools.cache
def _since_boot() -> Probe[str]:
    return _read(None)


def _read(cursor: str | None) -> Probe[str]:
    return Probe(argv=tuple(read_argv(cursor)), what="journalctl -k", parse=_stdout, needs_root=True, ok_exits=ANY_EXIT,
                 reads="kernel log", hang=HANG)


def _stdout(text: str) -> str:
    return text


def reading(result: CommandResult) -> KernelLog:
    """What a read found, or KernelLogUnread: only journalctl's exit 0, the summary's end and a cursor prove the
    log was read to its end."""
    rows = [line for _, line in lines(result.stdout)]
    end = rows[-1].split() if rows else []
    if len(end) != 5 or end[0] != "end" or not all(n.isdigit() for n in end[2:]):
        raise KernelLogUnread(_failed(result) if result.exit_status not in (0, None) else
                              "the read's output was cut before its end")
    if end[1] != "0" or result.exit_status != 0:
        raise KernelLogUnread(_failed(result, None if end[1] == "-" else end[1]))
    if int(end[3]):
        raise KernelLogUnread(f"{end[3]} Xid lines of more than {GROUPS} kinds were not kept")
    if int(end[4]):
        raise KernelLogUnread(f"{end[4]} kernel messages journalctl did not print as their bytes ([N blob data], or a"
                              " line of no message): an Xid among them would be missed")
    cursors = [r.removeprefix("-- cursor: ") for r in rows[:-1] if r.startswith("-- cursor: ")]
    if not cursors:
        said = first_line(result.stderr) if result.stderr.strip() else ""
        raise KernelLogUnread("journalctl read no kernel message of this boot (it named no cursor)"
                              + (f": {said}" if said else ""))
    return KernelLog(cursors[-1], _groups([r for r in rows[:-1] if not r.startswith("-- cursor: ")]), int(end[2]))


def _failed(result: CommandResult, status: str | None = None) -> str:
    """`journalctl exited 1: No journal files were found.`: the first thing it said on stderr."""
    if status is None and result.exit_status == STATUS_NEVER_CAME:
        return "the read ended before journalctl did"
    said = first_line(result.stderr) if result.stderr.strip() else "nothing on stderr"
    return f"journalctl exited {status or result.exit_status}: {said}"


def _groups(rows: list[str]) -> tuple[Xid, ...]:
    """`first COUNT PID LINE` (and `last COUNT PID LINE` after it when COUNT > 1) -> one Xid each."""
    found: list[Xid] = []
    for row in rows:
        kind, count, pid, line = [*row.split(" ", 3), "", "", ""][:4]
        if kind not in ("first", "last") or not count.isdigit() or (kind == "last" and not found):
            raise KernelLogUnread(f"the read printed what fleet cannot read: {clip(row, LINE_CLIP)!r}")
        try:
            xid = parse_xid_line(line)
        except ProbeParseError as exc:
            raise KernelLogUnread(f"an Xid line fleet cannot read ({exc.reason}): {clip(line, LINE_CLIP)!r}") from exc
        if kind == "first":
            found.append(Xid(at=xid.at, pci=xid.pci, code=xid.code, detail=xid.detail, count=int(count),
                             folded=pid == FOLDED))
        else:
            found[-1] = replace(found[-1], last_at=xid.at)
    return tuple(found)


def parse_xids(text: str) -> tuple[Xid, ...]:
    """The `NVRM: Xid (...)` lines of `journalctl -o short-unix` output, one Xid each; other lines are ignored."""
    return tuple(_line_xid(lineno, line) for lineno, line in lines(text) if XID_MARK in line)


def parse_xid_line(line: str) -> Xid:
    """One `journalctl -o short-unix` line that names an Xid."""
    return _line_xid(1, line)


def _line_xid(lineno: int, line: str) -> Xid:
    stamped = _SHORT_UNIX.fullmatch(line.strip())
    if stamped is None:
        raise ProbeParseError(lineno, line, "no short-unix timestamp")
    found = _XID.search(stamped.group(2))
    if found is None:
        raise ProbeParseError(lineno, line, "Xid line without '(PCI:dddd:bb:dd): code'")
    domain, bus, device, code, detail = found.groups()
    return Xid(at=float(stamped.group(1)), pci=_pci(domain, bus, device), code=int(code),
               detail=(detail or "").strip())


def unescape(text: str) -> bytes:
    """The bytes of a kept line's text (xids.awk writes each byte outside printable ASCII, and `\\`, as `\\xNN`)."""
    parts = _ESCAPED.split(text)
    return b"".join(bytes([int(part, 16)]) if odd else part.encode("ascii", "backslashreplace")
                    for odd, part in zip(itertools.cycle((False, True)), parts, strict=False))


@functools.lru_cache(maxsize=1024)
def pci_of_bus_id(bus_id: str) -> str:
    """`00000000:1B:00.0` (nvidia-smi's bus id) -> `0000:1b:00`, the address an Xid line names: a function of the
    text alone, worked out once for every GPU and host that prints it (the health gate asks it of every GPU, twice:
    its Xids' owners, the processes the reset ended), not once a GPU and read. One that is not a bus id raises
    each time (an exception is never kept)."""
    match = _BUS_ID.fullmatch(bus_id.strip())
    if match is None:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    return _pci(*match.groups())


def _pci(domain: str, bus: str, device: str) -> str:
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}"
