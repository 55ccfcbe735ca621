"""The simulated nvidia-smi's settings commands print what the real tool prints (the captures in
tests/fixtures/nvidia-smi/settings_*.txt, SOURCES.md), with the node's own bus ids, and change what later queries
read."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.sim.node import NodeSpec, SimNode
from fleet.sim.pci import bus_id

SMI = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimNode]:
    sim = SimNode(tmp_path / "gpu-s01", NodeSpec(name="gpu-s01", gpus=2, power_limits=((1, 450.0),)))
    sim.setup()
    yield sim
    sim.stop()


def smi(node: SimNode, *args: str) -> tuple[int, str]:
    done = subprocess.run(["nvidia-smi", *args], env=node.env(), cwd=node.root, capture_output=True, text=True,
                          timeout=30, check=False)
    return done.returncode, done.stdout


def captured(name: str, *, bus: str, ours: str) -> str:
    """The capture with its GPU's bus id replaced by the simulated GPU's."""
    text = (SMI / name).read_text()
    assert bus in text
    return text.replace(bus, ours)


def query(node: SimNode, field: str, gpu: int) -> str:
    return smi(node, f"--query-gpu={field}", "--format=csv,noheader,nounits", "-i", str(gpu))[1].strip()


@pytest.mark.parametrize(("args", "capture", "bus", "value"), [
    (("-pm", "1"), "settings_pm-1_2gpus_enabled.txt", "00000000:01:00.0", None),
    (("-c", "3"), "settings_c-3_exclusive-process.txt", "00000000:00:06.0", ("compute_mode", "Exclusive_Process")),
    (("-rgc",), "settings_rgc.txt", "", None),
    (("-lgc", "1740"), "settings_lgc.txt", "00000000:61:00.0",
     ("clocks_event_reasons.applications_clocks_setting", "Active")),
    (("-mig", "0"), "settings_mig-0.txt", "00000000:36:00.0", ("mig.mode.pending", "Disabled")),
    (("-e", "1"), "settings_e-1.txt", "00000000:09:00.0", ("ecc.mode.pending", "Enabled")),
])
def test_each_command_prints_the_captured_text(node: SimNode, args: tuple[str, ...], capture: str, bus: str,
                                               value: tuple[str, str] | None) -> None:
    status, out = smi(node, "-i", "0", *args)
    expected = (SMI / capture).read_text()
    if capture.startswith("settings_pm-1"):  # the capture is of two GPUs: its first line and its last
        lines = expected.splitlines(keepends=True)
        expected = lines[0] + lines[-1]
    assert status == 0 and out == (expected.replace(bus, bus_id(0)) if bus else expected)
    if value is not None:
        assert query(node, value[0], 0) == value[1]


def test_the_power_limit_is_set_from_what_it_was(node: SimNode) -> None:
    expected = captured("settings_pl_set.txt", bus="00000000:05:00.0", ours=bus_id(1))
    expected = expected.replace("110.00 W", "700.00 W").replace("180.00 W", "450.00 W")
    assert smi(node, "-i", "1", "-pl", "700") == (0, expected)
    assert query(node, "power.limit", 1) == "700.00" and query(node, "enforced.power.limit", 1) == "700.00"


def test_compute_mode_default_prints_the_captured_line(node: SimNode) -> None:
    line = (SMI / "settings_c-default_2gpus_lines-only.txt").read_text().splitlines()[0]
    assert smi(node, "-i", "0", "-c", "DEFAULT")[1].splitlines() == [line.replace("00000000:1A:00.0", bus_id(0)),
                                                                     "All done."]


def test_a_refused_power_limit_is_the_captured_line_and_exit_4(tmp_path: Path) -> None:
    sim = SimNode(tmp_path / "gpu-s02", NodeSpec(name="gpu-s02", gpus=1, power_limits=((0, 450.0),),
                                                 power_limit_refused=True))
    sim.setup()
    try:
        assert smi(sim, "-i", "0", "-pl", "700") == (
            4, captured("settings_pl_insufficient-permissions_rc4.txt", bus="00000000:01:00.0", ours=bus_id(0)))
        assert query(sim, "power.limit", 0) == "450.00"
    finally:
        sim.stop()


def test_a_reset_makes_the_pending_mig_mode_current(node: SimNode) -> None:
    smi(node, "-i", "1", "-mig", "1")
    assert (query(node, "mig.mode.current", 1), query(node, "mig.mode.pending", 1)) == ("Disabled", "Enabled")
    assert smi(node, "-i", "1", "-r")[0] == 0
    assert query(node, "mig.mode.current", 1) == "Enabled"
