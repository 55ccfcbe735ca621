"""An operator's terminal gets fleet's lines only: no library's warning, even with every warning forced on."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import anyio
from support.demo_run import demo_env

from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec

FLEET = Path(sys.executable).parent / "fleet"  # the console script, as an operator runs it

# How Python prints a warning: `path.py:12: SomeWarning: text`, then the source line indented under it.
WARNING_LINE = re.compile(r"^\S.*:\d+: \w*(Warning|Error)\b|Warning: ")


def forced_on(base: dict[str, str] | None = None) -> dict[str, str]:
    """Every warning shown once per place (`default`), as an operator's PYTHONWARNINGS may ask."""
    return {**(os.environ if base is None else base), "PYTHONWARNINGS": "default"}


def library_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if WARNING_LINE.search(line)]


async def test_check_and_reset_print_no_library_warning(tmp_path: Path) -> None:
    async with SimFleet(tmp_path / "sim", [NodeSpec(name="gpu-b01")]) as sim:
        for command in (["check"], ["reset", "-y"]):
            done = await anyio.run_process(
                [str(FLEET), *command, "-i", str(sim.inventory_path), "-g", "sim", "--log-dir", str(tmp_path / "logs")],
                check=False, env=forced_on())
            stderr = done.stderr.decode()
            assert done.returncode in (0, 1), stderr
            assert "gpu-b01" in stderr, stderr  # the run said what it did
            assert library_lines(stderr) == [], stderr


def test_the_demo_prints_no_library_warning(tmp_path: Path) -> None:
    with demo_env(tmp_path, forced_on()) as env:
        done = subprocess.run([str(FLEET), "demo", "--nodes", "1", "--log-dir", str(tmp_path / "logs")],
                              capture_output=True, text=True, env=env, timeout=300, check=False,
                              stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert "simulated fleet torn down" in done.stderr
    assert library_lines(done.stderr) == [], done.stderr
