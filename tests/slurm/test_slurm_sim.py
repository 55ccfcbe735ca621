"""fleet with Slurm, for real: a real slurmctld and one slurmd per simulated node (`fleet.sim.slurmcluster`),
simulated GPU nodes behind SSH (`fleet.sim.fleetsim`), real jobs, real drains, real `srun`.

Each node is both: Slurm knows it as `simN` (its slurmd on its own port), fleet reaches it over SSH on
the same loopback address, and a task srun starts there finds that node's fake nvidia-smi first on PATH.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import anyio
import pytest
from support.deep_chain import CHAIN, lineage_of
from support.slurm import live
from support.slurm_fleet import NAMES, busy_mib, events, reset, slurm_of, state
from support.slurm_fleet import cluster as cluster  # the fixtures: four busy nodes, their Slurm
from support.slurm_fleet import sim as sim

from fleet.app.run import run_and_report
from fleet.engine.options import RunOptions, SchedulerOptions
from fleet.engine.walk import Mode
from fleet.inventory.load import load_inventory
from fleet.inventory.targeting import select
from fleet.model import uniformity
from fleet.model.fabric import FabricManager
from fleet.model.report import HostStatus, Reason, StepName
from fleet.report.render import to_document
from fleet.sim.fleetsim import SimFleet
from fleet.sim.slurmcluster import SlurmCluster
from fleet.slurm.policy import failed_reason
from fleet.slurm.variables import SlurmVariables

# --- SSH fan-out, drained and resumed through Slurm --------------------------------------------------


async def test_drain_wait_reset_resume_around_jobs_and_admins(sim: SimFleet, cluster: SlurmCluster,
                                                              tmp_path: Path) -> None:
    """sim1 clean and resumed; sim2 runs a job past --drain-wait: skipped, untouched, back in service as it
    was; sim3 drained by an admin: skipped, never reset, left drained with the admin's reason; sim4 fails its
    health gate: left drained with fleet's reason and the error."""
    job = cluster.submit_sleep("sim2", 600)
    cluster.drain("sim3", "bad DIMM")
    sim2_before = busy_mib(sim, "sim2")
    report = await reset(sim, tmp_path, drain_wait_s=4)
    hosts = report.hosts
    assert hosts["sim1"].status is HostStatus.CLEAN
    assert state(cluster, "sim1") == "idle" and cluster.node_reason("sim1") in ("", "none")
    assert slurm_of(hosts["sim1"]).state_before == "IDLE"
    assert (slurm_of(hosts["sim1"]).state_after or "").split("+")[0] == "IDLE"  # +NOT_RESPONDING a moment after

    sim2 = hosts["sim2"]
    assert sim2.status is HostStatus.SKIPPED and f"job {job} still running on sim2" in (sim2.error or "")
    assert sim2.reason is Reason.JOBS_RUNNING
    assert cluster.job_state(job) == "RUNNING" and state(cluster, "sim2") == "allocated"
    assert busy_mib(sim, "sim2") == sim2_before  # never touched
    assert slurm_of(sim2).jobs == (str(job),) and (slurm_of(sim2).state_after or "").split("+")[0] == "ALLOCATED"

    assert hosts["sim3"].status is HostStatus.SKIPPED and hosts["sim3"].reason is Reason.SLURM
    assert "out of service by someone else: not reset" in (hosts["sim3"].error or "")
    assert busy_mib(sim, "sim3") > 0
    assert state(cluster, "sim3") == "drained" and cluster.node_reason("sim3") == "bad DIMM"
    assert slurm_of(hosts["sim3"]).reason_before == "bad DIMM" == slurm_of(hosts["sim3"]).reason_after

    sim4 = hosts["sim4"]
    assert sim4.status is HostStatus.FAILED and "Xid 79" in (sim4.error or "")
    assert state(cluster, "sim4") == "drained"
    assert cluster.node_reason("sim4").startswith(f"fleet: run {report.run_id}: ")
    assert "Xid 79" in cluster.node_reason("sim4")

    document = to_document(report)["hosts"]["sim4"]["slurm"]
    assert set(document) == {"node", "state_before", "reason_before", "state_after", "reason_after", "jobs",
                             "waited_s"}
    assert 0 <= document["waited_s"] < 4  # no job there: the wait ended at the first look
    assert document["state_after"] == "IDLE+DRAIN" and document["reason_after"].startswith("fleet: run ")


async def test_a_job_that_ends_during_the_wait_is_waited_for(sim: SimFleet, cluster: SlurmCluster,
                                                             tmp_path: Path) -> None:
    job = cluster.submit_sleep("sim1", 4)
    report = await reset(sim, tmp_path, drain_wait_s=60)
    assert report.hosts["sim1"].status is HostStatus.CLEAN
    log = events(tmp_path, report, "sim1")
    waited = next(e for e in log if e["event"] == "slurm_drained")
    assert waited["waited_s"] > 0.5
    assert next(e for e in log if e["event"] == "slurm_wait")["jobs"] == [str(job)]
    assert state(cluster, "sim1") == "idle"


async def test_a_node_an_earlier_run_failed_is_taken_over_and_resumed_when_clean(
    sim: SimFleet, cluster: SlurmCluster, tmp_path: Path
) -> None:
    cluster.drain("sim1", "fleet: run 20261201T000000Z-aaaaaa: memory_held on GPU 0")
    cluster.drain("sim2", "fleet: run 20261203T000000Z-bbbbbb")  # another run, in flight: not ours to take
    report = await reset(sim, tmp_path)
    assert report.hosts["sim1"].status is HostStatus.CLEAN and state(cluster, "sim1") == "idle"
    assert state(cluster, "sim2") == "drained"
    assert cluster.node_reason("sim2") == "fleet: run 20261203T000000Z-bbbbbb"


async def test_dry_run_says_what_would_happen_and_changes_nothing(sim: SimFleet, cluster: SlurmCluster,
                                                                  tmp_path: Path) -> None:
    job = cluster.submit_sleep("sim2", 600)
    cluster.drain("sim3", "bad DIMM")
    before = cluster.node_states()
    report = await reset(sim, tmp_path, mode=Mode.PLAN)
    assert {n: h.status for n, h in report.hosts.items()} == {
        **dict.fromkeys(("sim1", "sim2", "sim4"), HostStatus.PLANNED), "sim3": HostStatus.SKIPPED}
    assert "would drain, reset" in (slurm_of(report.hosts["sim1"]).plan or "")
    assert f"for job {job}" in (slurm_of(report.hosts["sim2"]).plan or "")
    assert "bad DIMM, by root): out of service by someone else: would skip it" in (
        slurm_of(report.hosts["sim3"]).plan or "")
    assert cluster.node_states() == before and cluster.job_state(job) == "RUNNING"
    assert busy_mib(sim, "sim1") > 0


async def test_a_jobs_process_holding_a_gpu_is_never_killed(sim: SimFleet, cluster: SlurmCluster,
                                                             tmp_path: Path) -> None:
    """Without --slurm too: slurmstepd and what descends from it are protected in any mode."""
    device = sim.nodes["sim1"].dev_dir / "nvidia0"
    holder = f"import time; f = open({str(device)!r}); time.sleep(600)"
    output = tmp_path / "job.out"
    out = cluster.run("sbatch", "--parsable", "-w", "sim1", "-o", str(output),
                      "--wrap", f"exec {sys.executable} -c {holder!r}").stdout
    job = int(out.strip().split(";")[0])
    for _ in range(300):  # until the job's own python holds the device
        if set(job_pids(job)) & set(opened_by(device)):
            break
        await anyio.sleep(0.1)
    else:
        pytest.fail(f"job {job} never opened {device}: {cluster.job_state(job)}, "
                    f"{output.read_text() if output.exists() else 'no output'}")
    hosts = select(load_inventory(sim.inventory_path), patterns=["sim1"])
    _, report = await run_and_report(hosts, RunOptions(), as_json=False, log_dir=tmp_path / "logs")
    kill = next(s for s in report.hosts["sim1"].steps if s.name is StepName.KILL)
    assert "a Slurm job's process (slurmstepd pid" in kill.detail
    assert cluster.job_state(job) == "RUNNING"


async def test_a_jobs_process_twelve_levels_below_slurmstepd_is_never_killed(sim: SimFleet, cluster: SlurmCluster,
                                                                              tmp_path: Path) -> None:
    """Container, conda, torchrun and DataLoader nesting put a job's GPU process 9 and more levels below
    slurmstepd: a reset without --slurm once looked 8 parents up, SIGTERMed it (the job ended FAILED) and called
    the host clean. Here every level is a process of its own (a fork chain: no shell to exec a level away) and
    the device holder runs 12 levels below slurmstepd: it is kept, named as the job's, and the job runs on."""
    device = sim.nodes["sim1"].dev_dir / "nvidia0"
    output = tmp_path / "deep.out"
    out = cluster.run("sbatch", "--parsable", "-w", "sim1", "-o", str(output), "--wrap",
                      f"exec {sys.executable} -c {shlex.quote(CHAIN)} 11 {device}").stdout
    job = int(out.strip().split(";")[0])
    leaf = None
    try:
        leaf = await deep_holder(cluster, job, output, device)
        levels = lineage_of(leaf, 1)
        stepd = next(p for p in levels if comm_of(p) == "slurmstepd")
        assert levels.index(stepd) + 1 == 12  # slurmstepd is the holder's 12th ancestor

        hosts = select(load_inventory(sim.inventory_path), patterns=["sim1"])
        _, report = await run_and_report(hosts, RunOptions(), as_json=False, log_dir=tmp_path / "logs")

        kill = next(s for s in report.hosts["sim1"].steps if s.name is StepName.KILL)
        assert f"pid {leaf} {comm_of(leaf)} (a Slurm job's process (slurmstepd pid {stepd}))" in kill.detail
        assert leaf not in [k.pid for k in report.hosts["sim1"].killed]
        assert live(leaf) and cluster.job_state(job) == "RUNNING"
    finally:
        cluster.cancel(job)
        if leaf is not None and live(leaf):
            os.kill(leaf, signal.SIGKILL)


async def deep_holder(cluster: SlurmCluster, job: int, output: Path, device: Path) -> int:
    """The pid the job's deepest process printed, once it holds the device."""
    for _ in range(300):
        printed = first_word(output)
        if printed is not None and printed in opened_by(device):
            return printed
        await anyio.sleep(0.1)
    pytest.fail(f"job {job} never opened {device}: {cluster.job_state(job)}, output {first_word(output)}")


def first_word(path: Path) -> int | None:
    words = path.read_text().split() if path.exists() else []
    return int(words[0]) if words else None


def comm_of(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


# --- the command line: targets from Slurm, and no inventory ------------------------------------------


def opened_by(path: Path) -> list[int]:
    """Pids with path open (a /proc scan, as fuser does)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if any(os.readlink(fd) == str(path) for fd in (proc / "fd").iterdir()):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def job_pids(job: int) -> list[int]:
    """Pids of a Slurm job's processes (their environment names the job)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                environ = (proc / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"SLURM_JOB_ID={job}".encode() in environ:
                found.append(int(proc.name))
    return found


async def gone(cluster: SlurmCluster, prefix: str, within: float = 30.0) -> bool:
    """No job whose name starts with prefix is left (a cancelled job shows COMPLETING for a moment)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not [j for j in cluster.run("squeue", "-h", "-o", "%j").stdout.split() if j.startswith(prefix)]:
            return True
        await anyio.sleep(0.3)
    return False


def fleet_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleet", *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


async def test_partition_targets_its_nodes_and_w_reaches_hosts_no_inventory_lists(
    sim: SimFleet, cluster: SlurmCluster, tmp_path: Path
) -> None:
    env = {**os.environ, **cluster.env}
    out = await anyio.to_thread.run_sync(lambda: fleet_cli(
        "reset", "--dry-run", "--slurm", "--partition", "gpu", "-i", str(sim.inventory_path), "--json",
        "--log-dir", str(tmp_path / "logs"), env=env))
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    assert sorted(document["hosts"]) == list(NAMES)
    assert all(h["slurm"]["state_before"] == "IDLE" for h in document["hosts"].values())

    out = await anyio.to_thread.run_sync(lambda: fleet_cli(
        "reset", "--dry-run", "--partition", "gpu", "-i", str(sim.inventory_path), env=env))
    assert out.returncode == 2 and "--partition needs --slurm" in out.stderr

    out = await anyio.to_thread.run_sync(lambda: fleet_cli(
        "reset", "--dry-run", "--slurm", "--partition", "nope", "-i", str(sim.inventory_path), env=env))
    assert out.returncode == 2 and "--partition nope" in out.stderr


# --- --via srun: one job step, each node resets itself ----------------------------------------------


async def test_via_srun_resets_through_a_real_job_step(sim: SimFleet, cluster: SlurmCluster,
                                                       tmp_path: Path) -> None:
    job = cluster.submit_sleep("sim2", 600)
    cluster.drain("sim3", "bad DIMM")
    report = await reset(sim, tmp_path, drain_wait_s=3, via_srun=True)
    hosts = report.hosts
    assert hosts["sim1"].status is HostStatus.CLEAN and busy_mib(sim, "sim1") == 0
    assert [s.status.value for s in hosts["sim1"].steps] == ["ok", "ok", "ok", "ok"]
    assert hosts["sim1"].memory_before_mib is not None and hosts["sim1"].memory_before_mib[0] == 30000 + 1523
    assert {k.name for k in hosts["sim1"].killed} >= {"python3"}
    assert [k.why for k in hosts["sim1"].kept] == ["protected name nvidia-persistenced"]  # relayed as data
    assert (uniformity.host_settings(hosts["sim1"]) or {}).get("gpus") == "8"  # the GPUs' settings relayed
    assert hosts["sim1"].fabric_manager == FabricManager.absent()  # its fabric manager (none) relayed too
    assert hosts["sim2"].status is HostStatus.SKIPPED and f"job {job}" in (hosts["sim2"].error or "")
    # the step began once sim2's wait ran out: every node that took part waited that long (report.html's bar)
    assert (slurm_of(hosts["sim1"]).waited_s or 0) >= 3 and slurm_of(hosts["sim2"]).waited_s is not None
    assert hosts["sim3"].status is HostStatus.SKIPPED and "bad DIMM" in (hosts["sim3"].error or "")
    assert hosts["sim3"].reason is Reason.SLURM and hosts["sim4"].reason is Reason.HEALTH
    assert hosts["sim4"].status is HostStatus.FAILED and "Xid 79" in (hosts["sim4"].error or "")
    assert cluster.reservations() == []
    assert state(cluster, "sim1") == "idle" and state(cluster, "sim3") == "drained"
    assert cluster.node_reason("sim4").startswith(f"fleet: run {report.run_id}: ")
    assert cluster.job_state(job) == "RUNNING" and state(cluster, "sim2") == "allocated"
    relayed = [e["event"] for e in events(tmp_path, report, "sim1")]
    assert "slurm_reserved" in relayed and relayed.count("step_end") == 4 and "command" in relayed


async def test_via_srun_refuses_a_node_of_another_fleet_version(sim: SimFleet, cluster: SlurmCluster,
                                                                tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fleet.slurm.srun.__version__", "0.0.0-other")
    report = await reset(sim, tmp_path, via_srun=True)
    sim1 = report.hosts["sim1"]
    assert sim1.status is HostStatus.FAILED and "the controller's is 0.0.0-other" in (sim1.error or "")
    assert sim1.reason is Reason.VERSION
    assert busy_mib(sim, "sim1") > 0  # nothing touched
    assert state(cluster, "sim1") == "idle"  # and not drained for it
    assert cluster.reservations() == []


# settle still waits when the signal comes, however loaded the machine: the memory lingers past settle's window,
# and the window is longer than the relay of the log line the test waits for can lag
@pytest.mark.parametrize("sim", [{"linger_s": 120.0, "settle_timeout": 90}], indirect=True)
@pytest.mark.parametrize(("cut", "code"), [(signal.SIGINT, 130), (signal.SIGHUP, 129)])
async def test_via_srun_interrupted_removes_the_reservation(sim: SimFleet, cluster: SlurmCluster, tmp_path: Path,
                                                            cut: signal.Signals, code: int) -> None:
    """Ctrl-C (or the terminal hung up) while the step runs: the step's job is cancelled (each node's fleet ends
    its commands and reports), the reservation removed, the interrupted nodes left drained, the report written."""
    env = {**os.environ, **cluster.env}
    argv = [sys.executable, "-m", "fleet", "reset", "--via", "srun", "-y", "-i", str(sim.inventory_path),
            "--group", "sim", "--log-dir", str(tmp_path / "logs"), "--json"]
    process = await anyio.to_thread.run_sync(
        lambda: subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any('"step": "settle"' in p.read_text() for p in (tmp_path / "logs").glob("*/sim1.jsonl")):
                break
            await anyio.sleep(0.2)
        else:
            pytest.fail("the step never reached settle")
        process.send_signal(cut)
        out, err = await anyio.to_thread.run_sync(lambda: process.communicate(timeout=120))
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=30)  # reaped, its pipes closed
    assert process.returncode == code, err
    assert cluster.reservations() == []
    assert await gone(cluster, "fleet-"), "the step's job outlived the run"
    document = json.loads(out)
    assert set(document["hosts"]) == set(NAMES)
    sim1 = document["hosts"]["sim1"]
    # interrupted in settle, or in verify: Slurm's signal to the step can reach a settle look's nvidia-smi before
    # the node's fleet, which ends settle ("ended by a signal") and begins verify before its own cut
    during = re.fullmatch(r"interrupted during (settle|verify)", sim1["error"])
    assert sim1["status"] == "failed" and during is not None, sim1["error"]
    assert sim1["reason"] == "interrupted"
    assert state(cluster, "sim1") == "drained" and sim1["error"] in cluster.node_reason("sim1")


async def test_check_reads_slurm_and_changes_nothing(sim: SimFleet, cluster: SlurmCluster, tmp_path: Path) -> None:
    cluster.drain("sim3", "bad DIMM")
    before = cluster.node_states()
    report = await reset(sim, tmp_path, mode=Mode.CHECK)
    assert cluster.node_states() == before
    assert slurm_of(report.hosts["sim3"]).reason_before == "bad DIMM" == slurm_of(report.hosts["sim3"]).reason_after
    assert slurm_of(report.hosts["sim1"]).state_before == "IDLE"


# settle still waits at the deadline, however loaded the machine: the memory lingers past the deadline, and settle
# waits longer still; the deadline leaves drain and kill room to end before it
@pytest.mark.parametrize("sim", [{"linger_s": 90.0, "settle_timeout": 60}], indirect=True)
async def test_a_run_cut_short_leaves_touched_nodes_drained_and_says_why(sim: SimFleet, cluster: SlurmCluster,
                                                                         tmp_path: Path) -> None:
    hosts = select(load_inventory(sim.inventory_path), groups=["sim"])
    options = RunOptions(deadline_s=25.0, scheduler=SchedulerOptions(name="slurm", drain_wait_s=4.0))
    _, report = await run_and_report(hosts, options, as_json=False, log_dir=tmp_path / "logs")
    sim1 = report.hosts["sim1"]
    assert sim1.status is HostStatus.FAILED and "run deadline of 25 s reached during settle" in (sim1.error or "")
    assert state(cluster, "sim1") == "drained"
    assert cluster.node_reason("sim1") == f"fleet: run {report.run_id}: run deadline of 25 s reached during settle"


async def test_a_node_slurm_does_not_know_fails_untouched_and_the_others_go_on(
    sim: SimFleet, cluster: SlurmCluster, tmp_path: Path
) -> None:
    hosts = select(load_inventory(sim.inventory_path), groups=["sim"])
    hosts[0] = replace(hosts[0], plug_variables=(("slurm", SlurmVariables(node="ghost")),))
    options = RunOptions(scheduler=SchedulerOptions(name="slurm", drain_wait_s=4.0))
    _, report = await run_and_report(hosts, options, as_json=False, log_dir=tmp_path / "logs")
    sim1 = report.hosts["sim1"]
    assert sim1.status is HostStatus.FAILED and "Slurm has no node ghost" in (sim1.error or "")
    assert sim1.reason is Reason.SLURM
    assert busy_mib(sim, "sim1") > 0 and state(cluster, "sim1") == "idle"
    assert report.hosts["sim2"].status is HostStatus.CLEAN


async def test_drain_wait_zero_resets_idle_nodes_and_skips_busy_ones_at_once(
    sim: SimFleet, cluster: SlurmCluster, tmp_path: Path
) -> None:
    job = cluster.submit_sleep("sim2", 600)
    report = await reset(sim, tmp_path, drain_wait_s=0)
    assert report.hosts["sim1"].status is HostStatus.CLEAN and state(cluster, "sim1") == "idle"
    assert report.hosts["sim2"].status is HostStatus.SKIPPED and f"job {job}" in (report.hosts["sim2"].error or "")
    assert state(cluster, "sim2") == "allocated"


async def test_via_srun_a_node_that_sends_no_report_fails_no_report_and_stays_drained(
    sim: SimFleet, cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fleet not installed on the nodes: the task cannot run it, no node says anything. Nothing proves a node was
    left as it was, so each stays out of service, with fleet's reason saying why."""
    monkeypatch.setattr("fleet.slurm.srun.NODE_COMMAND", ("fleet-not-installed", "node-run"))
    report = await reset(sim, tmp_path, via_srun=True)
    sim1 = report.hosts["sim1"]
    assert sim1.status is HostStatus.FAILED and sim1.reason is Reason.NO_REPORT
    assert "no report from sim1" in (sim1.error or "") and busy_mib(sim, "sim1") > 0
    assert state(cluster, "sim1") == "drained" and cluster.node_reason("sim1") == failed_reason(report.run_id,
                                                                                               sim1.error)
    assert cluster.reservations() == []
