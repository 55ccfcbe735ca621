"""Who may be killed, and which units may be stopped: pure rules, no I/O.

A holder is left alive, with the reason the report gives, when it is PID 1,
part of fleet's own session, an sshd, a scheduler's job's process, has a lineage that
could not be read to its end, has a protected name, descends from a process
with a protected name, or belongs to a user outside `kill_users`.

A job's processes (those in a job's cgroup, whatever their parent, and a job
daemon such as Slurm's slurmstepd and whatever descends from it, however deep:
each registered scheduler's node side, `fleet.node.jobs`) are never killed, in any
mode, and are never part of the machine either: the memory a job holds keeps the
node from being clean. Every rule that looks at ancestors judges the whole
lineage the walk read; a lineage that was cut (its top never reached) is never
taken for "no job": the holder is kept, as nobody's machine.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fleet.inventory.host import Host
from fleet.node.jobs import JobSide, job_sides
from fleet.node.probes.jobs import JobCgroup
from fleet.node.probes.lineage import Ancestry, Lineage, ProcStat
from fleet.node.probes.procs import Identity, PsRow

# /proc/PID/comm holds at most this many characters (TASK_COMM_LEN - 1).
COMM_LEN = 15
# What OpenSSH's daemon is called: since 9.8 it runs sessions as sshd-session (and sshd-auth).
SSHD_NAMES = frozenset({"sshd", "sshd-session", "sshd-auth"})
_DELETED = b" (deleted)"
# Ancestors of every service and session: inheriting a protected name from above them would protect everything.
NOT_INHERITED = frozenset({"systemd", "init"}) | SSHD_NAMES
# Unit names (without suffix) of OpenSSH's daemon: never stopped, whatever respawns.
SSHD_UNITS = frozenset({"ssh", "sshd"})
# A holder whose lineage could not be read to its top: it may be a job's process, so it is kept, never the machine.
LINEAGE_CUT = "lineage not read past pid"


@dataclass(frozen=True, kw_only=True)
class Holder:
    """A process holding a GPU device file, with what we know of it.

    `name` is its full name (comm, or the longer name the kernel cut comm
    from); `protected_by` says why it must be left alive (None: it may be
    killed); `unit` is the system service it runs in, when it runs in one.
    `start` (clock ticks since boot) and `owner` (the owner of its fd table, as
    the scan saw it) are, with the pid and exe, who it is: every signal checks
    them on the node first (`identity`).
    """

    pid: int
    user: str
    name: str
    exe: bytes | None  # its path's bytes, as the kernel has them: who it is, compared as bytes
    devices: tuple[str, ...]
    protected_by: str | None = None
    unit: str | None = None
    comm: str | None = None  # /proc/PID/comm when it differs from `name` (cut to 15 characters)
    start: int | None = None
    owner: str | None = None

    def label(self) -> str:
        return f"pid {self.pid} {self.name}"

    @property
    def part_of_the_machine(self) -> bool:
        """Kept as part of the machine (a protected daemon, its helpers, sshd, fleet's own session): what it
        holds does not make the node unclean. A process kept only because `kill_users` leaves its user
        alone is someone's work on the GPUs: it still does."""
        return self.protected_by is not None and not someones_work(self.protected_by, self.user)

    @property
    def lineage_unread(self) -> bool:
        """Kept only because its lineage could not be read to its end: nobody can say whose it is."""
        return self.protected_by is not None and self.protected_by.startswith(LINEAGE_CUT)

    def identity(self) -> Identity | None:
        """Who this process is, for a signal that must reach only it; None when its start time is unknown."""
        if self.start is None:
            return None
        return Identity(pid=self.pid, start=self.start, exe=self.exe, user=self.owner or self.user)


@dataclass(frozen=True)
class Rules:
    """What a host protects: process names (built-in, `protected`, and every scheduler's job daemons, which its
    plug names) and `kill_users`."""

    protected_names: tuple[str, ...]
    kill_users: tuple[str, ...] = ()  # empty: any user's process may be killed

    @classmethod
    def of(cls, host: Host) -> Rules:
        daemons = tuple(daemon for side in job_sides() for daemon in side.daemons)
        return cls((*host.protected_names, *daemons), host.kill_users)


@dataclass(frozen=True, kw_only=True)
class ProcessFacts:
    """What the probes told about the holders: ps rows, exe links, their lineage, their units, and the job
    their cgroup names."""

    ps: Mapping[int, PsRow]
    exe: Mapping[int, bytes]
    lineage: Lineage = field(default_factory=lambda: Lineage({}))
    units: Mapping[int, str] = field(default_factory=dict)
    jobs: Mapping[int, JobCgroup] = field(default_factory=dict)


# --- names: what a process is called, and which names are protected --------------------------


def _exe_base(exe: bytes | None) -> str | None:
    """The executable's basename as text; None when there is none, or it is not UTF-8 (then it is no name
    any inventory can give: it matches none)."""
    if not exe:
        return None
    try:
        return posixpath.basename(exe.removesuffix(_DELETED)).decode() or None
    except UnicodeDecodeError:
        return None


def full_name(comm: str, argv0: str | None, exe: bytes | None) -> str:
    """The process's name, uncut: comm, unless the kernel cut it to 15 characters and argv[0]'s
    or the executable's basename is the longer name it was cut from."""
    if len(comm) == COMM_LEN:
        for candidate in (argv0, _exe_base(exe)):
            if candidate and len(candidate) > COMM_LEN and candidate.startswith(comm):
                return candidate
    return comm


def is_protected(
    comm: str, exe: bytes | None, protected_names: Sequence[str], name: str | None = None
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


def is_sshd(comm: str, exe: bytes | None, name: str | None = None) -> bool:
    """Whether the process is OpenSSH's daemon, by any of its names (sshd, sshd-session, sshd-auth)."""
    return bool({comm, _exe_base(exe), name} & SSHD_NAMES)


# --- the rules ---------------------------------------------------------------


def outside_kill_users(user: str) -> str:
    """The reason a holder of a user `kill_users` does not name is left alive."""
    return f"user {user} not in kill_users"


def lineage_cut(at: int) -> str:
    """The reason a holder whose lineage was cut at pid `at` is left alive: `...: may be a Slurm job's process`."""
    return f"{LINEAGE_CUT} {at}: may be {' or '.join(side.process for side in job_sides())}"


def someones_work(reason: str, user: str) -> bool:
    """Whether a holder kept for `reason` is someone's work (a job's, a spared user's, or one nobody can place),
    not the machine's: what it holds keeps the node from being clean."""
    return (reason.startswith((*(side.process for side in job_sides()), LINEAGE_CUT))
            or reason == outside_kill_users(user))


def protected_by(holder: Holder, facts: ProcessFacts, rules: Rules) -> str | None:
    """Why `holder` must be left alive (the first rule that applies), or None.

    Never killed: PID 1; fleet's own session (the probe command's ancestors:
    a job that runs `fleet reset` on its own node); any sshd; a job's process
    (its cgroup is a job's, it is a job daemon such as slurmstepd, or one is any
    of its ancestors); a process whose lineage was cut before its top (it may be a
    job's: nothing above the cut is known); a protected name; a descendant of a
    process with a protected name; a process of a user not in `kill_users`, when
    that is set.
    """
    comm = holder.comm or holder.name
    if holder.pid == 1:
        return "pid 1"
    if holder.pid in facts.lineage.own:
        return "fleet's own session"
    if is_sshd(comm, holder.exe, holder.name):
        return "sshd"
    ancestry = facts.lineage.ancestry(holder.pid)
    job = job_reason(holder, ancestry, facts)
    if job is not None:
        return job
    if ancestry.cut_at is not None:
        return lineage_cut(ancestry.cut_at)
    name = is_protected(comm, holder.exe, rules.protected_names, holder.name)
    if name is not None:
        return f"protected name {name}"
    parent = protected_ancestor(holder.pid, facts, rules.protected_names)
    if parent is not None:
        return f"child of {parent[0]} (pid {parent[1]})"
    if rules.kill_users and holder.user not in rules.kill_users:
        return outside_kill_users(holder.user)
    return None


def job_reason(holder: Holder, ancestry: Ancestry, facts: ProcessFacts) -> str | None:
    """`a Slurm job's process (job 4711, cgroup ...)` when its cgroup names a job; `(slurmstepd)` when it is
    a job daemon; `(slurmstepd pid N)` when one is any of its ancestors; else None (`fleet.node.jobs`)."""
    sides = job_sides()
    cgroup = facts.jobs.get(holder.pid)
    if cgroup is not None:
        side = next(side for side in sides if side.name == cgroup.side)
        return f"{side.process} (job {cgroup.job}, cgroup {cgroup.path})"
    for side in sides:
        daemon = is_protected(holder.comm or holder.name, holder.exe, side.daemons, holder.name)
        if daemon is not None:
            return f"{side.process} ({daemon})"
    for parent in ancestry.chain:
        for side in sides:
            matched = _named(parent, facts, side.daemons)
            if matched is not None:
                return f"{side.process} ({matched} pid {parent.pid})"
    return None


@dataclass(frozen=True, kw_only=True)
class JobRef:
    """The job a kept holder is part of, as far as its reason says: whose (`side`), the job id (its cgroup names
    it), and the job daemon above it (the holder itself, or an ancestor): its name and pid."""

    side: JobSide
    job: str | None = None
    daemon: str | None = None
    daemon_pid: int | None = None


def job_of(holder: Holder) -> JobRef | None:
    """The job a holder kept as a job's process is part of (read back from what `job_reason` wrote); None for any
    other holder."""
    reason = holder.protected_by
    side = next((s for s in job_sides() if reason is not None and reason.startswith(s.process)), None)
    if reason is None or side is None:
        return None
    found = re.fullmatch(re.escape(side.process) + r" \((?:job (\S+), cgroup .*|(\S+) pid (\d+)|(\S+))\)", reason)
    if found is None:
        return JobRef(side=side)
    job, above, parent, itself = found.groups()
    if job is not None:
        return JobRef(side=side, job=job)
    if parent is not None:
        return JobRef(side=side, daemon=above, daemon_pid=int(parent))
    return JobRef(side=side, daemon=itself, daemon_pid=holder.pid)


def protected_ancestor(pid: int, facts: ProcessFacts, names: Sequence[str]) -> tuple[str, int] | None:
    """The nearest ancestor with a protected name: (name, pid); as far up as the walk read.

    The walk stops at PID 1, systemd and sshd: every service and session descends from them.
    """
    for parent in facts.lineage.ancestry(pid).chain:
        if parent.pid <= 1 or parent.comm in NOT_INHERITED:
            return None
        matched = _named(parent, facts, names)
        if matched is not None:
            return matched, parent.pid
    return None


def _named(proc: ProcStat, facts: ProcessFacts, names: Sequence[str]) -> str | None:
    """The protected name an ancestor matches (by comm, its full name from ps, or its executable), or None."""
    row = facts.ps.get(proc.pid)
    exe = facts.exe.get(proc.pid)
    return is_protected(proc.comm, exe, names, full_name(proc.comm, row.argv0 if row else None, exe))


def unit_protected_by(unit: str, kept: Sequence[Holder], own_units: Iterable[str], names: Sequence[str]) -> str | None:
    """Why a unit must not be stopped for a respawned holder, or None.

    Not the unit of a process fleet keeps, nor of fleet's own session, nor
    sshd's, nor one named after a protected process (nvidia-persistenced.service).
    """
    stem = unit.rsplit(".", 1)[0].split("@", 1)[0]
    if stem in SSHD_UNITS:
        return "sshd"
    if unit in set(own_units):
        return "fleet's own session"
    if stem in names:
        return f"protected name {stem}"
    keeper = next((h for h in kept if h.unit == unit), None)
    return f"it runs {keeper.label()} ({keeper.protected_by})" if keeper else None


def units_to_stop(
    respawned: Sequence[Holder], kept: Sequence[Holder], own_units: Iterable[str], rules: Rules,
    services: Sequence[str],
) -> tuple[str, ...]:
    """The units `stop_units` may stop: those of respawned holders, known, unprotected, not in services."""
    own = set(own_units)
    units = sorted({h.unit for h in respawned if h.unit and h.unit not in services})
    return tuple(u for u in units if unit_protected_by(u, kept, own, rules.protected_names) is None)
