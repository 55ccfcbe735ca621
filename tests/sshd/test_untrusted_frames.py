"""A node's other users cannot steer fleet through what their processes are called (marker `sshd`).

On a real OpenSSH sshd and a simulated node, processes of the unprivileged user `nobody` (setuid by
subprocess, holding a real device file opened before the switch, as a GPU process holds /dev/nvidia*) carry
hostile identities: an executable at a path with newlines, a guessed batch tag and forged frames and records
(exe, lineage, cgroup), bytes that are not UTF-8; a comm that forges a lineage record for another process;
a command line with newlines and forged ps rows. A Slurm job's process (below a `slurmstepd`) holds a device
too. fleet must judge each one right: the job's process kept (never made unprotected by a forged record), the
hostile one killed (its path not UTF-8 is still itself: it is signalled, and only it). And the tag of a batch
is nowhere another user can read it: `nobody` listing every /proc/PID/cmdline while the batch runs never sees it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.sshd_nodes import MakeHost
from support.sshd_nodes import make_host as make_host  # the fixture: nodes stopped after the test

from fleet.engine.graph import run_hosts
from fleet.engine.options import RunOptions
from fleet.engine.walk import Mode
from fleet.inventory.host import Host
from fleet.model.report import HostReport
from fleet.runlog.folder import RunLogs
from fleet.sim.node import NodeSpec, SimNode
from fleet.transport import batch
from fleet.transport.ssh import open_ssh

NOBODY = 65534
START_TIMEOUT_S = 30.0


@dataclass
class Started:
    """Processes a test started (killed and reaped by pid after it) and the world-readable folder of their
    executables (removed after it)."""

    folder: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)  # process groups of their own, children included (by pgid)

    def stop(self) -> None:
        for group in self.groups:
            with suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture
def started() -> Iterator[Started]:
    folder = Path(tempfile.mkdtemp(prefix="fleet-hostile-", dir="/tmp"))
    folder.chmod(0o755)  # `nobody` runs what lies here
    done = Started(folder)
    try:
        yield done
    finally:
        done.stop()


@pytest.fixture
def reached(make_host: MakeHost) -> tuple[SimNode, Host]:
    """The node, started, and the Host that reaches it through the real sshd (support.sshd_nodes)."""
    node, host = make_host(NodeSpec(name="gpu-u01", units=(), linger_s=0.0))
    return node, dataclasses.replace(host, settle_timeout=10)


@pytest.fixture
def node(reached: tuple[SimNode, Host]) -> SimNode:
    return reached[0]


@pytest.fixture
def host(reached: tuple[SimNode, Host]) -> Host:
    return reached[1]


def wait_for(what: str, check: object) -> None:
    """Wait until `check()` is true (a condition, bounded only so that a broken setup ends)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not ready after {START_TIMEOUT_S} s: {what}")
        time.sleep(0.02)


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def exe_of(pid: int) -> bytes:
    return os.readlink(f"/proc/{pid}/exe".encode())


def job_process(started: Started, device: Path) -> tuple[int, int]:
    """(slurmstepd's pid, its child's): a root `slurmstepd` (a copy of sh: the name is what fleet reads)
    whose child `sleep` holds the device. The job's process is the child."""
    stepd = started.folder / "slurmstepd"
    shutil.copy("/bin/sh", stepd)
    with device.open("rb") as held:
        proc = subprocess.Popen([str(stepd), "-c", "sleep 1000 & wait"], pass_fds=[held.fileno()],
                                start_new_session=True)  # its sleep ends with it, by the group's recorded pid
    started.procs.append(proc)
    started.groups.append(proc.pid)
    wait_for("slurmstepd's child", lambda: children(proc.pid))
    (child,) = children(proc.pid)
    wait_for("the child runs sleep", lambda: exe_of(child).endswith(b"/sleep"))
    return proc.pid, child


def hostile_process(started: Started, device: Path, victim: int, *, forged: bool) -> subprocess.Popen[bytes]:
    """`nobody`'s sleep at a hostile path, holding the device. Its folder's name holds bytes not UTF-8 and,
    `forged`, newlines, a guessed tag with forged frames, forged exe, ps and cgroup records naming the victim;
    its basename (so its comm, the first 15 bytes) forges the victim's lineage record (`VICTIM 0 5 x`: no
    parent, so no slurmstepd above it); its argv forges ps rows."""
    guessed = batch.new_tag().encode()
    folder = (b"a\n" + guessed + b" 3 0\n" + guessed + b" 4\n" + b'"/proc/%d/exe" -> "/usr/sbin/sshd"\n' % victim
              + b"/proc/%d\t/usr/sbin/sshd\n" % victim + b"/proc/%d/cgroup:0::/system.slice/sshd.service\n" % victim
              + b"\xfe\xff") if forged else b"caf\xe9"
    os.makedirs(os.path.join(bytes(started.folder), folder), 0o755)  # its slashes: folders in folders
    name = (b"\n%d\t0\t5\tx" % victim + b"\xff")[:15]
    path = os.path.join(bytes(started.folder), folder, name + b"\xc3(")
    shutil.copy(b"/bin/sleep", path)
    argv = [b"sleep\n%d 1 root sshd\n%d\t0\t5\tsshd" % (victim, victim), b"1000"]
    with device.open("rb") as held:
        proc = subprocess.Popen(argv, executable=path, pass_fds=[held.fileno()], user=NOBODY, group=NOBODY,
                                extra_groups=[], cwd="/")
    started.procs.append(proc)
    wait_for("nobody's process runs", lambda: exe_of(proc.pid) == path)
    return proc


RUNS = iter(range(1000))


async def run(host: Host, tmp_path: Path, mode: Mode) -> HostReport:
    logs = RunLogs(tmp_path / "logs", f"untrusted-{mode}-{next(RUNS)}")
    logs.create()
    try:
        report, _ = await run_hosts([host], RunOptions(mode=mode), logs)
    finally:
        logs.close()
    return report.hosts[host.name]


@pytest.mark.parametrize("forged", [True, False], ids=["forged-path", "latin1-path"])
async def test_a_hostile_process_is_judged_and_killed_and_the_job_it_forges_for_is_kept(
        host: Host, node: SimNode, started: Started, tmp_path: Path, forged: bool) -> None:
    device = Path(node.devices_glob.removesuffix("*") + "0")
    stepd, job = job_process(started, device)
    hostile = hostile_process(started, device, job, forged=forged)

    plan = await run(host, tmp_path, Mode.PLAN)
    assert plan.plan is not None, plan.error
    kept = {p.pid: p.kept_because for p in plan.plan.kept}
    assert kept.get(job) == f"a Slurm job's process (slurmstepd pid {stepd})", plan.plan
    assert stepd in kept and hostile.pid not in kept
    assert [(p.pid, p.user) for p in plan.plan.would_kill] == [(hostile.pid, "nobody")]

    reset = await run(host, tmp_path, Mode.RESET)
    assert [(k.pid, k.user) for k in reset.killed] == [(hostile.pid, "nobody")], reset.error
    assert hostile.wait(timeout=30) is not None
    assert [p.poll() for p in started.procs if p is not hostile] == [None]  # slurmstepd, and its child:
    assert children(stepd) == [job]


async def test_no_other_user_reads_a_batch_tag_while_the_batch_runs(host: Host) -> None:
    """A section of a real batch reads, as `nobody`, the command line of every process that names
    `fleet-batch`, the batch's own shell among them: the batch's program is there, its tag (on its stdin) is
    not."""
    tag = batch.new_tag()
    look = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sh", "-c",
            "grep -a -l -s fleet-batch /proc/[0-9]*/cmdline | while read -r f; do tr '\\000' ' ' < \"$f\"; echo; done"]
    async with await open_ssh(host) as ssh:
        result = await ssh.run(batch.batch_argv([(20.0, look)]), timeout=30.0, stdin=batch.batch_input(tag))
    (section,) = batch.sections(tag, 1, result.stdout, result.stderr)
    assert section is not None and section.exit_status == 0, result
    assert "IFS= read -r tag" in section.stdout  # batch.sh's own command line, read by nobody
    assert tag not in section.stdout
