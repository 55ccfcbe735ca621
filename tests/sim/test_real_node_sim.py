"""Real systems, not one systemd: simulated nodes that behave as real ones do where fleet used to assume.

An older systemd (no `--kill-whom=`), a process fleet keeps on purpose that holds GPU memory (the MPS
server), GPUs in MIG mode (tens of MiB used with no process), and `--canary` with `--dry-run`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
from support.sim_fleet import ALL, busy, fast_vars, fleet_cli, make_fleet, reset, step

from fleet.model.report import HostStatus, StepName
from fleet.sim.node import NodeSpec, UnitSpec, WorkerSpec

__all__ = ["make_fleet"]  # the fixture, shared with test_reset_sim


async def test_a_hung_stop_is_escalated_on_a_systemd_without_kill_whom(make_fleet: Any, tmp_path: Path) -> None:
    """systemd 249 (Ubuntu 22.04) rejects `--kill-whom=`: fleet's spelling (`--kill-who=`) must still SIGKILL."""
    unit = UnitSpec(name="sglang.service", gpus=ALL, mib=30000, ignore_sigterm=True, timeout_stop_sec=90)
    sim = await make_fleet([busy("gpu-h01", unit=unit, systemd_version=249)], fast_vars(["gpu-h01"], drain_timeout=2))
    with anyio.fail_after(40):
        report = await reset(sim, tmp_path)
    host, node = report.hosts["gpu-h01"], sim.nodes["gpu-h01"]
    assert host.status is HostStatus.CLEAN, host.error
    assert "SIGKILLed" in step(host, StepName.DRAIN).detail
    assert node.unit_state("sglang.service") in ("inactive", "failed")


def test_the_simulated_old_systemctl_rejects_kill_whom_as_systemd_249_does(tmp_path: Path) -> None:
    from fleet.sim.node import SimNode

    node = SimNode(tmp_path / "node", NodeSpec(name="old", systemd_version=249, units=(UnitSpec(name="a.service"),)))
    node.setup()
    systemctl = str(node.bin_dir / "systemctl")
    old = subprocess.run([systemctl, "kill", "--kill-whom=all", "--signal=SIGKILL", "--", "a.service"],
                         capture_output=True, text=True, env=node.env(), check=False)
    assert (old.returncode, old.stderr) == (1, "systemctl: unrecognized option '--kill-whom=all'\n")
    both = subprocess.run([systemctl, "kill", "--kill-who=all", "--signal=SIGKILL", "--", "a.service"],
                          capture_output=True, text=True, env=node.env(), check=False)
    assert both.returncode == 0, both.stderr


async def test_a_kept_mps_server_holding_memory_does_not_keep_the_node_unclean(
    make_fleet: Any, tmp_path: Path
) -> None:
    mps = WorkerSpec(gpus=(0,), mib=300, name="nvidia-cuda-mps-server")
    sim = await make_fleet([busy("gpu-m01", workers=(mps,))], fast_vars(["gpu-m01"]))
    report = await reset(sim, tmp_path)
    host, node = report.hosts["gpu-m01"], sim.nodes["gpu-m01"]
    assert host.status is HostStatus.CLEAN, host.error
    verify = step(host, StepName.VERIFY)
    assert "kept pid " in verify.detail and "nvidia-cuda-mps-server (300 MiB)" in verify.detail
    assert node.gpu_memory()[0] == 300  # it is still there, on purpose
    assert "nvidia-cuda-mps-server" in step(host, StepName.KILL).detail


async def test_mig_gpus_idle_at_55_mib_end_clean(make_fleet: Any, tmp_path: Path) -> None:
    sim = await make_fleet([busy("gpu-g01", mig_gpus=ALL)], fast_vars(["gpu-g01"]))
    report = await reset(sim, tmp_path)
    host, node = report.hosts["gpu-g01"], sim.nodes["gpu-g01"]
    assert host.status is HostStatus.CLEAN, host.error
    assert node.gpu_memory() == [55] * 8


async def test_mig_gpus_still_fail_when_a_process_holds_memory(make_fleet: Any, tmp_path: Path) -> None:
    sim = await make_fleet([busy("gpu-g02", mig_gpus=ALL)], fast_vars(["gpu-g02"]))
    report = await reset(sim, tmp_path, command="check")
    host = report.hosts["gpu-g02"]
    assert host.status is HostStatus.FAILED
    assert host.error is not None and host.error.startswith("gpu 0 holds 30055 MiB")


async def test_a_dry_run_canary_is_a_passed_canary(make_fleet: Any, tmp_path: Path) -> None:
    names = ["gpu-b01", "gpu-b02", "gpu-b03"]
    sim = await make_fleet([busy(n) for n in names], fast_vars(names))
    code, out, err = await fleet_cli("reset", "-i", str(sim.inventory_path), "-g", "sim", "-y", "--canary", "1",
                                "--dry-run", "--json", "--log-dir", str(tmp_path / "logs"))
    assert code == 0, err
    assert {h["status"] for h in json.loads(out)["hosts"].values()} == {"planned"}
    assert all(sim.nodes[n].unit_state("sglang.service") == "active" for n in names)
