"""nvidia-smi slow or hung on a simulated node over real SSH: slow is not dead, and no read blocks the kernel log.

An 8-GPU node without persistence mode initialises every GPU again on each nvidia-smi call (seconds); the
baseline's old fixed 5 s bound failed such hosts (`cannot read the kernel log ... nvidia-smi timed out`). Every
nvidia-smi read is now bounded by nvidia-smi's bound (3 x command_timeout), and the kernel log is read before
the optional nvidia-smi reads of the baseline, so a hung nvidia-smi never keeps it from being read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from support.sim_fleet import busy, fast_vars, last_log, make_fleet, reset

from fleet.model.report import HostStatus, Reason, StepName
from fleet.node.bounds import SMI_FACTOR

__all__ = ["make_fleet"]  # the fixture, used by name


async def test_nvidia_smi_slower_than_the_old_5_s_bound_but_within_its_own_ends_clean(
        make_fleet: Any, tmp_path: Path) -> None:
    """Every call takes 5.5 s (past the old baseline bound of 5 s and past command_timeout): the host is clean,
    and its memory before the reset was read."""
    spec = busy("gpu-s01", protected_daemon=False, smi_delay_s=5.5)
    sim = await make_fleet([spec], fast_vars(["gpu-s01"], command_timeout=5))
    with anyio.fail_after(240):
        report = await reset(sim, tmp_path)
    host = report.hosts["gpu-s01"]
    assert host.status is HostStatus.CLEAN, host.error
    assert host.memory_before_mib == (30000,) * 8
    assert sim.nodes["gpu-s01"].gpu_memory() == [0] * 8
    events = last_log(tmp_path, "gpu-s01")
    assert not [e for e in events if e["event"] in ("kernel_log_unread", "memory_unread")]
    smi = [e for e in events if e["event"] == "command" and e["argv"][0].endswith("nvidia-smi")]
    assert smi and {e["timeout_s"] for e in smi} == {SMI_FACTOR * 5}


async def test_a_hung_nvidia_smi_never_keeps_the_kernel_log_from_being_read(make_fleet: Any, tmp_path: Path) -> None:
    """The baseline's memory read hangs: the kernel log was read before it (whole, its cursor kept), the host
    fails for the hang (command_timeout, naming nvidia-smi's bound), not for an unread kernel log."""
    sim = await make_fleet([busy("gpu-w01", smi_mode="hang")], fast_vars(["gpu-w01"], command_timeout=4))
    with anyio.fail_after(90):
        report = await reset(sim, tmp_path)
    host = report.hosts["gpu-w01"]
    assert host.status is HostStatus.FAILED
    assert host.reason is Reason.COMMAND_TIMEOUT
    assert host.error == ("nvidia-smi did not answer within 12 s (nvidia-smi's bound: 3 x command_timeout) in drain, "
                          "not asked again: driver may be wedged; reset its GPUs (--gpu-reset) or reboot the node")
    events = last_log(tmp_path, "gpu-w01")
    drain = [e for e in events if e["event"] == "command" and e.get("step") == str(StepName.DRAIN)]
    journal, memory, apps = [e for e in drain if e["batch"] == drain[0]["batch"]]  # the baselines' batch
    assert journal["argv"][:2] == ["sh", "-c"] and journal["exit_status"] == 0 and not journal["timed_out"]
    assert memory["timed_out"] and memory["bound"] == "nvidia-smi's bound: 3 x command_timeout"
    assert apps["note"].startswith("not run: nvidia-smi timed out after 12 s (nvidia-smi's bound")
    assert not [e for e in events if e["event"] == "kernel_log_unread"]
    (unread,) = [e for e in events if e["event"] == "memory_unread"]
    assert "within 12 s (nvidia-smi's bound: 3 x command_timeout)" in unread["error"]
