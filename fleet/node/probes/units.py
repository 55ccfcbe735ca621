"""systemd probes: a unit's state, stopping and killing it, its Restart= setting, and the unit a process runs in.

* `unit_state`, `unit_restart`: `systemctl show` (no root needed);
* `unit_stop` (`--no-block`: drain polls the state itself) and `unit_kill`
  (SIGKILL to every process of the unit): root. `systemctl stop` exits 5 for
  a unit that is not loaded: nothing to stop, an answer;
* `units_of`: pid -> the system service it runs in, from /proc/PID/cgroup
  (`unit_of_cgroup`: cgroup v2 `0::/system.slice/x.service`, v1
  `1:name=systemd:/system.slice/x.service`). Session scopes, user managers and
  the root cgroup are no unit fleet may stop: None. On a simulated node (host
  variable `simulated`), which has no cgroups of its own, the unit is read from
  the simulator's stand-in: the `FLEET_SIM_UNIT=NAME` entry its unit supervisor
  (`fleet.sim.unitd`) puts in the environment of a unit's processes. On a real
  node that entry is never consulted, so no process can name its own unit.

Every reader exits non-zero when a pid vanished mid-read; what it printed is
still the answer (the parsers read stdout only).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from fleet.inventory import validate
from fleet.node.probe import ANY_EXIT, Probe, action
from fleet.node.probes.parse import ProbeParseError, lines, parse_int

# The variable a simulated node's unit supervisor (`fleet.sim.unitd`) puts in the environment of its units'
# processes, standing in for the cgroup a real node's systemd gives them. Declared here, where it is read: the
# simulator knows the product, never the other way round.
SIM_UNIT_VAR = "FLEET_SIM_UNIT"
# Beside it, the simulated node the process belongs to: simulated nodes share one /proc (in tests, many at once).
SIM_NODE_VAR = "FLEET_SIM_UNIT_NODE"

# `systemctl stop` exits 5 for a unit that is not loaded: nothing to stop, not an error.
STOP_ANSWERS = frozenset({0, 5})

_CGROUP_LINE = re.compile(r"/proc/(\d+)/cgroup:(\d+):([^:]*):(.*)")
_ENVIRON_RECORD = re.compile(r"/proc/(\d+)/environ:" + SIM_UNIT_VAR + "=(.*)", re.DOTALL)


@dataclass(frozen=True, kw_only=True)
class UnitState:
    active_state: str
    sub_state: str | None
    main_pid: int | None
    load_state: str | None = None  # `not-found`: the node has no such unit (a typo in `services`)

    @property
    def is_down(self) -> bool:
        return self.active_state in {"inactive", "failed"}

    @property
    def missing(self) -> bool:
        """systemd knows no such unit (`LoadState=not-found`): it shows it inactive, and stops it without error."""
        return self.load_state == "not-found"

    @property
    def label(self) -> str:
        """What a person reads of it: its ActiveState, or `not-found`."""
        return "not-found" if self.missing else self.active_state


def _pid_words(pids: Sequence[int]) -> list[str]:
    if not pids or any(pid < 1 for pid in pids):
        raise ValueError(f"invalid pids: {list(pids)}")
    return [str(pid) for pid in pids]


def _unit(unit: str) -> str:
    if not unit.strip():
        raise ValueError("empty unit name")
    return unit


def unit_state_argv(unit: str) -> list[str]:
    return ["systemctl", "show", "--property=LoadState,ActiveState,SubState,MainPID", "--", _unit(unit)]


def unit_stop_argv(unit: str) -> list[str]:
    return ["systemctl", "stop", "--no-block", "--", _unit(unit)]


def unit_kill_argv(unit: str) -> list[str]:
    """SIGKILL to every process of the unit. `--kill-who=` is the spelling every systemd accepts (the
    newer `--kill-whom=` is unknown before systemd 252: Debian 11, Ubuntu 22.04 and RHEL 8 reject it)."""
    return ["systemctl", "kill", "--kill-who=all", "--signal=SIGKILL", "--", _unit(unit)]


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
    return UnitState(active_state=props["ActiveState"], sub_state=props.get("SubState") or None,
                     main_pid=main_pid or None, load_state=props.get("LoadState") or None)


def cgroup_argv(pids: Sequence[int]) -> list[str]:
    """`grep -s -H -e '' -- /proc/PID/cgroup...`: every line, prefixed with its file."""
    return ["grep", "-s", "-H", "-e", "", "--", *(f"/proc/{pid}/cgroup" for pid in _pid_words(pids))]


def unit_of_cgroup(path: str) -> str | None:
    """The system service a cgroup path lies in, such as `sglang.service`; None outside one.

    The top-level `.service` component names it: the unit systemd manages. A
    service may delegate subgroups below its own, and those may be named
    `*.service` too (a container runtime's, a user's): they are not units
    `systemctl stop` knows. Anything under user.slice (session scopes,
    user@UID.service and its user units), scopes, the root and names fleet would
    refuse are None.
    """
    parts = [p for p in path.split("/") if p]
    if "user.slice" in parts:
        return None
    services = [p for p in parts if p.endswith(".service")]
    return _valid_unit(services[0]) if services else None


@dataclass(frozen=True)
class CgroupLine:
    """One line of /proc/PID/cgroup: `kind` is `v2` for the unified hierarchy (`0::PATH`), else the v1
    hierarchy's controllers (`name=systemd`, `memory`, `cpu,cpuacct`, ...)."""

    pid: int
    kind: str
    path: str


def cgroup_lines(text: str) -> list[CgroupLine]:
    """`cgroup_argv` output (`/proc/PID/cgroup:ID:CONTROLLERS:PATH` lines), each line read."""
    found = []
    for lineno, line in lines(text):
        match = _CGROUP_LINE.fullmatch(line)
        if match is None:
            raise ProbeParseError(lineno, line, "expected /proc/PID/cgroup:ID:CONTROLLERS:PATH")
        pid, hierarchy, controllers, path = match.groups()
        found.append(CgroupLine(int(pid), "v2" if (hierarchy, controllers) == ("0", "") else controllers, path))
    return found


def parse_cgroups(text: str) -> dict[int, str]:
    """pid -> unit from `cgroup_argv` output; the v2 line wins, then v1's name=systemd."""
    found: dict[int, dict[str, str]] = {}
    for line in cgroup_lines(text):
        unit = unit_of_cgroup(line.path)
        if unit is not None and line.kind in ("v2", "name=systemd"):
            found.setdefault(line.pid, {})[line.kind] = unit
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


# --- the probes -------------------------------------------------------------

# A unit's probes made once for every host and poll that asks of the same unit (a probe is a value: frozen, what to
# run and how to read it, no answer), not once a host and poll.
_MADE = 256


@functools.lru_cache(maxsize=_MADE)
def unit_state(unit: str) -> Probe[UnitState]:
    return Probe(argv=tuple(unit_state_argv(unit)), what=f"systemctl show {unit}", parse=parse_unit_state)


@functools.lru_cache(maxsize=_MADE)
def unit_state_before_stop(unit: str) -> Probe[UnitState]:
    """`unit_state` read in the stop's batch before the stop (whether the stop ends a running unit). It runs with
    the stop's privilege: on a `become` host a batch is one command a privilege, the privileged one first, so it
    still runs before the stop."""
    return Probe(argv=("systemctl", "show", "--property=ActiveState", "--", _unit(unit)),
                 what=f"systemctl show {unit} (before its stop)", parse=parse_unit_state, needs_root=True)


@functools.lru_cache(maxsize=_MADE)
def unit_stop(unit: str) -> Probe[str]:
    return action(unit_stop_argv(unit), f"systemctl stop {unit}", needs_root=True, ok_exits=STOP_ANSWERS)


@functools.lru_cache(maxsize=_MADE)
def unit_kill(unit: str) -> Probe[str]:
    return action(unit_kill_argv(unit), f"systemctl kill {unit}", needs_root=True)


@functools.lru_cache(maxsize=_MADE)
def unit_restart(unit: str) -> Probe[str | None]:
    """Its Restart= setting; a failed read is no setting (`ANY_EXIT`: the caller keeps only exit 0's)."""
    return Probe(argv=tuple(unit_restart_argv(unit)), what=f"systemctl show {unit}", parse=parse_unit_restart,
                 ok_exits=ANY_EXIT)


# A unit's members: every process's cgroup lines naming it (the shell lists /proc). On a simulated node, the
# stand-in's `FLEET_SIM_UNIT=` records of the processes of the same simulated node as a known member (`$2`).
MEMBERS_SH = 'exec grep -s -H -F -e "$1" -- /proc/[0-9]*/cgroup'
MEMBERS_SIM_SH = f"""node=$(grep -a -z -s -x -e "{SIM_NODE_VAR}=.*" "/proc/$2/environ" | tr -d '\\000')
[ -n "$node" ] || exit 3
for f in $(grep -a -z -s -l -x -F -e "$1" /proc/[0-9]*/environ); do
  grep -a -z -s -q -x -F -e "$node" "$f" && printf '%s:%s\\000' "$f" "$1"
done
exit 0"""


def members_argv(unit: str, *, simulated: bool, known: int | None = None) -> list[str]:
    """Every process's cgroup lines that name `unit` (on a simulated node, its stand-in's `FLEET_SIM_UNIT=` records,
    of the simulated node `known`, a member, belongs to), prefixed with their file: the shell lists /proc, the
    unit's name is the fixed string grep looks for (the lines found are then read as `parse_cgroups` reads them, so
    a name that only contains it is no member)."""
    name = _unit(unit)
    if simulated:
        if known is None or known < 2:
            raise ValueError("a simulated node's unit members are read beside a known member")
        return ["sh", "-c", MEMBERS_SIM_SH, "fleet-unit-members", f"{SIM_UNIT_VAR}={name}", str(known)]
    return ["sh", "-c", MEMBERS_SH, "fleet-unit-members", f"/{name}"]


def unit_members(unit: str, *, simulated: bool, known: int | None = None) -> Probe[frozenset[int]]:
    """The pids of every process in `unit` (its cgroup and the cgroups below it), as the node says now. grep's 0
    (found), 1 (none) and 2 (a process ended while it read) are answers; any other status fails the read."""
    def members(text: str) -> frozenset[int]:
        found = parse_sim_units(text) if simulated else parse_cgroups(text)
        return frozenset(pid for pid, name in found.items() if name == unit)
    return Probe(argv=tuple(members_argv(unit, simulated=simulated, known=known)), what=f"processes of {unit}",
                 parse=members,
                 needs_root=True, ok_exits=frozenset({0, 1, 2}))


def units_of(pids: Sequence[int], *, simulated: bool) -> Probe[dict[int, str]]:
    """pid -> systemd unit: from /proc/PID/cgroup, or on a simulated node from its stand-in."""
    if simulated:
        return Probe(argv=tuple(sim_units_argv(pids)), what="simulated unit listing", parse=parse_sim_units,
                     needs_root=True,
                     ok_exits=ANY_EXIT, reads="cgroup listing")
    return Probe(argv=tuple(cgroup_argv(pids)), what="cgroup listing", parse=parse_cgroups, needs_root=True,
                 ok_exits=ANY_EXIT)
