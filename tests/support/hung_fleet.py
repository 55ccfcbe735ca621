"""Two simulated nodes whose unit ignores SIGTERM: a reset sits in drain, for interrupts, hang-ups and deadlines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, UnitSpec


@pytest.fixture
async def hung_fleet(tmp_path: Path) -> AsyncIterator[SimFleet]:
    """Two nodes whose unit ignores SIGTERM, with a long drain_timeout: a reset sits in drain."""
    unit = UnitSpec(name="sglang.service", gpus=(0, 1), mib=30000, ignore_sigterm=True)
    specs = [NodeSpec(name=n, units=(unit,), linger_s=0.2) for n in ("gpu-b01", "gpu-b02")]
    host_vars = {n: {"drain_timeout": 60, "command_timeout": 5} for n in ("gpu-b01", "gpu-b02")}
    async with SimFleet(tmp_path / "sim", specs, host_vars=host_vars) as sim:
        yield sim


def fleet_commands_on(sim: SimFleet) -> list[int]:
    """Pids of commands fleet started on the nodes (read-only look at /proc, never used to kill)."""
    roots = [str(node.root) for node in sim.nodes.values()]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0].decode()
        except OSError:
            continue
        if state != "Z" and cmdline.startswith("timeout ") and any(r in cmdline for r in roots):
            found.append(int(entry.name))
    return found


async def wait_for_drain(logs: Path) -> None:
    """Until both hosts have polled their unit at least once."""
    with anyio.fail_after(20):
        while True:
            texts = [p.read_text() for p in logs.glob("*/*.jsonl")]  # noqa: ASYNC240 - tiny files, test only
            if len(texts) == 2 and all('"systemctl", "show"' in t for t in texts):
                return
            await anyio.sleep(0.1)
