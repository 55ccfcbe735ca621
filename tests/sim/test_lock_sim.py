"""One reset per host at a time, over real SSH against simulated nodes: the node's lock file is the judge.

Two runs against the same node never interleave their steps; a run that cannot
get the lock in time says whose it is and touches nothing; the lock goes with
the run that held it, however that run ended.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from support.processes import lock_freed, lock_held
from support.sim_fleet import busy, fast_vars

from fleet.engine.graph import run_hosts
from fleet.engine.options import RunOptions
from fleet.inventory.load import load_inventory
from fleet.inventory.targeting import select
from fleet.model.report import HostReport, HostStatus, Reason, StepStatus
from fleet.runlog.folder import RunLogs
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import WorkerSpec

NODE = "gpu-l01"


def owner_file_text(sim: SimFleet) -> str:
    return Path(sim.nodes[NODE].lock_file + ".owner").read_text()


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[SimFleet]:
    """One busy node whose memory takes 2 s to come back (a reset of a few seconds); torn down after."""
    fleet = SimFleet(tmp_path / "sim", [busy(NODE, linger_s=2.0)], host_vars=fast_vars([NODE]))
    await fleet.__aenter__()
    try:
        yield fleet
    finally:
        await fleet.__aexit__(None, None, None)
        node = fleet.nodes[NODE]
        assert not [p for p in node.recorded_pids() if node.alive(p)], "teardown left a process alive"


async def reset(sim: SimFleet, tmp_path: Path, run_id: str) -> HostReport:
    hosts = select(load_inventory(sim.inventory_path), groups=["sim"])
    logs = RunLogs(tmp_path / "logs", run_id)
    logs.create()
    try:
        report, _ = await run_hosts(hosts, RunOptions(), logs)
    finally:
        logs.close()
    return report.hosts[NODE]


def events(tmp_path: Path, run_id: str) -> list[dict[str, Any]]:
    lines = (tmp_path / "logs" / run_id / f"{NODE}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def when(log: list[dict[str, Any]], event: str) -> str:
    return cast(str, next(e["timestamp"] for e in log if e["event"] == event))  # the log's ISO time


def step_commands(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in log if e["event"] == "command" and "step" in e]


async def lock_taken(path: str, within: float) -> bool:
    with anyio.move_on_after(within):
        while not lock_held(path):  # noqa: ASYNC110 - polls the node's lock file: there is no event to await
            await anyio.sleep(0.05)
    return lock_held(path)


async def test_two_runs_on_one_node_never_interleave(sim: SimFleet, tmp_path: Path) -> None:
    """The second run waits for the first's lock; every step command of one run lies outside the other's."""
    results: dict[str, HostReport] = {}
    stray = sim.nodes[NODE].spawn_worker(WorkerSpec(gpus=(0,), mib=1523, name="python3"))

    async def one(run_id: str) -> None:
        results[run_id] = await reset(sim, tmp_path, run_id)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "run-a")
            tg.start_soon(one, "run-b")
    assert all(r.status is HostStatus.CLEAN for r in results.values()), {k: r.error for k, r in results.items()}
    logs = {run_id: events(tmp_path, run_id) for run_id in results}
    first, second = sorted(logs, key=lambda run_id: when(logs[run_id], "lock_acquired"))
    # A command is logged when it ends: the first run's last one ended before the second run held the lock,
    # and the second run's commands all started after that.
    assert max(e["timestamp"] for e in step_commands(logs[first])) < when(logs[second], "lock_acquired")
    assert when(logs[second], "lock_acquired") < min(e["timestamp"] for e in step_commands(logs[second]))
    assert "lock_busy" not in {e["event"] for log in logs.values() for e in log}
    waited = next(e["waited_s"] for e in logs[second] if e["event"] == "lock_acquired")
    assert waited > 1.0, "the second run did not wait for the first"
    assert [k.pid for k in results[first].killed] == [stray]
    assert results[second].killed == ()  # the second found the node clean
    assert owner_file_text(sim) == f"{second}\n"
    assert not lock_held(sim.nodes[NODE].lock_file)


async def test_a_run_that_cannot_get_the_lock_says_whose_it_is_and_touches_nothing(
    sim: SimFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("fleet.reset.lock.LOCK_WAIT_S", 0.5)
    node = sim.nodes[NODE]
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            first: dict[str, HostReport] = {}

            async def run_a() -> None:
                first["report"] = await reset(sim, tmp_path, "run-a")

            tg.start_soon(run_a)
            assert await lock_taken(node.lock_file, 10)
            locked_out = await reset(sim, tmp_path, "run-b")
    assert locked_out.status is HostStatus.FAILED
    assert locked_out.error == "locked by run run-a" and locked_out.reason is Reason.LOCKED
    assert all(s.status is StepStatus.SKIPPED for s in locked_out.steps)
    assert locked_out.killed == ()
    log_b = events(tmp_path, "run-b")
    assert not step_commands(log_b), "the locked-out run ran a step command"
    assert next(e for e in log_b if e["event"] == "lock_busy")["owner"] == "run-a"
    assert first["report"].status is HostStatus.CLEAN, first["report"].error

    assert not lock_held(node.lock_file), "the lock outlived the run that held it"
    after = await reset(sim, tmp_path, "run-c")
    assert after.status is HostStatus.CLEAN, after.error
    # the lock was free: a held one would have failed run-c after the half-second wait this test gives a lock
    # (its acquisition's own seconds are a command's round trip, which a loaded machine makes longer than that)
    taken = [e["event"] for e in events(tmp_path, "run-c") if e["event"].startswith("lock_")]
    assert taken == ["lock_acquired", "lock_released"]


async def test_a_run_cancelled_mid_reset_releases_the_lock(sim: SimFleet, tmp_path: Path) -> None:
    node = sim.nodes[NODE]
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(reset, sim, tmp_path, "run-a")
            assert await lock_taken(node.lock_file, 10)
            await anyio.sleep(0.5)  # into the reset: drain or kill
            tg.cancel_scope.cancel()
    assert not lock_held(node.lock_file), "a cancelled run left the node locked"
    assert any(e["event"] == "lock_released" for e in events(tmp_path, "run-a"))
    after = await reset(sim, tmp_path, "run-b")
    assert after.status is HostStatus.CLEAN, after.error


async def test_a_dropped_session_releases_the_lock(sim: SimFleet, tmp_path: Path) -> None:
    """The node loses fleet mid-reset (connection gone): its lock goes with the session."""
    node = sim.nodes[NODE]
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(reset, sim, tmp_path, "run-a")
            assert await lock_taken(node.lock_file, 10)
            sim.servers[NODE].drop_connections()
    assert await lock_freed(node.lock_file, 10), "the lock outlived the session that took it"
    after = await reset(sim, tmp_path, "run-b")
    assert after.status is HostStatus.CLEAN, after.error
