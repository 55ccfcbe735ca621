"""The simulated node's `sudo` (`fleet.sim.sudo`): `sudo -n ARGV` runs ARGV with the node's PATH and logs it;
anything else is refused. Run as the node runs it, a real process."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from fleet.sim.node import NodeSpec, SimNode


def test_sudo_n_runs_the_command_with_the_nodes_tools_and_logs_it(tmp_path: Path) -> None:
    node = SimNode(tmp_path / "gpu-a01", NodeSpec(name="gpu-a01"))
    node.setup()
    ran = subprocess.run(["sudo", "-n", "sh", "-c", "command -v nvidia-smi"], env=node.env(), capture_output=True,
                         text=True, check=False, timeout=30)
    assert (ran.returncode, ran.stdout.strip()) == (0, node.nvidia_smi_path)
    logged = (node.root / "log" / "sudo.log").read_text().splitlines()
    assert [json.loads(line) for line in logged] == [["sh", "-c", "command -v nvidia-smi"]]
    refused = subprocess.run(["sudo", "-u", "alice", "id"], env=node.env(), capture_output=True, text=True,
                             check=False, timeout=30)
    assert refused.returncode == 1 and "only `sudo -n COMMAND...`" in refused.stderr
