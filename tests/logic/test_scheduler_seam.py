"""The scheduler seam is a plug: a fake workload manager, registered by name, runs a reset through
`run_and_report` with no Slurm anywhere. The fake (`Fake`, `PLUG`) is what a new scheduler must write."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import pytest
from support.scripted_run import make_host, node_script

from fleet.engine import schedulers
from fleet.engine.options import RunOptions, SchedulerOptions
from fleet.engine.run import run_and_report
from fleet.engine.schedulers import Ready
from fleet.engine.walk import HostRun
from fleet.inventory.host import Host
from fleet.model.report import HostReport, HostStatus, Reason, SchedulerRecord
from fleet.transport.scripted import ScriptedTransport


class Fake:
    """Cordons every node before the wave, keeps `busy` nodes out of the reset, and uncordons clean ones."""

    busy = frozenset({"gpu-02"})
    calls: ClassVar[list[str]] = []

    async def serve(self) -> None:
        return None

    async def admit(self, runs: Sequence[HostRun]) -> dict[str, SchedulerRecord]:
        self.calls.extend(f"admit {r.host.name}" for r in runs)
        return {r.host.name: SchedulerRecord(r.host.name, state_before="ready") for r in runs}

    async def ready(self, run: HostRun, log: object) -> Ready:
        record = run.scheduler
        if run.host.name in self.busy:
            return Ready(record, (HostStatus.SKIPPED, "fake: pod still running", Reason.JOBS_RUNNING))
        return Ready(record)

    async def release(self, run: HostRun, report: HostReport, log: object) -> SchedulerRecord | None:
        self.calls.append(f"release {run.host.name} {report.status}")
        after = "ready" if report.status in (HostStatus.CLEAN, HostStatus.SKIPPED) else "cordoned"
        return SchedulerRecord(run.host.name, "ready", state_after=after) if run.scheduler else None


PLUG = schedulers.Plug(lifecycle=lambda options, logs, interrupts: Fake())


async def test_a_fake_scheduler_runs_a_reset_through_the_seam(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(schedulers.REGISTRY, "fake", __name__)
    scripts = {n: ScriptedTransport(node_script()) for n in ("gpu-01", "gpu-02")}

    async def connector(host: Host) -> ScriptedTransport:
        return scripts[host.name]

    options = RunOptions(scheduler=SchedulerOptions(name="fake"))
    _, report = await run_and_report([make_host("gpu-01"), make_host("gpu-02")], options, as_json=False,
                                     log_dir=tmp_path, connector=connector)
    clean, busy = report.hosts["gpu-01"], report.hosts["gpu-02"]
    assert clean.status is HostStatus.CLEAN and clean.scheduler == SchedulerRecord("gpu-01", "ready",
                                                                                    state_after="ready")
    assert busy.status is HostStatus.SKIPPED and busy.error == "fake: pod still running" and not scripts["gpu-02"].ran
    assert sorted(Fake.calls) == ["admit gpu-01", "admit gpu-02", "release gpu-01 clean", "release gpu-02 skipped"]
    assert "fake" in schedulers.names()
