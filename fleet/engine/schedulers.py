"""Workload managers, by the name `--scheduler` (its alias `--slurm`) or the inventory's `scheduler:` gives them.

A scheduler is a plug: a module that provides `PLUG`, a `Plug` whose `lifecycle` builds the `Scheduler` (below)
a run walks its hosts through, whose `run_via`, when it has one, runs the whole reset through the scheduler
instead of SSH fan-out (Slurm's `--via srun`), and whose `targets`, when it has one, names the hosts of a part of
the cluster (Slurm's `--partition`). Its node side (the job daemons and job cgroups a reset never kills, how
reasons name them) is a second module, `JOBS` (`fleet.node.jobs`). Both are named in one row of
`fleet.model.plugs.SCHEDULERS` (`REGISTRY` here): a scheduler's code is only imported when a run asks for it,
and `fleet.inventory` checks a `scheduler:` value without importing any.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fleet.model import plugs

if TYPE_CHECKING:
    from fleet.engine.interrupts import Interrupts
    from fleet.engine.options import RunOptions, RunState
    from fleet.engine.walk import HostEnded, HostRun, Watch
    from fleet.inventory.host import Host
    from fleet.inventory.load import Inventory
    from fleet.model.hostlog import HostLog
    from fleet.model.report import HostReport, HostStatus, Reason, RunReport, SchedulerRecord
    from fleet.runlog.folder import RunLogs


@dataclass(frozen=True)
class Ready:
    """A scheduler's answer for one host: its record as it stands, and None when the host may be reset now, else
    the outcome it ends with, untouched (status, one-line error, reason)."""

    record: SchedulerRecord | None
    outcome: tuple[HostStatus, str, Reason] | None = None


class Scheduler(Protocol):
    """A workload manager around each host's walk (see the module docstring). It returns what it decided; the
    graph records it on the host (`HostRun.scheduler`)."""

    async def serve(self) -> None:
        """Background work for the whole run (polling); cancelled when the run ends."""

    async def admit(self, runs: Sequence[HostRun]) -> Mapping[str, SchedulerRecord]:
        """Before a wave starts: read and take its nodes out of service; each host's record, by host name."""

    async def ready(self, run: HostRun, log: HostLog) -> Ready:
        """Wait until the host may be touched; else the outcome it ends with, untouched."""

    async def release(self, run: HostRun, report: HostReport, log: HostLog) -> SchedulerRecord | None:
        """After the host's outcome: give its node back, or keep it out of service (shielded, bounded); the
        host's record as it left it."""


# name -> the modules of its two sides (the registry itself: a test adds a row and takes it out again)
REGISTRY = plugs.SCHEDULERS

Lifecycle = Callable[["RunOptions", "RunLogs", "Interrupts | None"], "Scheduler"]


class RunVia(Protocol):
    """The run through the scheduler itself (`Plug.run_via`, taken when `SchedulerOptions.fan_out` asks): every
    host's report, as `fleet.engine.graph.run_hosts` gives it, and the run's state."""

    def __call__(self, hosts: Sequence[Host], options: RunOptions, logs: RunLogs, *,
                 on_host_end: HostEnded | None = None, interrupts: Interrupts | None = None,
                 watch: Watch | None = None,
                 tell: Callable[[str], None] | None = None) -> Awaitable[tuple[RunReport, RunState]]: ...


# (a part's name, the inventory or None) -> the host names of that part's nodes; UsageError when it has none. The
# command line calls it before any run starts (no event loop yet: it runs its own).
Targets = Callable[[str, "Inventory | None"], list[str]]


@dataclass(frozen=True)
class Plug:
    """What a scheduler module provides (see the module docstring)."""

    lifecycle: Lifecycle
    run_via: RunVia | None = None  # taken when `SchedulerOptions.fan_out` asks the scheduler to fan out
    targets: Targets | None = None  # `--partition NAME`: the hosts of that part of the cluster


def names() -> tuple[str, ...]:
    """The scheduler names `scheduler:` and `--scheduler` accept."""
    return tuple(sorted(REGISTRY))


def plug(name: str) -> Plug:
    """The named scheduler's plug; ValueError for a name the registry does not know."""
    found = plugs.provided(REGISTRY[plugs.known(REGISTRY, "scheduler", name)].plug, "PLUG")
    assert isinstance(found, Plug)
    return found
