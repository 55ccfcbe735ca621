"""A node fleet could not prove clean never goes back into service, whatever srun, slurmctld or an admin does
meanwhile, on a real Slurm (a slurmctld, a slurmd per simulated node, `Gres=gpu:8`): srun SIGKILLed before its
first frame, slurmctld SIGKILLed before it saved fleet's drain and started again, an admin's FAIL and DOWN. (A
`scontrol show node` that hangs twice at the release: test_slurm_faults.py.) The same four busy simulated nodes as
test_slurm_sim.py; sim4's kernel log holds an Xid 79, so its reset fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from support.processes import comm, descendants
from support.slurm_fleet import NAMES, busy_mib, down_with_slurmd_stopped, logged, reset, slurm_of, state
from support.slurm_fleet import cluster as cluster  # the fixtures: four busy nodes, their Slurm
from support.slurm_fleet import sim as sim
from support.waits import until

from fleet.engine.walk import Mode
from fleet.model.report import HostStatus, Reason, RunReport
from fleet.sim.fleetsim import SimFleet
from fleet.sim.slurmcluster import SlurmCluster
from fleet.slurm.policy import failed_reason
from fleet.slurm.srun import SrunRun

BUSY = ("sim1", "sim2", "sim3")


def srun_argv(sim: SimFleet, logs: Path) -> list[str]:
    return [sys.executable, "-m", "fleet", "reset", "--via", "srun", "-y", "-i", str(sim.inventory_path), "--group",
            "sim", "--log-dir", str(logs), "--json"]


# --- srun killed before its first frame ---------------------------------------------------------------------


async def test_a_srun_killed_before_any_frame_leaves_every_node_drained_and_its_job_gone(
        sim: SimFleet, cluster: SlurmCluster, tmp_path: Path) -> None:
    """srun SIGKILLed as soon as it runs: no node said anything, and each may have been reset all the same (the
    step lives on without srun). The step's job is cancelled by its id and seen gone, every node is drained with
    fleet's reason before the reservation goes, and the reservation is removed."""
    logs = tmp_path / "logs"
    process = await anyio.to_thread.run_sync(lambda: subprocess.Popen(
        srun_argv(sim, logs), env={**os.environ, **cluster.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True))
    try:
        found: list[int] = []

        def srun_started() -> bool:
            found[:] = [pid for pid in descendants(process.pid) if comm(pid) == "srun"]
            return bool(found)

        await until(srun_started, "srun started", 60)
        os.kill(found[0], signal.SIGKILL)
        out, err = await anyio.to_thread.run_sync(lambda: process.communicate(timeout=300))
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 1, err
    hosts = json.loads(out)["hosts"]
    for name in NAMES:
        assert hosts[name]["status"] == "failed" and hosts[name]["reason"] == "no_report", hosts[name]
        assert state(cluster, name) == "drained", name
        assert cluster.node_reason(name).startswith(f"fleet: run {json.loads(out)['run_id']}: no report")
        assert hosts[name]["slurm"]["state_after"] == "IDLE+DRAIN"
    assert cluster.reservations() == []
    assert cluster.jobs() == []


# --- slurmctld forgot fleet's drain -------------------------------------------------------------------------


async def test_a_failed_node_whose_drain_slurmctld_lost_is_drained_again(
        sim: SimFleet, cluster: SlurmCluster, tmp_path: Path) -> None:
    """`--slurm`: slurmctld is SIGKILLed once every node is drained and reset, before it saved the drains, and
    started again: it shows the nodes in service, no reason. The release drains sim4, which fleet failed, with
    fleet's reason, read back; the nodes fleet proved clean are left as Slurm shows them."""
    logs = tmp_path / "logs"
    await anyio.to_thread.run_sync(cluster.save_point)
    outcome: dict[str, RunReport] = {}

    async def run() -> None:
        outcome["report"] = await reset(sim, tmp_path)

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        await until(lambda: all(logged(logs, n, "step_start", step="kill") for n in NAMES), "every node in its reset")
        await anyio.to_thread.run_sync(lambda: cluster.crash_controller(unsaved_since_save_point=True))
        await anyio.to_thread.run_sync(cluster.start_controller)
    report = outcome["report"]
    sim4 = report.hosts["sim4"]
    assert sim4.status is HostStatus.FAILED
    assert state(cluster, "sim4") == "drained"
    assert cluster.node_reason("sim4") == failed_reason(report.run_id, sim4.error)
    assert slurm_of(sim4).state_after == "IDLE+DRAIN" and slurm_of(sim4).error is None
    for name in BUSY:
        assert report.hosts[name].status is HostStatus.CLEAN and state(cluster, name) == "idle"


# --- an admin's FAIL --------------------------------------------------------------------------------------------


async def test_a_node_an_admin_failed_is_skipped_its_state_and_reason_untouched(
        sim: SimFleet, cluster: SlurmCluster, tmp_path: Path) -> None:
    """An admin set sim3 FAIL ("bad DIMM"): the dry run says it would skip it, `--slurm` skips it (never reset,
    never drained, never resumed), `--via srun` leaves it out of the step; its state and reason stay the admin's."""
    await anyio.to_thread.run_sync(lambda: cluster.run("scontrol", "update", "NodeName=sim3", "State=FAIL",
                                                       "Reason=bad DIMM"))
    failed = cluster.node_state("sim3")
    plan = await reset(sim, tmp_path, mode=Mode.PLAN)
    assert slurm_of(plan.hosts["sim3"]).plan == ("slurm IDLE+FAIL (bad DIMM, by root): out of service by someone"
                                                 " else: would skip it, its state and reason left as they are")
    assert plan.hosts["sim3"].status is HostStatus.SKIPPED
    for via_srun in (False, True):
        report = await reset(sim, tmp_path, via_srun=via_srun)
        sim3 = report.hosts["sim3"]
        assert sim3.status is HostStatus.SKIPPED and sim3.reason is Reason.SLURM, sim3.error
        assert "IDLE+FAIL (bad DIMM, by root)" in (sim3.error or "")
        assert busy_mib(sim, "sim3") > 0  # never reset
        assert cluster.node_state("sim3") == failed and cluster.node_reason("sim3") == "bad DIMM"
        assert report.hosts["sim1"].status is HostStatus.CLEAN


# --- an admin's DOWN set during the step ------------------------------------------------------------------------


async def test_an_admins_down_reason_set_during_the_step_is_kept(
        sim: SimFleet, cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As the step ends, an admin sets sim4 (which the step failed) DOWN, "bad DIMM" (its slurmd stopped, so that
    ReturnToService does not bring it back at its next registration): the cleanup drains it, and its reason keeps
    the admin's first, fleet's after it; the next run leaves it alone."""
    real = SrunRun._cleanup
    slurmd = cluster.pids["slurmd sim4"]

    async def admin_first(srun: SrunRun) -> None:
        await until(lambda: cluster.jobs() == [], "the step's job is over")
        await down_with_slurmd_stopped(cluster, "sim4", "bad DIMM")
        await real(srun)

    monkeypatch.setattr(SrunRun, "_cleanup", admin_first)
    try:
        report = await reset(sim, tmp_path, via_srun=True)
        reason = cluster.node_reason("sim4")
        shown = cluster.run("scontrol", "show", "node", "sim4").stdout
    finally:
        os.kill(slurmd, signal.SIGCONT)
    sim4 = report.hosts["sim4"]
    assert sim4.status is HostStatus.FAILED
    assert reason == f"bad DIMM; {failed_reason(report.run_id, sim4.error)}"[:200]
    assert "State=DOWN+DRAIN" in shown, shown
    assert slurm_of(sim4).reason_after == reason and (slurm_of(sim4).state_after or "").startswith("DOWN+DRAIN")
    assert cluster.reservations() == []
    monkeypatch.setattr(SrunRun, "_cleanup", real)
    again = await reset(sim, tmp_path, drain_wait_s=0)
    assert again.hosts["sim4"].status is HostStatus.SKIPPED and cluster.node_reason("sim4") == reason
