"""Simulated nodes (fleet.sim.node.SimNode) started in-process, without SSH, and a shell on them as the SSH server
gives it."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleet.sim import NodeSpec, SimNode, state

MakeNode = Callable[[NodeSpec], SimNode]


@pytest.fixture
def make_node(tmp_path: Path) -> Iterator[MakeNode]:
    """Start nodes under tmp_path; stop them all afterwards, even after a failure."""
    nodes: list[SimNode] = []

    def make(spec: NodeSpec) -> SimNode:
        node = SimNode(tmp_path / spec.name, spec)
        nodes.append(node)
        node.start()
        return node

    yield make
    for node in nodes:
        node.stop()
        assert [pid for pid in node.recorded_pids() if node.alive(pid)] == []


def sh(node: SimNode, command: str) -> subprocess.CompletedProcess[str]:
    """Run `command` on the node as the SSH server would."""
    return subprocess.run(
        ["/bin/sh", "-c", command], env=node.env(), cwd=node.root, capture_output=True, text=True, timeout=30
    )


def soon(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Whether condition held within `timeout` seconds (the simulator's own wait, polled every 20 ms): a bound that
    only ends a test whose condition never comes, so it leaves room for a loaded machine."""
    return state.wait_for(condition, timeout, interval=0.02)
