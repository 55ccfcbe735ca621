"""`--via srun`'s rules without Slurm: the step's argv and environment, GPU counts from Slurm's records, which
nodes the step may have touched, and how fleet tells a run that is over from one in flight."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest
from support.paths import FIXTURES

from fleet.model.report import HostReport, HostStatus, StepName, StepResult, StepStatus
from fleet.runlog.folder import RUNNING_LOCK, SUMMARY, RunLiveness, RunLogs, run_liveness
from fleet.slurm.policy import Release, after_step, drains
from fleet.slurm.records import SlurmNode, gpu_count, parse_nodes
from fleet.slurm.srun import _Step, by_gpus, srun_argv, srun_env

FIXTURES = FIXTURES / "slurm"


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
    seen = {"a": SlurmNode(name="a", state="IDLE", gpus=8), "b": SlurmNode(name="b", state="IDLE", gpus=4),
            "c": SlurmNode(name="c", state="IDLE", gpus=8)}
    assert by_gpus(["a", "b", "c", "d"], seen) == {8: ["a", "c"], 4: ["b"], 0: ["d"]}


def test_srun_runs_without_slurms_input_variables_but_keeps_slurm_conf() -> None:
    env = srun_env({"PATH": "/usr/bin", "SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_LABELIO": "1",
                    "SLURM_JOB_ID": "4711", "SLURM_JOBID": "4711", "SLURM_UNBUFFEREDIO": "1", "SRUN_CPUS_PER_TASK": "2",
                    "SALLOC_PARTITION": "x", "SBATCH_RESERVATION": "y", "SLURMD_NODENAME": "n"})
    assert env == {"PATH": "/usr/bin", "SLURM_CONF": "/etc/slurm/slurm.conf", "SLURMD_NODENAME": "n"}


def _ran(*statuses: StepStatus) -> HostReport:
    return HostReport(name="h", status=HostStatus.FAILED,
                      steps=tuple(StepResult(name=n, status=s) for n, s in zip(StepName, statuses, strict=False)))


def test_only_a_node_that_said_so_is_untouched() -> None:
    """A node whose report says no step ran is untouched; any other, a node that sent nothing or half a frame
    included, may have been reset (srun killed before its first frame, its task's output lost)."""
    step = _Step()
    step.reports["refused"] = _ran(*[StepStatus.SKIPPED] * 4)  # a version refusal: no step ran
    step.reports["worked"] = _ran(StepStatus.OK)
    assert not step.touched("refused") and step.touched("worked")
    assert step.touched("partial") and step.touched("silent")


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


RUN = "20261203T070000Z-abc123"
OWN_FAILED = f"fleet: run {RUN}: gpu 0 holds 4096 MiB"


@pytest.mark.parametrize("state", ["IDLE+MAINT+RESERVED", "DOWN+MAINT+RESERVED+NOT_RESPONDING", "DOWN*",
                                   "IDLE*+MAINT+RESERVED", "IDLE+FAIL", "DOWN", "MIXED+COMPLETING"])
def test_a_failed_node_is_drained_with_fleets_reason_whatever_its_base_state(state: str) -> None:
    """A down node returns to service by itself (ReturnToService) once the reservation is gone; a drained one
    never does."""
    action = after_step(SlurmNode(name="sim1", state=state), RUN, HostStatus.FAILED, "gpu 0 holds 4096 MiB", True)
    assert action.what is Release.KEEP_DRAINED and action.reason == OWN_FAILED


@pytest.mark.parametrize(("node", "status", "touched", "why"), [
    (SlurmNode(name="sim1", state="IDLE+DRAIN", reason=OWN_FAILED), HostStatus.FAILED, True, "drained for this run"),
    (SlurmNode(name="sim1", state="DOWN+DRAIN", reason=OWN_FAILED), HostStatus.FAILED, True, "drained for this run"),
    (SlurmNode(name="sim1", state="IDLE+DRAIN", reason="bad DIMM"), HostStatus.FAILED, True, "drained by someone else"),
    (None, HostStatus.FAILED, True, "Slurm no longer shows the node"),
    (SlurmNode(name="sim1", state="DOWN"), HostStatus.CLEAN, True, "clean"),
    (SlurmNode(name="sim1", state="DOWN"), HostStatus.FAILED, False, "never touched"),
])
def test_nothing_is_sent_for_a_node_already_drained_gone_clean_or_untouched(
    node: SlurmNode | None, status: HostStatus, touched: bool, why: str
) -> None:
    action = after_step(node, RUN, status, "gpu 0 holds 4096 MiB", touched)
    assert action.what is Release.LEAVE and why in action.why


def test_nodes_failed_the_same_way_share_one_drain() -> None:
    actions = {n: after_step(SlurmNode(name=n, state="IDLE"), RUN, HostStatus.FAILED, e, True)
               for n, e in (("a", "x"), ("b", "y"), ("c", "x"))}
    actions["d"] = after_step(SlurmNode(name="d", state="IDLE"), RUN, HostStatus.CLEAN, None, True)
    assert drains(actions) == {f"fleet: run {RUN}: x": ["a", "c"], f"fleet: run {RUN}: y": ["b"]}
