"""The node side of the workload managers: how a node shows a scheduler's jobs, which a reset never kills.

Each scheduler registered in `fleet.model.plugs.SCHEDULERS` names a module that provides `JOBS`, a `JobSide`:
the daemons whose descendants are its jobs (Slurm's slurmstepd), the cgroup path of a job's processes (whatever
their parent), the job a daemon's process title names, and the words reasons and labels use for it. Every
registered side counts on every host in every mode, whatever scheduler (if any) the run goes through: a job's
processes are someone's work, not the machine's. `fleet.reset` asks these, never a scheduler by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from fleet.model import plugs


@dataclass(frozen=True, kw_only=True)
class JobSide:
    """One scheduler's jobs as a node shows them (see the module docstring). Job ids are the scheduler's own words
    for them, as text (Slurm's numbers, a pod's UID)."""

    name: str  # the registry's name (`slurm`)
    title: str  # how reasons and labels name it: `a Slurm job's process`, `Slurm job 4711`
    daemons: tuple[str, ...]  # process names whose descendants (and themselves) are its jobs' processes
    job_of_cgroup: Callable[[str], str | None]  # the job whose cgroup a /proc/PID/cgroup path lies in, or None
    job_of_title: Callable[[str], str | None]  # the job a daemon's command line (its process title) names, or None
    hint: str  # what to do about GPU memory its jobs hold: `drain the node in Slurm first (...)`

    @property
    def process(self) -> str:
        """How a reason names one of its jobs' processes: `a Slurm job's process`."""
        return f"a {self.title} job's process"


def job_sides() -> tuple[JobSide, ...]:
    """Every registered scheduler's node side, in the registry's order (asked per holder: cached by the registry's
    rows, so a row added or taken out counts at once)."""
    return _sides(tuple(plugs.SCHEDULERS.values()))


@cache
def _sides(rows: tuple[plugs.Scheduled, ...]) -> tuple[JobSide, ...]:
    sides = []
    for scheduled in rows:
        side = plugs.provided(scheduled.jobs, "JOBS")
        assert isinstance(side, JobSide)
        sides.append(side)
    return tuple(sides)


def side_named(name: str) -> JobSide | None:
    """The registered side of that name, or None (a scheduler since taken out of the registry)."""
    return next((side for side in job_sides() if side.name == name), None)
