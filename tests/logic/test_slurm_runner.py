"""Slurm's commands all run through one runner (`fleet.slurm.runner`): `--via srun`'s step too, so a test swaps
the runner and the step runs a program of its choosing, bounded, its streams apart, with no Slurm anywhere."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import pytest
from support.scripted_slurm import ScriptedSlurm

from fleet.engine.options import RunOptions, SchedulerOptions
from fleet.engine.walk import HostRun
from fleet.inventory.host import Host
from fleet.model.report import HostStatus, Reason, SchedulerRecord
from fleet.runlog.folder import RunLogs
from fleet.slurm.control import Slurm
from fleet.slurm.runner import LocalRunner, Stream
from fleet.slurm.srun import SrunRun, step_seconds

RUN = "20261204T130000Z-d00d00"


class SwappedRunner(LocalRunner):
    """Answers the short commands as the scripted Slurm does; starts `program` wherever srun was asked for."""

    def __init__(self, slurm: ScriptedSlurm, program: Sequence[str]) -> None:
        scripted = slurm.client().runner
        assert isinstance(scripted, LocalRunner)
        super().__init__(scripted.transport)
        self.program = program
        self.started: list[tuple[tuple[str, ...], float, Mapping[str, str]]] = []

    async def start(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str]) -> Stream:
        self.started.append((tuple(argv), timeout, env))
        return await super().start(self.program, timeout=timeout, env=env)


@pytest.fixture
async def logs(tmp_path: Path) -> AsyncIterator[RunLogs]:
    run_logs = RunLogs(tmp_path / "logs", RUN)
    run_logs.create()
    yield run_logs
    run_logs.close()


async def test_the_step_starts_through_the_runner_with_its_bound_its_environment_and_the_document(
        tmp_path: Path, logs: RunLogs, monkeypatch: pytest.MonkeyPatch) -> None:
    """The swapped runner is handed srun's argv, the step's bound and an environment without Slurm's input
    variables; what it started got the controller's document on stdin, and its stderr and exit status explain
    the node that sent no report."""
    monkeypatch.setenv("SLURM_JOB_ID", "4711")
    document = tmp_path / "document.json"
    runner = SwappedRunner(ScriptedSlurm({"sim1": "IDLE"}),
                           ["sh", "-c", f"cat > {document}; echo 'srun: error: sim1: task 0: Exited' >&2; exit 3"])
    host = Host(name="sim1", address="127.0.0.1")
    runs = [HostRun(host=host, scheduler=SchedulerRecord(node="sim1", by="slurm", state_before="IDLE"))]
    srun = SrunRun(Slurm(runner), runs, RunOptions(scheduler=SchedulerOptions(name="slurm", fan_out=True)), logs)
    await srun._run_step(["sim1"])
    [(argv, timeout, env)] = runner.started
    assert argv[0] == "srun" and f"--reservation=fleet-{RUN}" in argv and argv[-2:] == ("fleet", "node-run")
    assert timeout > step_seconds([host], RunOptions()) and "SLURM_JOB_ID" not in env
    sent = json.loads(document.read_text())
    assert sent["run_id"] == RUN and list(sent["hosts"]) == ["sim1"]
    run = srun.runs["sim1"]
    assert run.status is HostStatus.FAILED and run.reason is Reason.NO_REPORT
    assert run.error == "no report from sim1 (srun exit status 3): srun: error: sim1: task 0: Exited"
