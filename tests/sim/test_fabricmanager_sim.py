"""The fabric manager's version over simulated nodes (fleet.sim.fabricmanager; verify's last section): the fake
answers `--version` with the real line and is not there on a node without one; a binary that fails, prints bytes
that are not UTF-8 or hangs is "not observed" in the host's report, named the odd one out, and never fails the host
(its verify and everything else read as before)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.paths import FIXTURES
from support.sim_fleet import fast_vars, make_fleet, reset
from support.sim_nodes import MakeNode, make_node, sh

from fleet.model import uniformity
from fleet.model.fabric import FabricManager, FmState
from fleet.model.report import HostStatus
from fleet.node.probes.fabricmanager import NOT_FOUND
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec

__all__ = ["make_fleet", "make_node"]  # the fixtures

VERSION = "550.90.07"


def test_the_fake_prints_the_real_line_and_is_absent_without_one(make_node: MakeNode) -> None:
    with_one = make_node(NodeSpec(name="fm-a", fabric_manager="535.161.08"))
    with_one.setup()
    answered = sh(with_one, "nv-fabricmanager --version")
    assert (answered.returncode, answered.stdout, answered.stderr) == (
        0, (FIXTURES / "fabricmanager" / "fm535.161.08_version.txt").read_text(), "")
    assert sh(with_one, "nv-fabricmanager -c /etc/fabricmanager.cfg").returncode == 1  # the daemon: not simulated
    without = make_node(NodeSpec(name="fm-b"))
    without.setup()
    missing = sh(without, "timeout -k 1 5 nv-fabricmanager --version")
    assert (missing.returncode, missing.stdout) == (NOT_FOUND, "")
    assert not (without.bin_dir / "nv-fabricmanager").exists()


def broken(sim: SimFleet, name: str, script: str) -> None:
    """Put a real program in place of the node's fake nv-fabricmanager."""
    path = sim.nodes[name].bin_dir / "nv-fabricmanager"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


async def test_a_fabric_manager_that_fails_prints_garbage_or_hangs_is_not_observed(make_fleet: Any,
                                                                                   tmp_path: Path) -> None:
    names = ["gpu-m01", "gpu-m02", "gpu-m03", "gpu-m04", "gpu-m05"]
    # only the hung one's bound is short: on a loaded machine a holder scan can take seconds, and slow is not dead
    sim: SimFleet = await make_fleet([NodeSpec(name=n, fabric_manager=VERSION) for n in names],
                                     {**fast_vars(names), **fast_vars(["gpu-m05"], command_timeout=5)})
    broken(sim, "gpu-m03", "echo 'nv-fabricmanager: error while loading shared libraries: libnvfm.so.1' >&2\nexit 1\n")
    broken(sim, "gpu-m04", "printf 'Fabric Manager version is : 550.\\377.07\\n'\n")
    broken(sim, "gpu-m05", "exec sleep 30\n")  # past its bound (command_timeout): the section's timeout ends it
    report = await reset(sim, tmp_path, command="check")
    hosts = report.hosts
    assert {n: h.status for n, h in hosts.items()} == dict.fromkeys(names, HostStatus.CLEAN), \
        {n: h.error for n, h in hosts.items()}
    assert hosts["gpu-m01"].fabric_manager == hosts["gpu-m02"].fabric_manager == FabricManager.present(VERSION)
    failed, garbage, hung = (hosts[n].fabric_manager for n in ("gpu-m03", "gpu-m04", "gpu-m05"))
    assert failed == FabricManager.unread("nv-fabricmanager --version exited 1: nv-fabricmanager: error while "
                                          "loading shared libraries: libnvfm.so.1")
    assert garbage is not None and garbage.state is FmState.NOT_OBSERVED
    assert "unreadable nv-fabricmanager --version" in (garbage.why or "")
    assert hung is not None and hung.state is FmState.NOT_OBSERVED and "did not answer within 5 s" in (hung.why or "")
    assert uniformity.odd(hosts) == {
        n: [f"fabric manager not observed (2 others {VERSION})"] for n in ("gpu-m03", "gpu-m04", "gpu-m05")}
