"""fleet with a real Slurm at its edges: a slurmctld that stops answering mid-release, a second and a
third Ctrl-C, a drain left by a dead run, `--via srun` on GPU gres nodes, from a polluted environment, and with
frames it cannot read. The same four busy simulated nodes and real cluster as test_slurm_sim.py."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.sim_fleet import ALL
from support.slurm_fleet import cluster as cluster  # the fixtures: four busy nodes, their Slurm
from support.slurm_fleet import (
    down_with_slurmd_stopped,
    events,
    finish,
    logged,
    released_as_interrupted,
    reset,
    settling,
    slurm_of,
    start_cli,
    state,
    stop,
)
from support.slurm_fleet import sim as sim
from support.waits import until

from fleet.app.run import run_and_report
from fleet.engine.options import RunOptions, SchedulerOptions
from fleet.inventory.load import load_inventory
from fleet.inventory.targeting import select
from fleet.model.report import HostStatus, Reason
from fleet.runlog.folder import RUNNING_LOCK, SUMMARY
from fleet.sim.fleetsim import SimFleet
from fleet.sim.slurmcluster import SlurmCluster
from fleet.slurm.control import SLURM_COMMAND_TIMEOUT_S
from fleet.slurm.lifecycle import finish_s, release_s
from fleet.slurm.policy import failed_reason
from fleet.slurm.srun import SrunRun
from fleet.slurm.waiting import POLL_S

# --- 2. an update that failed is read again ---------------------------------------------------------------


@pytest.mark.parametrize("failed_reads", [1, 2])
async def test_a_release_while_slurmctld_answers_nothing_reports_what_slurm_then_shows(
    sim: SimFleet, cluster: SlurmCluster, tmp_path: Path, failed_reads: int
) -> None:
    """slurmctld stops answering as sim1's verify begins: the release's read times out (scontrol's own
    MessageTimeout), once or twice (a `show node` that hangs twice); once slurmctld runs again, the release reads
    again, resumes, and the report's state_after is what Slurm shows, settled (no NOT_RESPONDING): never the bare
    reason of a run in flight."""
    logs = tmp_path / "logs"
    hosts = select(load_inventory(sim.inventory_path), patterns=["sim1"])
    outcome: dict[str, Any] = {}

    async def run() -> None:
        options = RunOptions(scheduler=SchedulerOptions(name="slurm", drain_wait_s=4.0))
        outcome["report"] = (await run_and_report(hosts, options, as_json=False, log_dir=logs))[1]

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        await until(lambda: logged(logs, "sim1", "step_start", step="verify"), "sim1 reached verify")
        with cluster.frozen():
            await until(lambda: logged(logs, "sim1", "slurm_error", attempt=failed_reads), "the release's reads failed",
                        120)
    sim1 = outcome["report"].hosts["sim1"]
    assert sim1.status is HostStatus.CLEAN
    assert slurm_of(sim1).state_after == "IDLE" and slurm_of(sim1).reason_after is None
    assert slurm_of(sim1).error is None
    assert state(cluster, "sim1") == "idle"


# --- 2. a drain left by a run that is over is taken over ------------------------------------------------------


@pytest.mark.parametrize("earlier_alive", [False, True])
async def test_a_bare_fleet_drain_is_taken_over_only_when_its_run_is_over(
    sim: SimFleet, cluster: SlurmCluster, tmp_path: Path, earlier_alive: bool
) -> None:
    """`fleet: run <id>` with no error part: a run killed before its release left it (its log folder's lock is
    free), or one still in flight (its fleet process holds the lock: here, this test)."""
    earlier = "20261201T000000Z-0a0b0c"
    folder = tmp_path / "logs" / earlier
    folder.mkdir(parents=True)
    lock = os.open(folder / RUNNING_LOCK, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        if earlier_alive:
            fcntl.flock(lock, fcntl.LOCK_EX)
        cluster.drain("sim1", f"fleet: run {earlier}")
        report = await reset(sim, tmp_path)
    finally:
        os.close(lock)
    sim1 = slurm_of(report.hosts["sim1"])
    if earlier_alive:
        assert sim1.reason_after == f"fleet: run {earlier}" and state(cluster, "sim1") == "drained"
    else:
        assert report.hosts["sim1"].status is HostStatus.CLEAN
        assert sim1.state_after == "IDLE" and state(cluster, "sim1") == "idle"
    assert not (folder / SUMMARY).exists()


# --- 3. a second Ctrl-C never abandons the release; a third does, and the report is still written ---------



async def interrupt_twice(process: subprocess.Popen[str], stderr: Path, logs: Path, second: signal.Signals) -> None:
    """SIGINT (slurmctld frozen: the release waits on it), then `second` once the release began, answered with
    one line on stderr."""
    process.send_signal(signal.SIGINT)
    await until(lambda: logged(logs, "sim1", "slurm_release") or logged(logs, "sim1", "slurm_error"),
                "the release began", 30)
    process.send_signal(second)
    await until(lambda: "still releasing" in stderr.read_text(), "the second signal was answered", 30)



@pytest.mark.parametrize("sim", [{"linger_s": 60.0}], indirect=True)  # settle still waits at the signal
async def test_a_second_interrupt_says_what_is_left_and_the_release_still_happens(
    sim: SimFleet, cluster: SlurmCluster, tmp_path: Path
) -> None:
    process, stderr = start_cli(sim, cluster, tmp_path, "--slurm", "--drain-wait", "4")
    try:
        await until(lambda: settling(tmp_path / "logs"), "both hosts reached settle")
        with cluster.frozen():
            await interrupt_twice(process, stderr, tmp_path / "logs", signal.SIGTERM)  # systemd's, after SIGINT
            assert process.poll() is None
        document = await finish(process)
    finally:
        stop(process)
    said = stderr.read_text()
    bound = release_s(SLURM_COMMAND_TIMEOUT_S, POLL_S) + finish_s(SLURM_COMMAND_TIMEOUT_S)
    assert f"fleet: still releasing 2 Slurm nodes (up to {bound:g} s); again to abandon them drained" in said, said
    assert process.returncode == 130
    released_as_interrupted(document, cluster)



@pytest.mark.parametrize("sim", [{"linger_s": 60.0}], indirect=True)
async def test_a_third_interrupt_abandons_the_release_and_the_report_says_which_nodes_were_left(
    sim: SimFleet, cluster: SlurmCluster, tmp_path: Path
) -> None:
    process, stderr = start_cli(sim, cluster, tmp_path, "--slurm", "--drain-wait", "4")
    try:
        await until(lambda: settling(tmp_path / "logs"), "both hosts reached settle")
        with cluster.frozen():
            await interrupt_twice(process, stderr, tmp_path / "logs", signal.SIGINT)
            process.send_signal(signal.SIGINT)
            document = await finish(process)  # while slurmctld is still frozen: nothing waited for it
        run_id = document["run_id"]
    finally:
        stop(process)
    said = stderr.read_text()
    assert process.returncode == 130
    assert "fleet: stopped releasing 2 Slurm nodes: left them drained; writing the report" in said
    assert f"left drained at the third interrupt (reason 'fleet: run {run_id}'): sim[1-2]" in said
    for name in ("sim1", "sim2"):
        slurm = document["hosts"][name]["slurm"]
        assert slurm["abandoned"] is True and "release abandoned at the third interrupt" in slurm["error"]
        assert cluster.node_reason(name) == f"fleet: run {run_id}"
    assert (tmp_path / "logs" / run_id / SUMMARY).exists()


# --- 4. `--via srun`: the step gets the GPUs, whatever the environment says ----------------------------------


async def test_via_srun_the_step_holds_every_gpu_and_ignores_slurm_variables_in_the_environment(
    sim: SimFleet, cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fleet run from inside someone's allocation, with output-changing variables set: srun gets none of them."""
    job = cluster.submit_sleep("sim3", 600)
    for name, value in {"SLURM_LABELIO": "1", "SLURM_UNBUFFEREDIO": "1", "SLURM_JOB_ID": str(job),
                        "SLURM_JOBID": str(job), "SLURM_NNODES": "1"}.items():
        monkeypatch.setenv(name, value)
    hosts = select(load_inventory(sim.inventory_path), patterns=["sim1", "sim2"])
    options = RunOptions(scheduler=SchedulerOptions(name="slurm", drain_wait_s=4.0, fan_out=True))
    _, report = await run_and_report(hosts, options, as_json=False, log_dir=tmp_path / "logs")
    for name in ("sim1", "sim2"):
        assert report.hosts[name].status is HostStatus.CLEAN, report.hosts[name].error
        step = next(e for e in events(tmp_path, report, name) if e["event"] == "slurm_step")
        assert step["gpus"] == ",".join(str(g) for g in ALL) and step["job"] != str(job)
    assert cluster.job_state(job) == "RUNNING"
    assert cluster.reservations() == []


async def test_via_srun_nodes_whose_frames_cannot_be_read_are_kept_drained_before_the_reservation_goes(
    sim: SimFleet, cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SLURM_LABELIO let through (as an older fleet did): every line comes back `0: @fleet ...`, no node is heard
    from, and each is kept drained: it may have been touched. The drain (one update for all) comes before the
    reservation is removed, in slurmctld's own log."""
    monkeypatch.setattr("fleet.slurm.srun.KEPT_VARIABLES", frozenset({"SLURM_CONF", "SLURM_LABELIO"}))
    monkeypatch.setenv("SLURM_LABELIO", "1")
    hosts = select(load_inventory(sim.inventory_path), patterns=["sim1", "sim2"])
    options = RunOptions(scheduler=SchedulerOptions(name="slurm", drain_wait_s=4.0, fan_out=True))
    _, report = await run_and_report(hosts, options, as_json=False, log_dir=tmp_path / "logs")
    for name in ("sim1", "sim2"):
        host = report.hosts[name]
        assert host.status is HostStatus.FAILED and host.reason is Reason.NO_REPORT
        assert state(cluster, name) == "drained"
        assert cluster.node_reason(name).startswith(f"fleet: run {report.run_id}: no report from {name}")
    assert cluster.reservations() == []
    ctld = (cluster.log_dir / "slurmctld.log").read_text()
    drained = [i for i, line in enumerate(ctld.splitlines()) if "update_node: node sim1 reason set to" in line]
    removed = [i for i, line in enumerate(ctld.splitlines()) if f"fleet-{report.run_id}" in line and "delete" in line]
    assert drained and removed and max(drained) < min(removed), ctld[-3000:]


# --- 4. `--via srun`: a failed node is drained whatever state Slurm shows, Slurm's errors tried again ---


def around_cleanup(monkeypatch: pytest.MonkeyPatch, cluster: SlurmCluster,
                   cleanup: Callable[[SrunRun, Callable[[SrunRun], Any]], Any]) -> None:
    """Run `cleanup(srun, the real cleanup)` in place of `--via srun`'s cleanup, once the step's job is over."""
    real = SrunRun._cleanup

    async def instead(srun: SrunRun) -> None:
        await until(lambda: cluster.jobs() == [], "the step's job is over")
        await cleanup(srun, real)

    monkeypatch.setattr(SrunRun, "_cleanup", instead)


async def via_srun(sim: SimFleet, tmp_path: Path) -> Any:
    hosts = select(load_inventory(sim.inventory_path), patterns=["sim1", "sim4"])
    options = RunOptions(scheduler=SchedulerOptions(name="slurm", drain_wait_s=4.0, fan_out=True))
    return (await run_and_report(hosts, options, as_json=False, log_dir=tmp_path / "logs"))[1]


def drained_by_fleet(cluster: SlurmCluster, report: Any, theirs: str | None = None) -> None:
    """sim4 (Xid 79) failed and stays drained with fleet's reason and its error (after `theirs`, a reason someone
    else set), as its record says; sim1 back in service; no reservation left."""
    sim4 = report.hosts["sim4"]
    assert sim4.status is HostStatus.FAILED
    reason = cluster.node_reason("sim4")
    ours = failed_reason(report.run_id, sim4.error)
    assert reason == (ours if theirs is None else f"{theirs}; {ours}"[:200])
    assert sim4.scheduler is not None and sim4.scheduler.reason_after == reason and sim4.scheduler.error is None
    assert report.hosts["sim1"].status is HostStatus.CLEAN and state(cluster, "sim1") == "idle"
    assert cluster.reservations() == []


async def test_via_srun_a_failed_node_slurm_shows_down_after_the_step_ends_drained_with_fleets_reason(
    sim: SimFleet, cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the step ends, sim4's slurmd stops answering and Slurm shows it DOWN. The cleanup drains it with fleet's
    reason all the same, before the reservation goes: a DOWN node returns to service by itself (ReturnToService),
    a drained one never does. The reason Slurm showed is kept, fleet's after it."""
    slurmd = cluster.pids["slurmd sim4"]

    async def down_first(srun: SrunRun, cleanup: Callable[[SrunRun], Any]) -> None:
        await down_with_slurmd_stopped(cluster, "sim4", "Not responding")
        await cleanup(srun)

    around_cleanup(monkeypatch, cluster, down_first)
    try:
        report = await via_srun(sim, tmp_path)
        shown = cluster.run("scontrol", "show", "node", "sim4").stdout
    finally:
        os.kill(slurmd, signal.SIGCONT)
    drained_by_fleet(cluster, report, "Not responding")
    assert "State=DOWN+DRAIN" in shown, shown
    seen = [json.loads(line) for path in (tmp_path / "logs").glob("*/sim4.jsonl")
            for line in path.read_text().splitlines()]
    assert [e["state"].split("+")[0] for e in seen if e.get("event") == "slurm_release"] == ["DOWN"]


async def test_via_srun_a_cleanup_slurmctld_does_not_answer_at_first_is_tried_again(
    sim: SimFleet, cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slurmctld stopped as the cleanup begins: its first read times out (scontrol's MessageTimeout); once
    slurmctld runs again, the next try drains sim4, reads it back, and only then removes the reservation."""
    logs = tmp_path / "logs"

    async def frozen_first(srun: SrunRun, cleanup: Callable[[SrunRun], Any]) -> None:
        async with anyio.create_task_group() as group:
            with cluster.frozen():
                group.start_soon(cleanup, srun)
                await until(lambda: logged(logs, "sim4", "slurm_error", attempt=1), "the first try failed")

    around_cleanup(monkeypatch, cluster, frozen_first)
    report = await via_srun(sim, tmp_path)
    drained_by_fleet(cluster, report)
    assert logged(logs, "sim4", "slurm_release", action="keep_drained", attempt=2)
