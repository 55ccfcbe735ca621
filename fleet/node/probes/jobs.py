"""The Slurm job a process runs in, from its cgroup (/proc/PID/cgroup): whatever its parent.

Slurm puts every process of a job in the job's cgroup: its steps' tasks, the step daemons, and what
`pam_slurm_adopt` adopts into the job's extern step (an ssh login to a node where the user has a job:
its parent is sshd, not slurmstepd). The cgroup's path names the job:

* cgroup v2 (Slurm's `cgroup/v2` plugin, `src/plugins/cgroup/v2/cgroup_v2.c`: `_set_int_cg_ns` and
  the hierarchy drawn above it): `<root>/system.slice/slurmstepd.scope/job_<id>/step_<step>/...`
  (`step_0`, `step_batch`, `step_extern`, `step_interactive`; then `user/task_<n>` or `slurm`), and
  `<root>/system.slice/<node>_slurmstepd.scope/job_<id>/...` when one host runs several slurmd;
* cgroup v1 (`cgroup/v1`, and task/cgroup before it: `"%s/uid_%u"`, `"%s/job_%u"` under
  `CgroupPrepend`, `/slurm` by default, `/slurm_<node>` with several slurmd): in each controller's
  hierarchy (freezer, cpuset, memory, devices, cpuacct), `/slurm/uid_<uid>/job_<id>/step_<step>/...`.

`job_of_cgroup` reads a path the way Slurm writes it: a `job_<id>` right below a `slurmstepd.scope`
(v2) or below `uid_<uid>` below `slurm` (v1), anywhere in the path (a node in a container sees its own
root first). A path under `user.slice` is never a job's: a user's own systemd manager may create
cgroups of any name there; Slurm's are never under it. A pid with no line read (it exited mid-read)
has no job by cgroup: its lineage still judges it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from fleet.node.probe import ANY_EXIT, Probe
from fleet.node.probes.units import cgroup_argv, cgroup_lines

_JOB = re.compile(r"job_(\d+)")
_UID = re.compile(r"uid_\d+")
_STEPD_SCOPE = "slurmstepd.scope"


@dataclass(frozen=True)
class JobCgroup:
    """The Slurm job a process's cgroup names, and that cgroup's path as /proc/PID/cgroup gave it."""

    job: int
    path: str


def job_of_cgroup(path: str) -> int | None:
    """The id of the Slurm job whose cgroup `path` lies in, or None."""
    parts = [p for p in path.split("/") if p]
    if "user.slice" in parts:
        return None
    for at, part in enumerate(parts):
        match = _JOB.fullmatch(part)
        if match is not None and (_below_stepd_scope(parts[:at]) or _below_slurm_uid(parts[:at])):
            return int(match.group(1))
    return None


def _below_stepd_scope(above: Sequence[str]) -> bool:
    return bool(above) and (above[-1] == _STEPD_SCOPE or above[-1].endswith("_" + _STEPD_SCOPE))


def _below_slurm_uid(above: Sequence[str]) -> bool:
    return (len(above) >= 2 and _UID.fullmatch(above[-1]) is not None
            and (above[-2] == "slurm" or above[-2].startswith("slurm_")))


def parse_job_cgroups(text: str) -> dict[int, JobCgroup]:
    """pid -> its job's cgroup from `cgroup_argv` output (the first line that names a job: v2, or any v1
    controller's); pids in no job's cgroup are absent."""
    found: dict[int, JobCgroup] = {}
    for line in cgroup_lines(text):
        job = job_of_cgroup(line.path)
        if job is not None and line.pid not in found:
            found[line.pid] = JobCgroup(job, line.path)
    return found


def job_cgroups(pids: Sequence[int]) -> Probe[dict[int, JobCgroup]]:
    """pid -> the Slurm job its cgroup names. A pid that vanished mid-read makes grep exit 2: what it
    printed is still the answer."""
    return Probe(tuple(cgroup_argv(pids)), "cgroup listing", parse_job_cgroups, needs_root=True, ok_exits=ANY_EXIT)
