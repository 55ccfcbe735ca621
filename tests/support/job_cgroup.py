"""A real cgroup named as Slurm names a job's, for tests: created under a temporary folder of this machine's
cgroup v2 hierarchy (`<tmp>/system.slice/slurmstepd.scope/job_4711/step_extern`) or of its v1 freezer
hierarchy (`<tmp>/slurm/uid_0/job_4711/step_extern`), the layouts of Slurm's cgroup/v2 and cgroup/v1 plugins
(fleet/node/probes/jobs.py). A test moves processes it started into it (`move`); on exit, each of them still
alive is SIGKILLed by its recorded pid and the folders are removed. Where no such hierarchy is mounted or it
cannot be written (not root, a read-only cgroup fs in a container), the test is skipped, saying why.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

JOB = "4711"
LAYOUT = {"v2": "system.slice/slurmstepd.scope/job_{job}/step_extern", "v1": "slurm/uid_0/job_{job}/step_extern"}


def mount_of(version: str) -> Path | None:
    """Where the v2 hierarchy, or v1's freezer hierarchy, is mounted here (None: not mounted)."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, where, fstype, options = line.split()[:4]
        if version == "v2" and fstype == "cgroup2":
            return Path(where)
        if version == "v1" and fstype == "cgroup" and "freezer" in options.split(","):
            return Path(where)
    return None


@dataclass
class JobCgroupDir:
    """The job's step cgroup, its folders (deepest first, for removal) and the processes moved into it."""

    leaf: Path
    folders: list[Path]
    moved: list[int] = field(default_factory=list)

    def move(self, pid: int) -> str:
        """Put pid in the job's cgroup; the path /proc/PID/cgroup now gives for it."""
        (self.leaf / "cgroup.procs").write_text(f"{pid}\n")
        self.moved.append(pid)
        return self.path_of(pid)

    def path_of(self, pid: int) -> str:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            if line.endswith(f"/job_{JOB}/{self.leaf.name}"):
                return line.split(":", 2)[2]
        raise AssertionError(f"pid {pid} is not in {self.leaf}")

    def members(self) -> list[int]:
        with suppress(OSError):
            return [int(p) for p in (self.leaf / "cgroup.procs").read_text().split()]
        return []


def _end(cgroup: JobCgroupDir) -> None:
    for pid in cgroup.moved:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while set(cgroup.members()) & set(cgroup.moved) and time.monotonic() < deadline:
        time.sleep(0.05)
    for folder in cgroup.folders:
        while True:
            try:
                folder.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


@contextmanager
def job_cgroup(version: str) -> Iterator[JobCgroupDir]:
    """A cgroup named as Slurm names job 4711's extern step, under a temporary folder; removed on exit."""
    mount = mount_of(version)
    if mount is None:
        pytest.skip(f"no cgroup {version} hierarchy is mounted here")
    top = mount / f"fleet-test-{os.getpid()}-{secrets.token_hex(3)}"
    relative = Path(LAYOUT[version].format(job=JOB))
    folders = [top.joinpath(*relative.parts[:i]) for i in range(len(relative.parts), 0, -1)] + [top]
    try:
        folders[0].mkdir(parents=True)
    except OSError as exc:
        for folder in folders:
            with suppress(OSError):
                folder.rmdir()
        pytest.skip(f"cannot create a cgroup under {mount} ({exc.strerror}): needs root and a writable cgroup fs")
    cgroup = JobCgroupDir(folders[0], folders)
    try:
        yield cgroup
    finally:
        _end(cgroup)
