"""A leaked context and `--gpu-reset` through a stock OpenSSH sshd (integration suite, marker `sshd`).

Memory no process holds says so (`memory_leaked`) and whether `--gpu-reset` would help; `--gpu-reset` picks
the GPU by nvidia-smi's index on a node whose device files are numbered otherwise (their minor numbers, as
`-q` shows them), names who holds a GPU it may not reset in the host's error line, and gives a reset slower
than `command_timeout` its own bound. Every simulated node is stopped (its processes ended by pid).
"""

from __future__ import annotations

import getpass
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.keys import ClientKey
from support.sim_fleet import last_log
from support.sshd import Sshd

from fleet.engine.graph import run_hosts
from fleet.engine.options import RunOptions
from fleet.engine.walk import Mode
from fleet.inventory.host import Host
from fleet.model.report import HostReport, HostStatus, Reason, StepName, StepStatus
from fleet.runlog.folder import RunLogs
from fleet.sim.node import NodeSpec, SimNode, UnitSpec, WorkerSpec

ALL = (0, 1, 2, 3, 4, 5, 6, 7)
# As on a DGX: device files in the driver's probe order. GPU 3's is /dev/nvidia1, GPU 1's /dev/nvidia3.
MINORS = (2, 3, 0, 1, 6, 7, 4, 5)
MPS = "nvidia-cuda-mps-server"


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[SimNode]]:
    started: list[SimNode] = []
    yield started
    for sim in started:
        sim.stop()


def busy(nodes: list[SimNode], tmp_path: Path, **spec: Any) -> SimNode:
    """A node running sglang on every GPU, a leaked context of 2048 MiB on GPU 3, and what `spec` adds."""
    sim = SimNode(tmp_path / "node", NodeSpec(name="gpu-l01", linger_s=0.2, leaked_mib=((3, 2048),), units=(
        UnitSpec(name="sglang.service", gpus=ALL, mib=30000, process_name="sglang"),), **spec))
    nodes.append(sim)
    sim.setup()
    sim.start()
    return sim


def host_of(sim: SimNode, sshd: Sshd, client_key: ClientKey, **variables: Any) -> Host:
    env = sim.env()
    sshd.authorize(client_key.public_line, environment={"PATH": env["PATH"], "PYTHONPATH": env["PYTHONPATH"]})
    settings: dict[str, Any] = {"drain_timeout": 5, "kill_grace": 2, "settle_timeout": 2, "connect_timeout": 5,
                                "health_ignore": ("xid",), **variables}  # the GPUs' memory is judged here, not Xids
    return Host(name="gpu-l01", address="127.0.0.1", port=sshd.port, user=getpass.getuser(),
                identity_file=str(client_key.path), known_hosts=str(sshd.known_hosts), gpus=8,
                services=("sglang.service",), devices=(sim.devices_glob,), nvidia_smi=sim.nvidia_smi_path,
                lock_file=sim.lock_file, **settings)


async def reset(host: Host, tmp_path: Path, gpu_reset: bool) -> HostReport:
    logs = RunLogs(tmp_path / "logs", f"gpu-reset-{gpu_reset}")
    logs.create()
    try:
        report, _ = await run_hosts([host], RunOptions(mode=Mode.RESET, gpu_reset=gpu_reset), logs)
    finally:
        logs.close()
    return report.hosts[host.name]


def settle_step(result: HostReport) -> Any:
    return next(s for s in result.steps if s.name is StepName.SETTLE)


async def test_a_leaked_context_says_so_and_that_gpu_reset_can_reset_it(
    sshd: Sshd, client_key: ClientKey, nodes: list[SimNode], tmp_path: Path
) -> None:
    """nvidia-persistenced holds nvidiactl only: no process holds GPU 3, whose 2048 MiB stay."""
    sim = busy(nodes, tmp_path)
    result = await reset(host_of(sim, sshd, client_key), tmp_path, gpu_reset=False)
    assert (result.status, result.reason) == (HostStatus.FAILED, Reason.MEMORY_LEAKED)
    assert result.error == ("settle: gpu 3 holds 2048 MiB with no process holding it after 2 s: a leaked context;"
                            " --gpu-reset can reset it")
    assert settle_step(result).status is StepStatus.TIMEOUT
    assert sim.gpu_resets() == []
    assert sim.unit_state("sglang.service") == "inactive"


async def test_gpu_reset_takes_the_gpu_by_index_where_device_files_are_numbered_otherwise(
    sshd: Sshd, client_key: ClientKey, nodes: list[SimNode], tmp_path: Path
) -> None:
    """The MPS server holds GPU 1, whose device file is /dev/nvidia3: GPU 3 (/dev/nvidia1) is free to reset."""
    sim = busy(nodes, tmp_path, fabric="N/A", minor_numbers=MINORS, workers=(WorkerSpec(gpus=(1,), mib=0, name=MPS),))
    result = await reset(host_of(sim, sshd, client_key), tmp_path, gpu_reset=True)
    assert result.status is HostStatus.CLEAN, result.error
    assert settle_step(result).detail.startswith("reset gpu 3 with nvidia-smi -r; 8 GPUs at or under")
    assert sim.gpu_resets() == [3]
    assert sim.gpu_memory() == [0] * 8


async def test_a_refused_gpu_reset_names_its_holders_in_the_hosts_error(
    sshd: Sshd, client_key: ClientKey, nodes: list[SimNode], tmp_path: Path
) -> None:
    """The MPS server (kept) holds /dev/nvidia1, GPU 3's own device file: the reset is refused, and the host's
    error line (not only the step's detail) says who holds it."""
    sim = busy(nodes, tmp_path, fabric="N/A", minor_numbers=MINORS, workers=(WorkerSpec(gpus=(3,), mib=0, name=MPS),))
    result = await reset(host_of(sim, sshd, client_key), tmp_path, gpu_reset=True)
    assert (result.status, result.reason) == (HostStatus.FAILED, Reason.MEMORY_LEAKED)
    error = result.error or ""
    assert error.startswith("settle: gpu 3 holds 2048 MiB with only the machine's own processes holding it after 2 s:"
                            " a leaked context; gpu reset refused: pid "), error
    assert f" {MPS} (protected name " in error and error.endswith(" still hold gpu 3")
    assert sim.gpu_resets() == []


async def test_a_reset_slower_than_command_timeout_runs_within_gpu_reset_timeout(
    sshd: Sshd, client_key: ClientKey, nodes: list[SimNode], tmp_path: Path
) -> None:
    """A whole baseboard's reset (NVSwitch: all GPUs at once) taking 6 s, with command_timeout 5 s (no shorter:
    on a loaded machine a holder scan can take seconds)."""
    sim = busy(nodes, tmp_path, gpu_reset_s=6.0)
    host = host_of(sim, sshd, client_key, command_timeout=5, gpu_reset_timeout=30)
    result = await reset(host, tmp_path, gpu_reset=True)
    assert result.status is HostStatus.CLEAN, result.error
    assert settle_step(result).detail.startswith("reset all GPUs (NVSwitch baseboard) with nvidia-smi -r")
    assert sorted(sim.gpu_resets()) == list(ALL)
    resets = [e for e in last_log(tmp_path, "gpu-l01") if e["event"] == "command" and "-r" in e["argv"]]
    assert resets and {e["timeout_s"] for e in resets} == {30}  # gpu_reset_timeout, not nvidia-smi's 3 x 5 s
