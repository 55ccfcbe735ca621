"""`--restore-settings` through a stock OpenSSH sshd (marker `sshd`): a node a last user left with a locked clock
and a lowered power limit fails `health_fail: [gpu_settings]` until the restore, which runs each nvidia-smi command
through `sudo -n` on a `become` host, as the kill's signals; then it is clean. Its fabric manager's version is read
with verify's other reads, never through sudo. Every node stopped after."""

from __future__ import annotations

import json
from pathlib import Path

from support.sshd_nodes import MakeHost, make_host, run, serving

from fleet.model.fabric import FabricManager
from fleet.model.report import HostStatus, Reason

__all__ = ["make_host"]  # the fixture, used by name


async def test_a_restore_over_ssh_through_sudo_takes(make_host: MakeHost, tmp_path: Path) -> None:
    node, host = make_host(serving(locked_clock_gpus=(2,), power_limits=((5, 450.0),), fabric_manager="550.90.07"),
                           become=True, health_fail=("gpu_settings",))
    found, _ = await run(host, tmp_path)
    assert found.status is HostStatus.FAILED and found.reason is Reason.GPU_SETTINGS
    assert found.error == ("gpu 2: locked or application clocks in force (clock event reason Applications Clocks "
                           "Setting) (+1 more)")
    sudo_log = node.root / "log" / "sudo.log"
    before = len(sudo_log.read_text().splitlines())
    restored, events = await run(host, tmp_path, restore_settings=True)
    assert restored.status is HostStatus.CLEAN, restored.error
    assert [(e["gpu"], e["command"], e["exit_status"]) for e in events if e.get("event") == "settings_restore"] == [
        (2, "nvidia-smi -i 2 -rgc", 0), (2, "nvidia-smi -i 2 -rmc", 0), (2, "nvidia-smi -i 2 -rac", 0),
        (5, "nvidia-smi -i 5 -pl 700", 0)]
    through_sudo = [" ".join(json.loads(line)) for line in sudo_log.read_text().splitlines()[before:]]
    assert sum(f"{host.nvidia_smi} -i 5 -pl 700" in argv for argv in through_sudo) == 1
    assert sum(" -rgc" in argv or " -rmc" in argv or " -rac" in argv for argv in through_sudo) == 3
    assert found.fabric_manager == restored.fabric_manager == FabricManager.present("550.90.07")
    assert not any("nv-fabricmanager" in argv for argv in through_sudo)
