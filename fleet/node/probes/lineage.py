"""Where a process comes from: its ancestors, fleet's own process chain, its systemd unit.

* `lineage_argv` runs one read-only awk over /proc/PID/stat. It walks up the
  ppid chain from itself (`/proc/self`: the probe command, whose ancestors are
  the session fleet runs in, alive while it runs) and from each pid given, and
  prints `pid<TAB>ppid<TAB>comm` once per process it met. A chain cannot be read
  later, one command at a time: `timeout` and the shell between fleet and the
  probe are gone once the probe has exited, and the chain breaks there.
* `cgroup_argv` prints /proc/PID/cgroup; `unit_of_cgroup` reads the system
  unit a process runs in from it (cgroup v2 `0::/system.slice/x.service`, v1
  `1:name=systemd:/system.slice/x.service`). Session scopes, user managers and
  the root cgroup are no unit fleet may stop: None.
* The simulated node (`fleet.sim`) has no cgroups of its own: its processes
  live in the test machine's cgroup, which may well be some real unit. As the
  simulator's stand-in for cgroups, its unit supervisor exports
  `FLEET_SIM_UNIT=NAME` to the processes of a unit, and every command fleet runs
  on a simulated node sees `FLEET_SIM_NODE`. Only then (`Lineage.simulated`)
  does fleet read units with `sim_units_argv` instead of `cgroup_argv`; on a
  real node neither variable is consulted, so no process can name its unit.

Every reader exits non-zero when a pid vanished mid-read; what it printed is
still the answer (the parsers read stdout only).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleet.inventory import validate
from fleet.node.probes._parse import ProbeParseError, lines, parse_int

# The environment variable every command on a simulated node sees (set by fleet.sim).
SIM_NODE_VAR = "FLEET_SIM_NODE"
# The simulator's stand-in for cgroups: the unit a simulated process belongs to.
SIM_UNIT_VAR = "FLEET_SIM_UNIT"
# Most ancestors the lineage walk reads from any one starting pid.
LINEAGE_DEPTH = 64

# awk, POSIX only (mawk, gawk, busybox): for each start ("self" first), read
# /proc/PID/stat, cut comm at the *last* ") " (comm may hold spaces and
# parentheses), print pid, ppid and comm, and go on with the parent.
LINEAGE_AWK = " ".join((
    "BEGIN {",
    f'if (ENVIRON["{SIM_NODE_VAR}"] != "") print "simulated";',
    "for (i = 1; i < ARGC; i++) {",
    "pid = ARGV[i];",
    f'for (depth = 0; depth < {LINEAGE_DEPTH} && pid != "0" && !(pid in seen); depth++) {{',
    'file = "/proc/" pid "/stat"; line = "";',
    "ok = (getline line < file) > 0; close(file);",
    r"if (!ok || !match(line, /.*\) /)) break;",
    'open = index(line, " ("); me = substr(line, 1, open - 1);',
    'split(substr(line, RLENGTH + 1), rest, " ");',
    r"if (rest[2] !~ /^[0-9]+$/) break;",
    'if (pid == "self") print "self\\t" me;',
    "seen[me] = 1;",
    'print me "\\t" rest[2] "\\t" substr(line, open + 2, RLENGTH - open - 3);',
    "pid = rest[2] } }",
    "exit }",
))

_CGROUP_LINE = re.compile(r"/proc/(\d+)/cgroup:(\d+):([^:]*):(.*)")
_ENVIRON_RECORD = re.compile(r"/proc/(\d+)/environ:" + SIM_UNIT_VAR + "=(.*)", re.DOTALL)


@dataclass(frozen=True)
class ProcStat:
    """One process as /proc/PID/stat tells it: its parent and its comm (15 characters at most)."""

    pid: int
    ppid: int
    comm: str


@dataclass(frozen=True)
class Lineage:
    """The processes a lineage walk met, and fleet's own chain among them."""

    procs: Mapping[int, ProcStat]
    own: tuple[int, ...] = ()  # the probe command, its parent, ... up to init
    simulated: bool = False  # the command ran on a simulated node (FLEET_SIM_NODE was set)

    def ancestors(self, pid: int, depth: int = LINEAGE_DEPTH) -> list[ProcStat]:
        """pid's parent, grandparent, ... as far as the walk read them (at most `depth`)."""
        chain: list[ProcStat] = []
        current = self.procs.get(pid)
        while current is not None and len(chain) < depth:
            current = self.procs.get(current.ppid)
            if current is not None:
                chain.append(current)
        return chain


def _pid_words(pids: Sequence[int]) -> list[str]:
    if not pids or any(pid < 1 for pid in pids):
        raise ValueError(f"invalid pids: {list(pids)}")
    return [str(pid) for pid in pids]


def lineage_argv(pids: Sequence[int]) -> list[str]:
    """`awk PROGRAM self PID...`: the awk reads no input; its operands are where the walks start."""
    return ["awk", LINEAGE_AWK, "self", *_pid_words(pids)]


def parse_lineage(text: str) -> Lineage:
    """`simulated`, `self<TAB>PID` and `pid<TAB>ppid<TAB>comm` lines into a Lineage."""
    procs: dict[int, ProcStat] = {}
    me: int | None = None
    simulated = False
    for lineno, line in lines(text):
        if line == "simulated":
            simulated = True
        elif line.startswith("self\t"):
            me = parse_int(line[5:], lineno, line, "self pid")
        else:
            row = _stat_line(lineno, line)
            procs[row.pid] = row
    return Lineage(procs, _chain(me, procs), simulated)


def _stat_line(lineno: int, line: str) -> ProcStat:
    parts = line.split("\t", 2)
    if len(parts) != 3:
        raise ProbeParseError(lineno, line, "expected pid<TAB>ppid<TAB>comm")
    return ProcStat(parse_int(parts[0], lineno, line, "pid"), parse_int(parts[1], lineno, line, "ppid"), parts[2])


def _chain(pid: int | None, procs: Mapping[int, ProcStat]) -> tuple[int, ...]:
    chain: list[int] = []
    while pid is not None and pid in procs and pid not in chain:
        chain.append(pid)
        pid = procs[pid].ppid
    return tuple(chain)


# --- systemd unit of a process ------------------------------------------------


def cgroup_argv(pids: Sequence[int]) -> list[str]:
    """`grep -s -H -e '' -- /proc/PID/cgroup...`: every line, prefixed with its file."""
    return ["grep", "-s", "-H", "-e", "", "--", *(f"/proc/{pid}/cgroup" for pid in _pid_words(pids))]


def unit_of_cgroup(path: str) -> str | None:
    """The system service a cgroup path lies in, such as `sglang.service`; None outside one.

    The deepest `.service` component names it (a service may delegate subgroups
    below its own). Anything under user.slice (session scopes, user@UID.service
    and its user units), scopes, the root and names fleet would refuse are None.
    """
    parts = [p for p in path.split("/") if p]
    if "user.slice" in parts:
        return None
    services = [p for p in parts if p.endswith(".service")]
    return _valid_unit(services[-1]) if services else None


def parse_cgroups(text: str) -> dict[int, str]:
    """pid -> unit from `cgroup_argv` output; the v2 line wins, then v1's name=systemd."""
    found: dict[int, dict[str, str]] = {}
    for lineno, line in lines(text):
        match = _CGROUP_LINE.fullmatch(line)
        if match is None:
            raise ProbeParseError(lineno, line, "expected /proc/PID/cgroup:ID:CONTROLLERS:PATH")
        pid, hierarchy, controllers, path = match.groups()
        unit = unit_of_cgroup(path)
        kind = "v2" if (hierarchy, controllers) == ("0", "") else controllers
        if unit is not None and kind in ("v2", "name=systemd"):
            found.setdefault(int(pid), {})[kind] = unit
    return {pid: kinds.get("v2") or kinds["name=systemd"] for pid, kinds in found.items()}


def sim_units_argv(pids: Sequence[int]) -> list[str]:
    """Simulated nodes only: the `FLEET_SIM_UNIT=` record of each /proc/PID/environ, nothing else.

    `grep -z` reads NUL-separated records, so only that one variable is printed
    (never the rest of a process's environment).
    """
    files = [f"/proc/{pid}/environ" for pid in _pid_words(pids)]
    return ["grep", "-a", "-z", "-s", "-H", "-e", f"^{SIM_UNIT_VAR}=", "--", *files]


def parse_sim_units(text: str) -> dict[int, str]:
    """pid -> unit from `sim_units_argv` output (NUL-terminated `/proc/PID/environ:VAR=unit` records)."""
    units: dict[int, str] = {}
    for lineno, record in enumerate(text.split("\0"), start=1):
        if not record.strip():
            continue
        match = _ENVIRON_RECORD.fullmatch(record.strip("\n"))
        if match is None:
            raise ProbeParseError(lineno, record, f"expected /proc/PID/environ:{SIM_UNIT_VAR}=UNIT")
        unit = _valid_unit(match.group(2))
        if unit is not None:
            units[int(match.group(1))] = unit
    return units


def _valid_unit(name: str) -> str | None:
    try:
        return validate.unit_name(name)
    except ValueError:
        return None
