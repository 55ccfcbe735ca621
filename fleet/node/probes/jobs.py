"""The job a process runs in, from its cgroup (/proc/PID/cgroup): whatever its parent.

A workload manager puts every process of a job in the job's cgroup, and the cgroup's path names the job: each
registered scheduler's node side reads its own layout (`fleet.node.jobs.JobSide.job_of_cgroup`; Slurm's,
`fleet.slurm.jobs`). A pid with no line read (it exited mid-read) has no job by cgroup: its lineage still
judges it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleet.node.jobs import JobSide, job_sides
from fleet.node.probe import Probe
from fleet.node.probes.units import cgroup_argv, cgroup_lines


@dataclass(frozen=True)
class JobCgroup:
    """The job a process's cgroup names, that cgroup's path as /proc/PID/cgroup gave it, and whose job it is (the
    scheduler's name in the registry)."""

    job: str  # the scheduler's id of it (`4711`, a pod's UID)
    path: str
    side: str


def job_of_path(path: str, sides: Sequence[JobSide]) -> tuple[str, str] | None:
    """(job, scheduler) of the first registered side whose job cgroup `path` lies in, or None."""
    for side in sides:
        job = side.job_of_cgroup(path)
        if job is not None:
            return job, side.name
    return None


def parse_job_cgroups(text: str) -> dict[int, JobCgroup]:
    """pid -> its job's cgroup from `cgroup_argv` output (the first line that names a job: v2, or any v1
    controller's); pids in no job's cgroup are absent."""
    sides = job_sides()
    found: dict[int, JobCgroup] = {}
    for line in cgroup_lines(text):
        if line.pid in found:
            continue
        job = job_of_path(line.path, sides)
        if job is not None:
            found[line.pid] = JobCgroup(job[0], line.path, job[1])
    return found


def job_cgroups(pids: Sequence[int]) -> Probe[dict[int, JobCgroup]]:
    """pid -> the job its cgroup names. A pid that vanished mid-read makes grep exit 2: what it printed is still
    the answer; any other status but 0 and 1 (a grep that could not run) is no answer, never "in no job"."""
    return Probe(argv=tuple(cgroup_argv(pids)), what="cgroup listing", parse=parse_job_cgroups, needs_root=True,
                 ok_exits=GREP_ANSWERS)


# grep's answers: found (0), none (1), a file it could not read (2: a process that ended while it read).
GREP_ANSWERS = frozenset({0, 1, 2})
