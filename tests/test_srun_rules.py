"""`--via srun`'s rules without Slurm: the step's argv and environment, GPU counts from Slurm's records, which
nodes the step may have touched, and how fleet tells a run that is over from one in flight."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from fleet.report.logs import RUNNING_LOCK, SUMMARY, RunLiveness, RunLogs, run_liveness
from fleet.report.models import HostReport, HostStatus, StepName, StepResult, StepStatus
from fleet.slurm.frames import frames
from fleet.slurm.records import SlurmNode, gpu_count, parse_nodes
from fleet.slurm.srun import _Step, by_gpus, srun_argv, srun_env

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


def test_the_step_takes_whole_nodes_and_every_gpu_when_slurm_gives_gpus_out() -> None:
    argv = srun_argv("fleet-r", ["sim1", "sim2"], 5, gpus=8)
    assert "--exclusive" in argv and "--gres=gpu:8" in argv
    assert not [a for a in srun_argv("fleet-r", ["sim1"], 5) if a.startswith("--gres")]


@pytest.mark.parametrize(("tres", "gres", "count"), [
    ("cpu=1,mem=1M,billing=1", "gpu:8", 8),
    ("cpu=64,mem=1T,billing=64,gres/gpu=8", "gpu:h100:8(S:0-1)", 8),
    (None, "gpu:h100:4(S:0-1),gpu:a100:4,nic:1", 8),
    (None, "gpu:h100:8(S:0,1)", 8),
    ("cpu=1", "(null)", 0),
    (None, "nic:2", 0),
])
def test_gpu_count_from_cfgtres_else_gres(tres: str | None, gres: str | None, count: int) -> None:
    assert gpu_count(tres, gres) == count


def test_the_capture_without_gres_has_no_gpus() -> None:
    assert {n.gpus for n in parse_nodes((FIXTURES / "show_node.txt").read_text()).values()} == {0}


def test_one_step_per_gpu_count() -> None:
    seen = {"a": SlurmNode("a", "IDLE", gpus=8), "b": SlurmNode("b", "IDLE", gpus=4), "c": SlurmNode("c", "IDLE",
                                                                                                    gpus=8)}
    assert by_gpus(["a", "b", "c", "d"], seen) == {8: ["a", "c"], 4: ["b"], 0: ["d"]}


def test_srun_runs_without_slurms_input_variables_but_keeps_slurm_conf() -> None:
    env = srun_env({"PATH": "/usr/bin", "SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_LABELIO": "1",
                    "SLURM_JOB_ID": "4711", "SLURM_JOBID": "4711", "SLURM_UNBUFFEREDIO": "1", "SRUN_CPUS_PER_TASK": "2",
                    "SALLOC_PARTITION": "x", "SBATCH_RESERVATION": "y", "SLURMD_NODENAME": "n"})
    assert env == {"PATH": "/usr/bin", "SLURM_CONF": "/etc/slurm/slurm.conf", "SLURMD_NODENAME": "n"}


def _ran(*statuses: StepStatus) -> HostReport:
    return HostReport("h", HostStatus.FAILED, steps=tuple(StepResult(n, s) for n, s in zip(StepName, statuses,
                                                                                              strict=False)))


def test_only_a_node_that_said_so_is_untouched() -> None:
    step = _Step()
    step.reports["refused"] = _ran(*[StepStatus.SKIPPED] * 4)  # a version refusal: no step ran
    step.reports["worked"] = _ran(StepStatus.OK)
    line = next(frames("partial", 1, {"log": {"event": "x" * 2000}}))
    step.named.add(line.split()[1])
    judge = step
    assert not judge.touched("refused") and judge.touched("worked") and judge.touched("partial")
    assert not judge.touched("silent")  # no frame, and nothing unreadable: its task never started
    step.noise.append("0: @fleet silent 1 1 1 {...}")
    assert judge.touched("silent")  # unreadable output could be its


def test_run_liveness_from_the_log_folder(tmp_path: Path) -> None:
    assert run_liveness(tmp_path, "20261201T000000Z-000000") is RunLiveness.UNKNOWN
    logs = RunLogs(tmp_path, "20261201T000000Z-000001")
    logs.create()
    assert run_liveness(tmp_path, logs.run_id) is RunLiveness.RUNNING
    logs.close()
    assert run_liveness(tmp_path, logs.run_id) is RunLiveness.OVER  # killed before its summary: the lock is free
    (tmp_path / logs.run_id / SUMMARY).write_text("{}")
    assert run_liveness(tmp_path, logs.run_id) is RunLiveness.OVER
    bare = tmp_path / "20261201T000000Z-000002"
    bare.mkdir()
    assert run_liveness(tmp_path, bare.name) is RunLiveness.UNKNOWN  # an older fleet's folder: no lock to ask
    fd = os.open(bare / RUNNING_LOCK, os.O_WRONLY | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert run_liveness(tmp_path, bare.name) is RunLiveness.RUNNING
    finally:
        os.close(fd)


@pytest.mark.parametrize("fault", ["unreadable", "refused"])
async def test_the_reservation_stays_when_a_failed_node_could_not_be_drained(tmp_path: Path, fault: str) -> None:
    """The cleanup over a scripted Slurm: Slurm unreadable, or the drain refused, for a node the step failed: the
    reservation is not removed (it ends at its Duration), so the node never goes back in service undrained."""
    from scripted_slurm import ScriptedSlurm

    from fleet.graph import RunOptions, SchedulerOptions
    from fleet.inventory.host import Host
    from fleet.report.models import Reason, SchedulerRecord
    from fleet.reset.walk import HostRun
    from fleet.slurm.srun import SrunRun

    slurm = ScriptedSlurm({"sim1": "IDLE"})
    run = HostRun(Host(name="sim1", address="127.0.0.1"), scheduler=SchedulerRecord("sim1", "IDLE"))
    logs = RunLogs(tmp_path, "20261203T070000Z-abc123")
    logs.create()
    srun = SrunRun(slurm.client(), [run], RunOptions(scheduler=SchedulerOptions(fan_out=True)), logs)
    srun.reserved, srun.stepped = True, ["sim1"]
    srun.step.named.add("sim1")
    run.finish(HostStatus.FAILED, "gpu 0 holds 4096 MiB", Reason.MEMORY_HELD)
    slurm.unreadable, slurm.refuse = (5, 0) if fault == "unreadable" else (0, 1)
    await srun._cleanup()
    assert slurm.deleted == [] and srun.reserved
    assert run.scheduler is not None and "reservation fleet-20261203T070000Z-abc123 kept" in (run.scheduler.error or "")
    slurm.unreadable = slurm.refuse = 0
    srun.step = _Step()  # nothing failed: the same cleanup removes it
    run.finish(HostStatus.CLEAN)
    await srun._cleanup()
    logs.close()
    assert slurm.deleted == ["fleet-20261203T070000Z-abc123"]
