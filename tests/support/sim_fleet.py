"""Simulated fleets (fleet.sim.fleetsim.SimFleet) for end-to-end tests: busy nodes, fast bounds, a reset through
the graph, the CLI as a process, and a host's last log."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from fleet.engine.graph import run_hosts
from fleet.engine.options import RunOptions
from fleet.engine.walk import Mode
from fleet.inventory.load import load_inventory
from fleet.inventory.targeting import select
from fleet.model.report import HostReport, RunReport, StepName
from fleet.runlog.folder import RunLogs
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, UnitSpec

ALL = (0, 1, 2, 3, 4, 5, 6, 7)
# Bounds short enough for tests, but commands keep fleet's default bound (10 s): on a shared 2-core machine running
# four workers, a command on a simulated node (a holder scan over every process here) can take seconds, and slow
# is not dead. A test of a bound sets its own.
FAST = {"drain_timeout": 5, "kill_grace": 2, "settle_timeout": 15, "command_timeout": 10}


def busy(name: str, **kw: Any) -> NodeSpec:
    unit = kw.pop("unit", UnitSpec(name="sglang.service", gpus=ALL, mib=30000, process_name="sglang"))
    return NodeSpec(name=name, units=(unit,), linger_s=kw.pop("linger_s", 0.3), **kw)


def fast_vars(names: Sequence[str], **extra: Any) -> dict[str, dict[str, Any]]:
    return {n: {**FAST, **extra} for n in names}


async def reset(sim: SimFleet, tmp_path: Path, *, groups: Sequence[str] = ("sim",),
                command: str = "reset", **options: Any) -> RunReport:
    """A run of `command` through the graph; `options`: more `RunOptions` (`restore_settings=True`)."""
    hosts = select(load_inventory(sim.inventory_path), groups=list(groups))
    logs = RunLogs(tmp_path / "logs", f"run-{os.urandom(3).hex()}")
    logs.create()
    try:
        report, _ = await run_hosts(hosts, RunOptions(mode=Mode(command), **options), logs)
    finally:
        logs.close()
    return report


def comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def step(host: HostReport, name: StepName) -> Any:
    return next(s for s in host.steps if s.name is name)


@pytest.fixture
async def make_fleet(tmp_path: Path) -> AsyncIterator[Any]:
    """Start a simulated fleet; it is always torn down (every recorded pid ended)."""
    stack: list[SimFleet] = []

    async def start(specs: Sequence[NodeSpec], host_vars: Mapping[str, Mapping[str, Any]] | None = None,
                    groups: Mapping[str, Sequence[str]] | None = None) -> SimFleet:
        sim = SimFleet(tmp_path / f"sim{len(stack)}", specs, host_vars=host_vars, groups=groups)
        await sim.__aenter__()
        stack.append(sim)
        return sim

    yield start
    for sim in reversed(stack):
        await sim.__aexit__(None, None, None)
        for node in sim.nodes.values():
            assert not [p for p in node.recorded_pids() if node.alive(p)], "teardown left a process alive"


async def fleet_cli(*args: str, env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
    proc = await anyio.run_process([sys.executable, "-m", "fleet", *args], check=False,
                                   env={**os.environ, **(env or {})})
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def last_log(tmp_path: Path, host: str) -> list[dict[str, Any]]:
    logs = sorted((tmp_path / "logs").glob(f"*/{host}.jsonl"), key=lambda p: p.stat().st_mtime)
    return [json.loads(line) for line in logs[-1].read_text().splitlines()]
