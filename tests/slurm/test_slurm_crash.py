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
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.processes import descendants
from support.slurm import StartCluster, live

from fleet.runlog.folder import RunLiveness, RunLogs, run_liveness
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, UnitSpec, WorkerSpec
from fleet.sim.slurmcluster import SlurmCluster

# Two whole fleet runs, a kill and the history read back, each a process of its own, over a real Slurm.
pytestmark = pytest.mark.timeout(300)

NAMES = ("sim1", "sim2", "sim3", "sim4")
BUSY = ("sim1", "sim2", "sim3")  # a Slurm job on each holds the first run in its drain wait
# Bounds that stay out of the way on a loaded machine: nothing here waits for a bound to run out.
FAST = {"drain_timeout": 5, "kill_grace": 2, "settle_timeout": 60, "command_timeout": 30}
XID_79 = ((5, 79, "pid=2718, name=sglang, GPU has fallen off the bus."),)
WAIT_S = 120.0  # the most any condition below may take to come true (a loaded machine included)


def spec(name: str, linger_s: float) -> NodeSpec:
    unit = UnitSpec(name="sglang.service", mib=30000, process_name="sglang")
    stray = WorkerSpec(gpus=(0,), mib=1523, name="python3")
    return NodeSpec(name=name, units=(unit,), workers=(stray,), xids=XID_79 if name == "sim4" else (),
                    linger_s=linger_s)


@pytest.fixture
async def sim(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[SimFleet]:
    """Four busy nodes. Parametrized indirectly: `linger_s`, how long the units' memory stays after they die, and
    host variables over FAST."""
    param = getattr(request, "param", {})
    host_vars = {**FAST, **param.get("vars", {})}
    async with SimFleet(tmp_path / "fleet", [spec(n, param.get("linger_s", 0.3)) for n in NAMES],
                        host_vars={n: dict(host_vars) for n in NAMES}) as fleet:
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


@dataclass
class Started:
    """A fleet process and what it started, as recorded while it ran (`record`)."""

    process: subprocess.Popen[str]
    left: list[int] = field(default_factory=list)

    def record(self) -> list[int]:
        self.left = descendants(self.process.pid)
        return self.left

    def kill(self) -> None:
        """SIGKILL it, by its pid, as a crash ends it: no handler runs, nothing it started is told."""
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()


@contextmanager
def started(argv: Sequence[str], env: dict[str, str]) -> Iterator[Started]:
    """fleet as a process of its own; it and what it was recorded to have started are SIGKILLed at the end if still
    alive, each by its recorded pid."""
    run = Started(subprocess.Popen(list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        yield run
    finally:
        for pid in [run.process.pid, *run.left]:
            if live(pid):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        run.process.communicate(timeout=30)


async def until(what: str, done: Any, seen: Any = None) -> Any:
    """Poll `done` (run in a thread: the simulated nodes' SSH servers share this event loop) until it returns
    something true; fail naming `what` (and what `seen()` says then) after WAIT_S."""
    deadline = anyio.current_time() + WAIT_S
    while anyio.current_time() < deadline:
        if value := await anyio.to_thread.run_sync(done):
            return value
        await anyio.sleep(0.2)
    pytest.fail(f"not within {WAIT_S:g} s: {what}" + (f": {await anyio.to_thread.run_sync(seen)}" if seen else ""))


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
            first.record()  # a Slurm command it may be running (timeout, squeue): ended by the test if left
            assert run_liveness(logs, killed) is RunLiveness.RUNNING
            await anyio.to_thread.run_sync(first.kill)
        assert first.process.returncode == -signal.SIGKILL
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
    page = (logs / report["run_id"] / "report.html").read_text()
    assert page.count(f"slurm: took over the drain of run {killed}") == len(NAMES)

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



# --- --via srun: the reservation a killed run left ------------------------------------------------------------


def srun_argv(sim: SimFleet, logs: Path) -> list[str]:
    return [arg if arg != "--slurm" else "--via=srun" for arg in reset_argv(sim, logs)]


def last_steps(logs: Path, run_id: str) -> dict[str, str]:
    """Each node's last log line, for a failure's message."""
    paths = {n: logs / run_id / f"{n}.jsonl" for n in NAMES}
    return {n: (p.read_text().splitlines() or [""])[-1][:300] if p.is_file() else "no log" for n, p in paths.items()}


def in_settle(logs: Path, run_id: str) -> bool:
    """Every node's log (relayed from its task) says its settle step began."""
    texts = [(logs / run_id / f"{n}.jsonl") for n in NAMES]
    return all(p.is_file() and '"step": "settle"' in p.read_text() for p in texts)


# The units' memory lingers 20 s after they die, and settle waits for it (up to 120 s): the killed run's step is
# still in settle when the test kills it, and the next run's settle waits out what is left of the linger.
@pytest.mark.parametrize("sim", [{"linger_s": 20.0, "vars": {"settle_timeout": 120}}], indirect=True)
async def test_a_reservation_a_killed_srun_run_left_is_seen_and_removed_by_the_next(
    sim: SimFleet, cluster: SlurmCluster, tmp_path: Path
) -> None:
    env = {**os.environ, **cluster.env}
    logs = tmp_path / "logs"
    with started(srun_argv(sim, logs), env) as first:
        killed = await until("the first run's log folder", lambda: run_folder(logs))
        await until("every node in its settle step", lambda: in_settle(logs, killed), lambda: last_steps(logs, killed))
        srun = first.record()
        assert srun, "the step's srun was not found among fleet's processes"
        await anyio.to_thread.run_sync(first.kill)
        # what the killed fleet left: its srun goes on (its own session), the reservation stays
        assert all(live(pid) for pid in srun) and cluster.reservations() == [f"fleet-{killed}"]
    # the test ended the srun by its recorded pids (`started`), and cancels the step's job as fleet's own cleanup
    # would have: nothing of the killed run is left but its reservation
    await anyio.to_thread.run_sync(lambda: cluster.run("scancel", f"--name=fleet-{killed}"))
    await until("the killed run's job ended", lambda: not cluster.jobs())
    assert {cluster.node_state(n) for n in NAMES} == {"maint"}  # no job can start there until its Duration

    out = await anyio.to_thread.run_sync(fleet_cli, srun_argv(sim, logs), env)
    assert out.returncode == 1, out.stderr
    said = f"reservation fleet-{killed} of run {killed} holds sim[1-4] (its run is over: its running.lock is free)"
    assert f"fleet: {said}: no other job starts there until it ends" in out.stderr
    assert f"fleet: removed {said}: every node of it is clean or drained" in out.stderr
    report = json.loads(out.stdout)
    assert {n: h["status"] for n, h in report["hosts"].items()} == {**dict.fromkeys(BUSY, "clean"), "sim4": "failed"}
    assert cluster.reservations() == []
    assert {n: cluster.node_state(n) for n in NAMES} == {**dict.fromkeys(BUSY, "idle"), "sim4": "drained"}
    assert cluster.node_reason("sim4").startswith(f"fleet: run {report['run_id']}: ")
    # the report says what Slurm shows once every cleanup is done, the leftover's removal included
    assert {n: report["hosts"][n]["slurm"]["state_after"] for n in NAMES} == {
        **dict.fromkeys(BUSY, "IDLE"), "sim4": "IDLE+DRAIN"}
    log = [json.loads(line) for line in (logs / report["run_id"] / "sim1.jsonl").read_text().splitlines()]
    assert [e["action"] for e in log if e["event"] == "slurm_leftover"] == ["seen", "removed"]
    runs, _ = history(logs, env)
    assert {r["run_id"]: r["liveness"] for r in runs["runs"]} == {killed: "killed", report["run_id"]: "over"}


async def test_a_leftover_of_a_run_in_flight_or_over_nodes_no_one_checked_is_kept_and_named(
    sim: SimFleet, cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Two leftovers, made by hand as a killed run leaves them: one of a run whose fleet still holds its
    running.lock (in flight: never removed), one of a run that is over but also holding sim4, which this run
    does not target and which is in service (removing it would free sim4 unchecked)."""
    env = {**os.environ, **cluster.env}
    logs = tmp_path / "logs"
    going, over = RunLogs(logs, "20261204T010000Z-aaaaaa"), RunLogs(logs, "20261204T020000Z-bbbbbb")
    going.create()  # held by this test's process until the end: a run in flight
    over.create()
    over.close()  # its lock free, no summary: a killed run
    try:
        for logged, nodes in ((going, "sim1"), (over, "sim2,sim4")):
            await anyio.to_thread.run_sync(partial(
                cluster.run, "scontrol", "create", "reservation", f"ReservationName=fleet-{logged.run_id}",
                "StartTime=now", "Duration=30", f"Nodes={nodes}", "Users=root", "Flags=MAINT,IGNORE_JOBS"))
        argv = [*srun_argv(sim, logs), "--limit", "sim[1-3]"]
        out = await anyio.to_thread.run_sync(fleet_cli, argv, env)
    finally:
        going.close()
    assert out.returncode == 0, out.stderr
    assert (f"fleet: kept reservation fleet-{going.run_id} of run {going.run_id} holds sim1 (its run may still be"
            " going)") in out.stderr
    assert (f"fleet: kept reservation fleet-{over.run_id} of run {over.run_id} holds sim[2,4] (its run is over:"
            f" its running.lock is free): sim4 not reset clean by this run nor drained; once checked: scontrol"
            f" delete ReservationName=fleet-{over.run_id}") in out.stderr
    assert sorted(cluster.reservations()) == [f"fleet-{going.run_id}", f"fleet-{over.run_id}"]
    report = json.loads(out.stdout)
    assert {h["status"] for h in report["hosts"].values()} == {"clean"}
