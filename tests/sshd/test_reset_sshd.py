"""The same reset through a stock OpenSSH sshd (integration suite, marker `sshd`).

The simulated node's tools are reached through sshd's own session setup:
authorized_keys `environment="PATH=..."` puts the node's bin/ first on PATH.
"""

from __future__ import annotations

import getpass
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.keys import ClientKey
from support.sshd import Sshd

from fleet.engine.graph import run_hosts
from fleet.engine.options import RunOptions
from fleet.engine.run_folder import RunLogs
from fleet.engine.walk import Mode
from fleet.inventory.host import Host
from fleet.model.report import HostReport, HostStatus, StepName
from fleet.sim.node import NodeSpec, SimNode, UnitSpec, WorkerSpec

ALL = (0, 1, 2, 3, 4, 5, 6, 7)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimNode]:
    spec = NodeSpec(name="gpu-s01", units=(UnitSpec("sglang.service", gpus=ALL, mib=30000, process_name="sglang"),),
                    linger_s=1.0)
    sim = SimNode(tmp_path / "node", spec)
    try:
        sim.setup()
        sim.start()
        yield sim
    finally:
        sim.stop()


@pytest.fixture
def host(sshd: Sshd, client_key: ClientKey, node: SimNode) -> Host:
    env = node.env()
    sshd.authorize(client_key.public_line, environment={"PATH": env["PATH"], "PYTHONPATH": env["PYTHONPATH"]})
    return Host(
        name="gpu-s01", address="127.0.0.1", port=sshd.port, user=getpass.getuser(),
        identity_file=str(client_key.path), known_hosts=str(sshd.known_hosts), gpus=8,
        services=("sglang.service",), devices=(node.devices_glob,), nvidia_smi=node.nvidia_smi_path,
        drain_timeout=5, kill_grace=2, settle_timeout=15, connect_timeout=5, lock_file=node.lock_file,
    )


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
