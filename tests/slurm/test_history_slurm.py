"""The run history under a real Slurm: a run via srun tells the history each node as its report comes."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.slurm import StartCluster

from fleet.app.run import run_and_report
from fleet.engine.options import RunOptions, SchedulerOptions
from fleet.history import (
    History,
    Recorder,
    history_path,
)
from fleet.inventory.load import load_inventory
from fleet.inventory.targeting import select
from fleet.model.report import (
    HostReport,
)
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec


async def test_a_run_via_srun_tells_the_history_each_node_as_its_report_comes(
    tmp_path: Path, slurm_cluster: StartCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = ("sim1", "sim2")
    told: list[str] = []
    original = Recorder.host_ended

    def spy(self: Recorder, report: HostReport) -> None:
        told.append(report.name)
        original(self, report)

    monkeypatch.setattr(Recorder, "host_ended", spy)
    specs = [NodeSpec(name=n, linger_s=0.2) for n in names]
    async with SimFleet(tmp_path / "fleet", specs, host_vars={n: {"kill_grace": 2} for n in names}) as sim:
        cluster = slurm_cluster({n: sim.address(n) for n in names},
                                task_env={n: {"PATH": node.env()["PATH"]} for n, node in sim.nodes.items()})
        monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
        hosts = select(load_inventory(sim.inventory_path), groups=["sim"])
        options = RunOptions(scheduler=SchedulerOptions(name="slurm", drain_wait_s=4.0, fan_out=True))
        code, report = await run_and_report(hosts, options, as_json=False, log_dir=tmp_path / "logs")
    assert code == 0
    assert sorted(told) == list(names)  # each node as the step's report on it came in, before the run's end
    with History.open(history_path(tmp_path / "logs")) as history:
        record = history.get(report.run_id)
    assert record is not None
    assert record.run.exit_code == 0
    assert record.run.options["scheduler"] == {"drain_wait_s": 4.0, "fan_out": True, "name": "slurm"}
    assert [(h.host, h.status) for h in record.hosts] == [(n, "clean") for n in names]
    assert all(h.slurm is not None and h.slurm["state_after"] for h in record.hosts)  # the release, at the end
