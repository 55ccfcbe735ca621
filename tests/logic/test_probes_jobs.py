"""The Slurm job a process's cgroup names: the pure parser over Slurm's own cgroup layouts, and a real read.

The paths are those Slurm's plugins create (fleet/slurm/jobs.py names the source lines):
cgroup/v2 `src/plugins/cgroup/v2/cgroup_v2.c` (`_set_int_cg_ns`: `<root>/system.slice/slurmstepd.scope`, or
`<node>_slurmstepd.scope` with several slurmd; below it `job_<id>/step_<step>/user/task_<n>`, the step daemons
in `step_<step>/slurm`, pids added to a step, as pam_slurm_adopt does, in `user/task_special`: the plugin's
README), cgroup/v1 (`"%s/uid_%u"` under CgroupPrepend `/slurm`, then `"%s/job_%u"`, `step_<id>`,
`step_batch`, `step_extern`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from support.job_cgroup import JOB, job_cgroup

from fleet.node.probes import jobs
from fleet.node.probes.jobs import JobCgroup, parse_job_cgroups
from fleet.node.probes.parse import ProbeParseError
from fleet.node.probes.units import cgroup_argv
from fleet.slurm.jobs import job_of_cgroup


@pytest.mark.parametrize(
    ("path", "job"),
    [
        ("/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0", "4711"),  # a task of step 0 (v2)
        ("/system.slice/slurmstepd.scope/job_4711/step_batch/user/task_0", "4711"),  # the batch script
        ("/system.slice/slurmstepd.scope/job_4711/step_extern/user/task_special", "4711"),  # pam_slurm_adopt's
        ("/system.slice/slurmstepd.scope/job_4711/step_0/slurm", "4711"),  # the step's own slurmstepd
        ("/system.slice/slurmstepd.scope/job_4711", "4711"),
        ("/system.slice/gpu-b07_slurmstepd.scope/job_12/step_interactive/user/task_0", "12"),  # several slurmd
        ("/docker.slice/docker-1f2e.scope/system.slice/slurmstepd.scope/job_9/step_0/user/task_3", "9"),  # a container
        ("/slurm/uid_1000/job_4711/step_0/task_0", "4711"),  # v1, a task
        ("/slurm/uid_1000/job_4711/step_extern", "4711"),  # v1, pam_slurm_adopt's
        ("/slurm/uid_0/job_4294967294/step_batch", "4294967294"),
        ("/slurm_gpu-b07/uid_1000/job_5/step_0/task_1", "5"),  # v1, several slurmd
        ("/system.slice/slurmstepd.scope/system", None),  # the waiting area of step daemons not started yet
        ("/system.slice/slurmd.service", None),
        ("/system.slice/trainer.service/job_4711", None),  # no slurmstepd scope above it
        ("/slurm/job_4711/step_0", None),  # v1 without its uid level
        ("/uid_1000/job_4711/step_0", None),
        ("/system.slice/slurmstepd.scope/job_47x1/step_0", None),
        ("/system.slice/slurmstepd.scope/job_/step_0", None),
        ("/system.slice/notslurmstepd.scope/job_4711", None),
        ("/user.slice/user-1000.slice/user@1000.service/app.slice/slurmstepd.scope/job_4711/step_0", None),
        ("/user.slice/user-1000.slice/session-3.scope", None),
        ("/", None),
        ("", None),
    ],
)
def test_job_of_cgroup(path: str, job: str | None) -> None:
    assert job_of_cgroup(path) == job


# /proc/PID/cgroup as grep -H prints it: a v2-only node (one `0::` line), a hybrid v1 node (Slurm's cgroup/v1
# in each controller it uses; name=systemd and the empty v2 line name no job), and processes in no job.
LISTING = """\
/proc/4242/cgroup:0::/system.slice/slurmstepd.scope/job_4711/step_extern/user/task_special
/proc/4243/cgroup:12:freezer:/slurm/uid_1000/job_77/step_0/task_0
/proc/4243/cgroup:11:memory:/slurm/uid_1000/job_77/step_0/task_0
/proc/4243/cgroup:4:cpu,cpuacct:/
/proc/4243/cgroup:1:name=systemd:/system.slice/slurmd.service
/proc/4243/cgroup:0::/
/proc/4244/cgroup:0::/user.slice/user-1000.slice/session-3.scope
/proc/4245/cgroup:0::/system.slice/sglang.service
"""


def test_parse_job_cgroups_golden() -> None:
    assert parse_job_cgroups(LISTING) == {
        4242: JobCgroup("4711", "/system.slice/slurmstepd.scope/job_4711/step_extern/user/task_special", "slurm"),
        4243: JobCgroup("77", "/slurm/uid_1000/job_77/step_0/task_0", "slurm"),
    }
    assert parse_job_cgroups("") == {}


def test_parse_job_cgroups_malformed() -> None:
    with pytest.raises(ProbeParseError, match="line 2: expected /proc/PID/cgroup:ID:CONTROLLERS:PATH"):
        parse_job_cgroups("/proc/1/cgroup:0::/\nnot a cgroup line\n")


def test_the_probe_reads_cgroups_as_root_and_grep_s_answers_are_answers() -> None:
    """grep exits 2 when a pid vanished mid-read: what it printed is still the answer. A grep that could not run
    (127) is no answer: never "in no job"."""
    probe = jobs.job_cgroups([4242, 77])
    assert probe.argv == tuple(cgroup_argv([4242, 77]))
    assert probe.needs_root and probe.ok_exits == frozenset({0, 1, 2})


def _read(pids: list[int]) -> dict[int, JobCgroup]:
    done = subprocess.run(cgroup_argv(pids), capture_output=True, text=True, check=False)
    assert done.returncode in (0, 2), done.stderr
    return parse_job_cgroups(done.stdout)


def test_a_process_here_is_in_no_job() -> None:
    assert _read([os.getpid(), 1]) == {}


@pytest.fixture
def sleeper() -> Iterator[int]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child.pid
    child.kill()
    child.wait()


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_a_real_process_in_a_jobs_cgroup_is_read_as_the_jobs(version: str, sleeper: int) -> None:
    """A real cgroup laid out as Slurm lays out a job's (under a temporary folder of this machine's hierarchy),
    a real process moved into it: the real grep over /proc/PID/cgroup names job 4711."""
    with job_cgroup(version) as cgroup:
        path = cgroup.move(sleeper)
        assert _read([sleeper, os.getpid()]) == {sleeper: JobCgroup(JOB, path, "slurm")}
