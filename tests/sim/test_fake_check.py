"""A new nvidia-smi check is one fact row and one check row: a made-up one, registered here, is asked by the real
probes, answered by the simulated nvidia-smi (--query-gpu and -q) and fails a reset over SSH, naming the GPU."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import scripted_node
from support.sim_fleet import busy, fast_vars, reset
from support.sim_fleet import make_fleet as make_fleet  # the fixture: fleets torn down after the test

from fleet.model import gpu_facts, health_checks
from fleet.model.gpu_facts import Field, GpuHealth, Unread, switch
from fleet.model.health_checks import Check
from fleet.model.report import HostStatus, Level, Reason
from fleet.node.probes import health
from fleet.sim.node import NodeSpec, SimNode

__all__ = ["make_fleet"]  # the fixture, shared with test_reset_sim

# The fact: where --query-gpu and -q would print it, how it reads, what a healthy GPU prints. Made up, so no driver
# has it: a real row's field and -q path come from a capture in tests/fixtures/nvidia-smi (SOURCES.md).
WIDGETS = Field(name="widgets_pending", query="widgets.pending", q=(("Widgets", "Pending"),), read=switch("Yes", "No"),
                check="widgets", strict=True, sim="No")


def _widgets(gpu: GpuHealth) -> str | None:
    return "widgets pending: reset the GPU" if gpu[WIDGETS] else None


# The check: its level, why, rank after the others, and the finding its fact makes.
WIDGETS_CHECK = Check(name="widgets", default=Level.FAIL, why="a made-up fact, to show that a check is one row",
                      rank=10, finding=_widgets)


@pytest.fixture
def widgets() -> Iterator[None]:
    """The check and its fact in the tables while the test runs (and the simulated nodes it starts)."""
    with health_checks.registered(WIDGETS_CHECK, WIDGETS):
        yield


def test_the_tables_take_the_rows_for_the_block_only(widgets: None) -> None:
    assert health.health_fields()[-1] == "widgets.pending"
    assert health_checks.names()[-1] == "widgets"
    assert WIDGETS_CHECK.reads == "`widgets.pending`"
    with pytest.raises(ValueError, match="already a health check: widgets"), \
            health_checks.registered(WIDGETS_CHECK, WIDGETS):
        pass


def test_without_the_block_the_wire_is_as_before() -> None:
    assert "widgets.pending" not in health.health_fields() and "widgets" not in health_checks.names()
    assert gpu_facts.current() == gpu_facts.FIELDS


def test_the_probes_read_the_row_from_both_answers(widgets: None) -> None:
    bus = "00000000:18:00.0"
    (gpu,) = health.parse_facts(query_row(bus, "Yes")) or ()
    assert gpu[WIDGETS] is True
    (unread,) = health.parse_facts(query_row(bus, "[Unknown Error]")) or ()
    assert unread[WIDGETS] is None and unread.unread == (Unread("widgets", "widgets.pending", "[Unknown Error]"),)
    (q,) = health.parse_health(f"GPU {bus}\n    Widgets\n        Pending : No\n")
    assert q[WIDGETS] is False


def query_row(bus: str, widgets: str) -> str:
    """The facts' --query-gpu row of a real idle H100 (scripted_node's capture), with the made-up field's value."""
    header, row = (line.split(", ") for line in scripted_node.ALL_FIELDS_CAPTURE.read_text().splitlines()[:2])
    values = {**scripted_node.nounits(header, row), "pci.bus_id": bus, "widgets.pending": widgets}
    return ", ".join(values[field] for field in health.health_fields()) + "\n"


def sh(node: SimNode, command: str) -> str:
    done = subprocess.run(["/bin/sh", "-c", command], env=node.env(), cwd=node.root, capture_output=True,
                          text=True, timeout=30, check=True)
    return done.stdout


def test_the_simulated_nvidia_smi_answers_the_row(widgets: None, tmp_path: Path) -> None:
    """Its healthy value, or the node's `smi_values`, in --query-gpu and at its -q path (a section the capture the
    simulator prints lacks, added in the capture's layout)."""
    node = SimNode(tmp_path / "gpu-w01", NodeSpec(name="gpu-w01", gpus=2, smi_values=((1, "widgets.pending", "Yes"),)))
    node.setup()
    try:
        assert sh(node, "nvidia-smi --query-gpu=index,widgets.pending --format=csv,noheader") == "0, No\n1, Yes\n"
        healthy, sick = health.parse_all_health(sh(node, "nvidia-smi -q"))
        assert (healthy[WIDGETS], sick[WIDGETS]) == (False, True)
    finally:
        node.stop()


async def test_a_reset_fails_on_the_new_check_naming_the_gpu(widgets: None, make_fleet: Any, tmp_path: Path) -> None:
    names = ["gpu-w01", "gpu-w02"]
    sim = await make_fleet([busy("gpu-w01", smi_values=((2, "widgets.pending", "Yes"),)), busy("gpu-w02")],
                           fast_vars(names))
    report = await reset(sim, tmp_path)
    sick, healthy = report.hosts["gpu-w01"], report.hosts["gpu-w02"]
    assert (sick.status, sick.reason, sick.error) == (HostStatus.FAILED, Reason.HEALTH,
                                                      "gpu 2: widgets pending: reset the GPU")
    assert [(f.check, f.level) for f in sick.gpus[2].health] == [("widgets", Level.FAIL)]
    assert healthy.status is HostStatus.CLEAN, healthy.error
