"""A crash is recoverable, on a real Slurm: `fleet reset --slurm` SIGKILLed mid-run with its nodes drained, then
run again on the same nodes and the same --log-dir. The second run takes the orphaned drains over (the killed
run's `running.lock` is free), resets and resumes the clean nodes, keeps the failed one drained with its own
error, and the history shows the killed run as unfinished, its process gone.

The killed run is held mid-run by Slurm itself: sim1..sim3 each run a job, so fleet drains them and waits
(--drain-wait 10m); the test kills it once every node carries its reason, then ends the jobs. sim4 has no job
and an Xid 79 in its kernel log: the killed run may be resetting it, or have failed it and kept it drained,
when it dies; either way the next run takes it over and fails it again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import anyio
import pytest
from slurm import StartCluster, live

from fleet.report.logs import RunLiveness, run_liveness
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, UnitSpec, WorkerSpec
from fleet.sim.slurmcluster import SlurmCluster

pytestmark = pytest.mark.slurm

NAMES = ("sim1", "sim2", "sim3", "sim4")
BUSY = ("sim1", "sim2", "sim3")  # a Slurm job on each holds the first run in its drain wait
FAST = {"drain_timeout": 5, "kill_grace": 2, "settle_timeout": 15, "command_timeout": 5}
XID_79 = ((5, 79, "pid=2718, name=sglang, GPU has fallen off the bus."),)
WAIT_S = 120.0  # the most any condition below may take to come true (a loaded machine included)


def spec(name: str) -> NodeSpec:
    unit = UnitSpec("sglang.service", mib=30000, process_name="sglang")
    stray = WorkerSpec(gpus=(0,), mib=1523, name="python3")
    return NodeSpec(name=name, units=(unit,), workers=(stray,), xids=XID_79 if name == "sim4" else (), linger_s=0.3)


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[SimFleet]:
    async with SimFleet(tmp_path / "fleet", [spec(n) for n in NAMES],
                        host_vars={n: dict(FAST) for n in NAMES}) as fleet:
        yield fleet


@pytest.fixture
def cluster(sim: SimFleet, slurm_cluster: StartCluster) -> SlurmCluster:
    return slurm_cluster({n: sim.address(n) for n in NAMES},
                         task_env={n: {"PATH": node.env()["PATH"]} for n, node in sim.nodes.items()},
                         gpus=dict.fromkeys(NAMES, 8))


def reset_argv(sim: SimFleet, logs: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "fleet", "reset", "--slurm", "-y", "--json", "-i", str(sim.inventory_path),
            "--group", "sim", "--log-dir", str(logs), *more]


def fleet_cli(argv: Sequence[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=300, check=False)


def descendants(pid: int) -> list[int]:
    """pid's live descendants, from /proc (children of every thread, recursively)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with suppress(OSError):
            for child in map(int, (task / "children").read_text().split()):
                found += [child, *descendants(child)]
    return found


@contextmanager
def started(argv: Sequence[str], env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """fleet as a process of its own; it and anything it started that is still alive are SIGKILLed at the end,
    each by its recorded pid (`.left`: the descendants recorded while it ran)."""
    process = subprocess.Popen(list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.left = []  # type: ignore[attr-defined]
    try:
        yield process
    finally:
        for pid in [process.pid, *process.left]:  # type: ignore[attr-defined]
            if live(pid):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        process.communicate(timeout=30)


async def until(what: str, done: Any) -> Any:
    """Poll `done` (run in a thread: the simulated nodes' SSH servers share this event loop) until it returns
    something true; fail naming `what` after WAIT_S."""
    deadline = anyio.current_time() + WAIT_S
    while anyio.current_time() < deadline:
        if value := await anyio.to_thread.run_sync(done):
            return value
        await anyio.sleep(0.2)
    pytest.fail(f"not within {WAIT_S:g} s: {what}")


def run_folder(logs: Path) -> str | None:
    folders = [p.name for p in logs.iterdir() if p.is_dir()] if logs.is_dir() else []
    return folders[0] if len(folders) == 1 else None


def drained_by(cluster: SlurmCluster, run_id: str) -> dict[str, str] | None:
    """Every node's reason, once each is one the run `run_id` set (`fleet: run <id>`, with its error or not)."""
    reasons = {n: cluster.node_reason(n) for n in NAMES}
    return reasons if all(r.startswith(f"fleet: run {run_id}") for r in reasons.values()) else None


async def test_a_run_killed_with_its_nodes_drained_is_taken_over_by_the_next(sim: SimFleet, cluster: SlurmCluster,
                                                                             tmp_path: Path) -> None:
    env = {**os.environ, **cluster.env}
    logs = tmp_path / "logs"
    jobs = {n: cluster.submit_sleep(n, 600) for n in BUSY}
    try:
        with started(reset_argv(sim, logs), env) as first:
            killed = await until("the first run's log folder", lambda: run_folder(logs))
            drained = await until(f"every node drained by run {killed}", lambda: drained_by(cluster, killed))
            first.left = descendants(first.pid)  # type: ignore[attr-defined]
            assert run_liveness(logs, killed) is RunLiveness.RUNNING
            os.kill(first.pid, signal.SIGKILL)
            await anyio.to_thread.run_sync(first.wait)
        assert first.returncode == -signal.SIGKILL
        assert all(drained[n] == f"fleet: run {killed}" for n in BUSY)
        # left as the killed run left them: drained with its reason, its lock free, no summary
        assert {n: cluster.node_reason(n) for n in BUSY} == dict.fromkeys(BUSY, f"fleet: run {killed}")
        assert {cluster.node_state(n) for n in BUSY} == {"draining"}
        assert run_liveness(logs, killed) is RunLiveness.OVER and not (logs / killed / "summary.json").exists()
    finally:
        for job in jobs.values():
            await anyio.to_thread.run_sync(cluster.cancel, job)
    await until("the jobs' nodes drained", lambda: all(cluster.node_state(n) == "drained" for n in BUSY))

    out = await anyio.to_thread.run_sync(fleet_cli, reset_argv(sim, logs), env)
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    hosts = report["hosts"]
    for name in BUSY:
        slurm = hosts[name]["slurm"]
        assert hosts[name]["status"] == "clean", hosts[name]
        assert slurm["reason_before"] == f"fleet: run {killed}" and slurm["taken_over"] == killed
        assert slurm["state_after"] == "IDLE" and slurm["reason_after"] is None
        assert cluster.node_state(name) == "idle" and cluster.node_reason(name) == ""
    sim4 = hosts["sim4"]
    assert sim4["status"] == "failed" and "Xid 79" in sim4["error"]
    assert sim4["slurm"]["taken_over"] == killed
    assert cluster.node_state("sim4") == "drained"
    assert cluster.node_reason("sim4").startswith(f"fleet: run {report['run_id']}: ")

    assert_unfinished(history(logs, env), killed, report["run_id"])


def history(logs: Path, env: dict[str, str]) -> tuple[dict[str, Any], str]:
    as_json = fleet_cli([sys.executable, "-m", "fleet", "runs", "--json", "--log-dir", str(logs)], env)
    text = fleet_cli([sys.executable, "-m", "fleet", "runs", "--log-dir", str(logs)], env)
    assert as_json.returncode == 0 == text.returncode, as_json.stderr + text.stderr
    return json.loads(as_json.stdout), text.stdout


def assert_unfinished(runs: tuple[dict[str, Any], str], killed: str, second: str) -> None:
    document, text = runs
    by_id = {r["run_id"]: r for r in document["runs"]}
    assert by_id[killed]["ended_at"] is None and by_id[killed]["exit_code"] is None
    assert by_id[killed]["liveness"] == "killed"
    assert by_id[second]["exit_code"] == 1 and by_id[second]["liveness"] == "over"
    line = next(line for line in text.splitlines() if line.startswith(killed))
    assert "unfinished (killed)" in line
