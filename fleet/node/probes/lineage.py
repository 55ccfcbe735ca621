"""Where a process comes from: its ancestors and fleet's own process chain, in one read-only awk.

`lineage_argv` runs the awk program in `lineage.awk` (beside this file) over
/proc/PID/stat. It walks up the ppid chain from itself (`/proc/self`: the probe
command, whose ancestors are the session fleet runs in, alive while it runs)
and from each pid given, and prints `pid<TAB>ppid<TAB>starttime<TAB>comm` once per process it
met. A chain cannot be read later, one command at a time: `timeout` and the
shell between fleet and the probe are gone once the probe has exited, and the
chain breaks there.

A chain is whole when it reaches a process whose parent is pid 0 (init, or a
container's init); one that ends anywhere else was cut (the walk's depth ran
out, or a process vanished mid-walk), and `Lineage.ancestry` says where: what
lies above is unknown, never "nothing".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources

from fleet.node.probe import Probe
from fleet.node.probes.escapes import EscapeError, lossy_text, unescape
from fleet.node.probes.parse import ProbeParseError, lines, parse_int

# Most ancestors the lineage walk reads from any one starting pid.
LINEAGE_DEPTH = 64
# The awk program, its comment lines dropped (they are for readers of the file, not for the wire).
LINEAGE_AWK = "\n".join(
    line for line in (resources.files("fleet.node.probes") / "lineage.awk").read_text().splitlines()
    if line.strip() and not line.lstrip().startswith("#")
)


@dataclass(frozen=True, kw_only=True)
class ProcStat:
    """One process as /proc/PID/stat tells it: its parent, its comm (15 characters at most) and its start
    time (clock ticks since boot; with the pid, the process's identity: a reused pid starts later)."""

    pid: int
    ppid: int
    comm: str
    start: int | None = None


@dataclass(frozen=True)
class Ancestry:
    """A process's ancestors as the walk read them, parent first; `cut_at`: the pid the read stopped at
    before reaching the top (the process itself when it was not read at all), None when it is whole."""

    chain: tuple[ProcStat, ...]
    cut_at: int | None = None


@dataclass(frozen=True)
class Lineage:
    """The processes a lineage walk met, and fleet's own chain among them."""

    procs: Mapping[int, ProcStat]
    own: tuple[int, ...] = ()  # the probe command, its parent, ... up to init

    def ancestry(self, pid: int) -> Ancestry:
        """pid's ancestors up to a process whose parent is pid 0, or to where the walk was cut: a parent it
        did not read, or one met twice (a loop: pids reused mid-walk)."""
        current = self.procs.get(pid)
        if current is None:
            return Ancestry((), pid)
        chain: list[ProcStat] = []
        seen = {pid}
        while current.ppid != 0:
            parent = self.procs.get(current.ppid)
            if parent is None or parent.pid in seen:
                return Ancestry(tuple(chain), current.pid)
            chain.append(parent)
            seen.add(parent.pid)
            current = parent
        return Ancestry(tuple(chain))

    def ancestors(self, pid: int, depth: int = LINEAGE_DEPTH) -> list[ProcStat]:
        """pid's parent, grandparent, ... as far as the walk read them (at most `depth`)."""
        return list(self.ancestry(pid).chain[:depth])


def _pid_words(pids: Sequence[int]) -> list[str]:
    if not pids or any(pid < 1 for pid in pids):
        raise ValueError(f"invalid pids: {list(pids)}")
    return [str(pid) for pid in pids]


def lineage_argv(pids: Sequence[int]) -> list[str]:
    """`env LC_ALL=C awk -v depth=N PROGRAM self PID...`: the awk reads no input; its operands are where the
    walks start. The C locale: the awk escapes each comm's bytes, never a locale's characters."""
    return ["env", "LC_ALL=C", "awk", "-v", f"depth={LINEAGE_DEPTH}", LINEAGE_AWK, "self", *_pid_words(pids)]


def parse_lineage(text: str) -> Lineage:
    """`self<TAB>PID` and `pid<TAB>ppid<TAB>starttime<TAB>comm` lines into a Lineage."""
    procs: dict[int, ProcStat] = {}
    me: int | None = None
    for lineno, line in lines(text):
        if line.startswith("self\t"):
            me = parse_int(line[5:], lineno, line, "self pid")
        else:
            row = _stat_line(lineno, line)
            procs[row.pid] = row
    return Lineage(procs, _chain(me, procs))


def _stat_line(lineno: int, line: str) -> ProcStat:
    """`pid<TAB>ppid<TAB>starttime<TAB>comm`, comm escaped (`\\ooo`, see lineage.awk): no tab, no space in it."""
    parts = line.split("\t")
    if len(parts) != 4 or any(c.isspace() for c in parts[3]):
        raise ProbeParseError(lineno, line, "expected pid<TAB>ppid<TAB>starttime<TAB>comm (escaped)")
    pid, ppid = parse_int(parts[0], lineno, line, "pid"), parse_int(parts[1], lineno, line, "ppid")
    try:
        comm = lossy_text(unescape(parts[3]))
    except EscapeError as exc:
        raise ProbeParseError(lineno, line, str(exc)) from None
    return ProcStat(pid=pid, ppid=ppid, comm=comm, start=parse_int(parts[2], lineno, line, "starttime"))


def _chain(pid: int | None, procs: Mapping[int, ProcStat]) -> tuple[int, ...]:
    chain: list[int] = []
    while pid is not None and pid in procs and pid not in chain:
        chain.append(pid)
        pid = procs[pid].ppid
    return tuple(chain)


def lineage(pids: Sequence[int]) -> Probe[Lineage]:
    """The holders' ancestors and fleet's own chain; without them nothing is judged."""
    return Probe(argv=tuple(lineage_argv(pids)), what="process lineage (awk)", parse=parse_lineage, needs_root=True,
                 reads="process lineage")
