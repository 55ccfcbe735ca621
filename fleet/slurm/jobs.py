"""Slurm's node side (`JOBS`, a `fleet.node.jobs.JobSide`): slurmstepd, Slurm's job cgroups, its process titles.

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
cgroups of any name there; Slurm's are never under it.

A slurmstepd above a job's process whose cgroup does not name its job says the job in its process title
(Slurm's slurmstepd.c: setproctitle of "[<job>.<step>]"): `job_of_title`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from fleet.node.jobs import JobSide
from fleet.slurm import NAME

_JOB = re.compile(r"job_(\d+)")
_UID = re.compile(r"uid_\d+")
_STEPD_SCOPE = "slurmstepd.scope"
_STEPD_TITLE = re.compile(r"\[(\d+)(?:\+\d+)?\.(?:\d+|batch|extern|interactive)\]")


def job_of_cgroup(path: str) -> str | None:
    """The id of the Slurm job whose cgroup `path` lies in, or None."""
    parts = [p for p in path.split("/") if p]
    if "user.slice" in parts:
        return None
    for at, part in enumerate(parts):
        match = _JOB.fullmatch(part)
        if match is not None and (_below_stepd_scope(parts[:at]) or _below_slurm_uid(parts[:at])):
            return match.group(1)
    return None


def _below_stepd_scope(above: Sequence[str]) -> bool:
    return bool(above) and (above[-1] == _STEPD_SCOPE or above[-1].endswith("_" + _STEPD_SCOPE))


def _below_slurm_uid(above: Sequence[str]) -> bool:
    return (len(above) >= 2 and _UID.fullmatch(above[-1]) is not None
            and (above[-2] == "slurm" or above[-2].startswith("slurm_")))


def job_of_title(command_line: str) -> str | None:
    """The job a slurmstepd's command line names (`slurmstepd: [4711.0]`), or None."""
    title = _STEPD_TITLE.search(command_line)
    return title.group(1) if title else None


JOBS = JobSide(name=NAME, title="Slurm", daemons=("slurmstepd",), job_of_cgroup=job_of_cgroup,
               job_of_title=job_of_title, hint="drain the node in Slurm first (--slurm waits for its jobs)")
