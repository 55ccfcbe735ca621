"""The fake programs in a simulated node's bin/, first on its PATH: each a launcher of one `fleet.sim` module.

`install` writes them: nvidia-smi, systemctl, journalctl and sudo on every node, nv-fabricmanager only on a node
with a fabric manager (`NodeSpec.fabric_manager`); on one without, there is none, as on a real node without the
package (and one a spec no longer gives is taken away).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

TOOLS = (
    ("nvidia-smi", "fleet.sim.nvidia_smi"),
    ("systemctl", "fleet.sim.systemctl"),
    ("journalctl", "fleet.sim.journalctl"),
    ("sudo", "fleet.sim.sudo"),  # `become`: sudo -n ARGV runs ARGV as it is (the node's user is its root)
)
FABRIC_MANAGER = ("nv-fabricmanager", "fleet.sim.fabricmanager")  # only on a node with one


def wrapper(module: str, root: Path) -> str:
    """A fake tool's launcher: `python -S` (no site, stdlib only) starts in a third of the time."""
    python, path = shlex.quote(sys.executable), shlex.quote(str(REPO_ROOT))
    return f'#!/bin/sh\nPYTHONPATH={path} exec {python} -S -m {module} --node {shlex.quote(str(root))} "$@"\n'


def install(bin_dir: Path, root: Path, *, fabric_manager: bool) -> None:
    """Write the node's launchers into `bin_dir` (idempotent)."""
    for tool, module in (*TOOLS, FABRIC_MANAGER) if fabric_manager else TOOLS:
        path = bin_dir / tool
        path.write_text(wrapper(module, root))
        path.chmod(0o755)
    if not fabric_manager:
        (bin_dir / FABRIC_MANAGER[0]).unlink(missing_ok=True)
