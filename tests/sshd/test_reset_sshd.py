"""The same reset through a stock OpenSSH sshd (integration suite, marker `sshd`).

The simulated node's tools are reached through sshd's own session setup:
authorized_keys `environment="PATH=..."` puts the node's bin/ first on PATH.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.sshd_nodes import MakeHost
from support.sshd_nodes import make_host as make_host  # the fixture: nodes stopped after the test

from fleet.engine.graph import run_hosts
from fleet.engine.options import RunOptions
from fleet.engine.walk import Mode
from fleet.inventory.host import Host
from fleet.model.report import HostReport, HostStatus, StepName
from fleet.runlog.folder import RunLogs
from fleet.sim.node import NodeSpec, SimNode, UnitSpec, WorkerSpec

ALL = (0, 1, 2, 3, 4, 5, 6, 7)


@pytest.fixture
def reached(make_host: MakeHost) -> tuple[SimNode, Host]:
    """The node, started, and the Host that reaches it through the real sshd (support.sshd_nodes)."""
    unit = UnitSpec(name="sglang.service", gpus=ALL, mib=30000, process_name="sglang")
    return make_host(NodeSpec(name="gpu-s01", units=(unit,), linger_s=1.0))


@pytest.fixture
def node(reached: tuple[SimNode, Host]) -> SimNode:
    return reached[0]


@pytest.fixture
def host(reached: tuple[SimNode, Host]) -> Host:
    return reached[1]


RUNS = iter(range(1000))


async def _run(host: Host, tmp_path: Path, command: str) -> HostReport:
    logs = RunLogs(tmp_path / "logs", f"sshd-{command}-{next(RUNS)}")
    logs.create()
    try:
        report, _ = await run_hosts([host], RunOptions(mode=Mode(command)), logs)
    finally:
        logs.close()
    return report.hosts[host.name]


async def test_reset_through_openssh_leaves_the_node_clean(host: Host, node: SimNode, tmp_path: Path) -> None:
    stray = node.spawn_worker(WorkerSpec(gpus=(1,), mib=1523, name="python3"))
    before = await _run(host, tmp_path, "check")
    assert before.status is HostStatus.FAILED

    result = await _run(host, tmp_path, "reset")

    assert result.status is HostStatus.CLEAN, result.error
    assert [s.name for s in result.steps] == list(StepName)
    assert stray in {k.pid for k in result.killed}
    assert not node.alive(stray)
    assert node.unit_state("sglang.service") == "inactive"
    assert node.gpu_memory() == [0] * 8
    after = await _run(host, tmp_path, "check")
    assert after.status is HostStatus.CLEAN
