"""What a run reports: host and step outcomes, killed processes, GPUs, the dry-run plan. Frozen, no I/O."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from fleet.model.fabric import FabricManager
from fleet.model.gpu_facts import GpuSettings
from fleet.model.outcomes import HostStatus as HostStatus
from fleet.model.outcomes import Level as Level
from fleet.model.outcomes import Reason as Reason
from fleet.model.outcomes import StepName as StepName
from fleet.model.outcomes import StepStatus as StepStatus
from fleet.model.outcomes import Verdict as Verdict
from fleet.model.outcomes import line_of as line_of


@dataclass(frozen=True, kw_only=True)
class StepResult:
    name: StepName
    status: StepStatus
    duration_s: float = 0.0
    detail: str = ""
    error: str | None = None  # one line, set when status is failed/timeout
    reason: Reason | None = None  # set with error

    @classmethod
    def since(cls, name: StepName, started: float, detail: str, status: StepStatus = StepStatus.OK,
              error: str | None = None, reason: Reason | None = None) -> StepResult:
        """The result of a step that began at `started` (monotonic clock) and ends now."""
        return cls(name=name, status=status, duration_s=round(time.monotonic() - started, 3), detail=detail,
                   error=error, reason=reason)


@dataclass(frozen=True, kw_only=True)
class KilledProcess:
    pid: int
    name: str
    user: str
    signal: str  # "SIGTERM" or "SIGKILL": the last signal it needed


@dataclass(frozen=True, kw_only=True)
class KeptProcess:
    """A GPU holder the kill left alive on purpose, and why (its protection: `protected name nvidia-persistenced`,
    `a Slurm job's process (job 4711, ...)`): `{"pid", "name", "user", "why"}`."""

    pid: int
    name: str
    user: str
    why: str


@dataclass(frozen=True)
class Finding:
    """One health fact about a GPU (or the node) and what it weighs: `{"check", "level", "detail"}`."""

    check: str
    level: Level
    detail: str


@dataclass(frozen=True, kw_only=True)
class HostFinding:
    """A health fact that belongs to no GPU nvidia-smi listed: an Xid on another PCI address (`pci`: an NVSwitch, a
    GPU that fell off the bus), or the node's own (`pci` None: a kernel log fleet could not read).
    `{"check", "level", "detail", "pci"}`."""

    check: str
    level: Level
    detail: str
    pci: str | None = None


@dataclass(frozen=True, kw_only=True)
class GpuReport:
    index: int
    memory_used_mib: int | None
    uuid: str | None = None
    name: str | None = None
    memory_total_mib: int | None = None
    settle_s: float | None = None  # seconds from settle start until under threshold
    health: tuple[Finding, ...] = ()  # what verify's health gate found on this GPU
    settings: GpuSettings | None = None  # what nvidia-smi said of its settings at verify


@dataclass(frozen=True, kw_only=True)
class StepOutcome:
    """What one step came to: its line in the report (`result`) and what it learned for the host's report."""

    result: StepResult
    killed: tuple[KilledProcess, ...] = ()
    gpus: tuple[GpuReport, ...] = ()
    settle_s: Mapping[int, float] = field(default_factory=dict)  # GPU index -> seconds until it settled
    kept: frozenset[int] = frozenset()  # pids of GPU holders left alive on purpose (protected)
    health: tuple[HostFinding, ...] = ()  # verify's health findings on no listed GPU (the host's)
    job_pids: frozenset[int] = frozenset()  # pids of GPU holders left alive as a Slurm job's processes
    spared: frozenset[int] = frozenset()  # pids of every GPU holder the kill left alive on purpose (any protection)
    left_alive: tuple[KeptProcess, ...] = ()  # the last round's kept holders, each with why (the report's `kept`)
    fabric_manager: FabricManager | None = None  # verify's read of the node's fabric manager (None: not read)
    stopped: tuple[str, ...] = ()  # units this step found up and stopped (drain; the kill's `--stop-units`)


@dataclass(frozen=True, kw_only=True)
class PlannedProcess:
    """A GPU holder a dry run found: what a reset would do to it and why."""

    pid: int
    user: str
    name: str
    mib: int | None  # GPU memory it uses, from nvidia-smi's compute apps (None: not a compute app)
    kept_because: str | None = None  # set for a protected holder a reset would leave alive


@dataclass(frozen=True, kw_only=True)
class HostPlan:
    """What a reset would do on one host, read from the host without changing it."""

    units: tuple[tuple[str, str], ...] = ()  # (unit, ActiveState) for every unit in `services`
    would_kill: tuple[PlannedProcess, ...] = ()  # holders outside those units: the kill's
    kept: tuple[PlannedProcess, ...] = ()
    gpu_memory_mib: tuple[int | None, ...] = ()
    would_restore: tuple[str, ...] = ()  # `--restore-settings`: each nvidia-smi change, and what waits for a reset
    with_units: tuple[PlannedProcess, ...] = ()  # holders in a unit drain would stop: they end with it

    @property
    def would_stop(self) -> tuple[str, ...]:
        return tuple(unit for unit, state in self.units if state not in ("inactive", "failed"))


@dataclass(frozen=True, kw_only=True)
class SchedulerRecord:
    """A host's node in its workload manager around the run (`--scheduler`): as fleet found it and as it left it.

    Scheduler-neutral (a node, its state and reason before and after, the jobs that held it); `by` names the
    scheduler (`fleet.model.plugs.SCHEDULERS`), whose name is the record's key in the JSON report (`slurm`, as
    0.1 wrote it: `fleet.report.render`) and the tables' column; it is no field of the record's JSON itself."""

    node: str
    state_before: str | None = None
    reason_before: str | None = None
    state_after: str | None = None
    reason_after: str | None = None
    jobs: tuple[str, ...] = ()  # ids of the jobs that held the node when the run reached it
    plan: str | None = None  # dry run: what a reset would do to the node in its scheduler
    error: str | None = None  # a scheduler command that failed for this node (the node's state may differ)
    abandoned: bool = False  # a third interrupt stopped its release: left as fleet drained it for the run
    waited_s: float | None = None  # seconds the host waited for the node's jobs before its reset
    taken_over: str | None = None  # the earlier fleet run whose drain this run took over (failed, or over)
    by: str  # the scheduler's name (a record read from a document before 0.3 is Slurm's: `fleet.model.codec`)


@dataclass(frozen=True, kw_only=True)
class HostReport:
    name: str
    status: HostStatus
    duration_s: float = 0.0
    error: str | None = None
    steps: tuple[StepResult, ...] = ()
    killed: tuple[KilledProcess, ...] = ()
    gpus: tuple[GpuReport, ...] = ()
    plan: HostPlan | None = None  # dry run only
    scheduler: SchedulerRecord | None = None  # with a scheduler (--slurm); the JSON's `slurm`
    reason: Reason | None = None  # set whenever the host did not end clean (or planned)
    memory_before_mib: tuple[int | None, ...] | None = None  # each GPU's memory.used as a reset began
    health: tuple[HostFinding, ...] = ()  # health findings on no listed GPU (an Xid on another PCI address)
    start_s: float | None = None  # seconds from the run's start to the host's (None: it never started)
    kept: tuple[KeptProcess, ...] = ()  # GPU holders the kill left alive on purpose, each with why
    fabric_manager: FabricManager | None = None  # as verify read it (None: verify did not run, or did not read it)
    stopped: tuple[str, ...] = ()  # the units the reset found up and stopped (drain, `--stop-units`)
    restored: tuple[str, ...] = ()  # `--restore-settings`: each nvidia-smi change that took, as a line


@dataclass(frozen=True, kw_only=True)
class RunReport:
    run_id: str
    command: str
    started_at: str
    duration_s: float
    hosts: dict[str, HostReport] = field(default_factory=dict)
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # inventory group -> its hosts in the run
    interrupted_by: str | None = None  # the signal that cut the run short (`SIGINT`, `SIGTERM`, `SIGHUP`)
    # Not in the JSON document (the hosts' errors say it): what cut the run short (`interrupted by SIGINT`, `run
    # deadline of 600 s reached`), and why hosts were left unstarted (the failure budget, the canary); None: neither.
    cut_short: str | None = None
    stopped: str | None = None

    def count(self, status: HostStatus) -> int:
        return sum(1 for h in self.hosts.values() if h.status is status)


def flat(record: Any) -> dict[str, Any]:
    """`dataclasses.asdict` of a record whose fields are plain values (no dataclass, list or dict inside: a
    `KilledProcess`, a `Finding`), without its deep copy: each field by name, its names read once a class."""
    kind = type(record)
    names = _NAMES.get(kind)
    if names is None:
        names = _NAMES[kind] = tuple(f.name for f in fields(kind))
    return {name: getattr(record, name) for name in names}


_NAMES: dict[type, tuple[str, ...]] = {}  # each record class's field names, read once
