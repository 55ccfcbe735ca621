"""The Slurm harness itself, against the real daemons (marker `slurm`): nodes come up idle, srun reaches
every node with that node's task environment, drain/resume and jobs work, and stop() leaves nothing.
Waits poll with generous bounds: the daemons answer within a second here, a loaded machine is slower."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.slurm import StartCluster, cmdline, environ, leftovers, live, loopback_nodes, port_free, slurmstepds

from fleet.sim import ports, slurmcluster
from fleet.sim.node import SimError
from fleet.sim.slurmcluster import SlurmCluster, SlurmClusterError, available

slurm = pytest.mark.slurm
WAIT_S = 30.0
# A value a careless TaskProlog (or shell) would mangle: quotes, $, backquotes, backslashes, spaces.
AWKWARD = """it's "quoted" $HOME `id` \\n \\ ; * """


def eventually(check: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout:g} s"
        time.sleep(0.05)


def sleepers(cluster: SlurmCluster, job_id: int) -> list[int]:
    """Live `sleep` processes of job_id (the task under its batch script)."""
    return [pid for pid in _tasks_of(cluster) if environ(pid).get("SLURM_JOB_ID") == str(job_id)
            and cmdline(pid)[:1] == ["sleep"]]


def _tasks_of(cluster: SlurmCluster) -> list[int]:
    return [pid for pid in cluster.processes() if live(pid)]


@slurm
def test_four_nodes_come_up_idle_and_answer_plain_slurm_clients(slurm_cluster: StartCluster) -> None:
    assert available() is None  # CI installs slurmctld slurmd slurm-client munge
    cluster = slurm_cluster(loopback_nodes(4))

    assert cluster.node_states() == dict.fromkeys(["sim1", "sim2", "sim3", "sim4"], "idle")
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %P %T"], env={**os.environ, **cluster.env},
                         capture_output=True, text=True, check=True, timeout=WAIT_S).stdout
    assert out.split("\n")[:4] == [f"sim{i} gpu* idle" for i in range(1, 5)]
    assert set(cluster.pids) == {"munged", "slurmctld", "slurmd sim1", "slurmd sim2", "slurmd sim3", "slurmd sim4"}
    for name, pid in cluster.pids.items():
        assert live(pid), name
        assert Path(os.readlink(f"/proc/{pid}/exe")).name.startswith(name.split()[0]), name
    addresses = cluster.run("scontrol", "show", "node").stdout
    for node, address in loopback_nodes(4).items():
        assert f"NodeName={node} " in addresses and f"NodeAddr={address} " in addresses


@slurm
def test_srun_reaches_every_node_and_each_task_gets_its_nodes_environment(
    slurm_cluster: StartCluster, tmp_path: Path
) -> None:
    nodes = loopback_nodes(4)
    task_env = {}
    for node in nodes:
        bin_dir = tmp_path / "nodes" / node / "bin"
        bin_dir.mkdir(parents=True)
        tool = bin_dir / "whichnode"
        tool.write_text(f"#!/bin/sh\necho {node}\n")
        tool.chmod(0o755)
        task_env[node] = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "AWKWARD": AWKWARD, "NODE_SAYS": node}
    cluster = slurm_cluster(nodes, task_env=task_env)

    script = 'printf "%s|%s|%s|%s|%s\\n" "$SLURMD_NODENAME" "$(whichnode)" "$NODE_SAYS" "$PATH" "$AWKWARD"'
    out = cluster.run("srun", "-N4", "-l", "bash", "-c", script).stdout
    rows = {}
    for line in out.splitlines():
        _rank, _, row = line.partition(": ")
        node, said, node_says, path_value, awkward = row.split("|")
        rows[node] = (said, node_says, path_value.split(":"), awkward)
    assert sorted(rows) == ["sim1", "sim2", "sim3", "sim4"]
    venv_bin = str(Path(sys.executable).parent)
    for node, (said, node_says, path, awkward) in rows.items():
        assert (said, node_says) == (node, node), node
        assert path[0] == str(tmp_path / "nodes" / node / "bin"), node
        assert venv_bin in path, node  # fleet's entry point of the running venv is found on the node
        assert awkward == AWKWARD, node


@slurm
def test_a_node_without_task_env_keeps_the_callers_path_plus_the_venv(slurm_cluster: StartCluster) -> None:
    cluster = slurm_cluster(loopback_nodes(1))
    path = cluster.run("srun", "-w", "sim1", "printenv", "PATH").stdout.strip().split(":")
    venv_bin = str(Path(sys.executable).parent)
    assert [p for p in path if p != venv_bin] == [p for p in os.environ["PATH"].split(":") if p != venv_bin]
    assert venv_bin in path


@slurm
def test_drain_and_resume_through_scontrol(slurm_cluster: StartCluster) -> None:
    cluster = slurm_cluster(loopback_nodes(4))

    cluster.drain("sim3", "bad DIMM")
    assert cluster.wait_node_state("sim3", "drained") == "drained"
    assert cluster.node_reason("sim3") == "bad DIMM"
    assert cluster.node_states() == {"sim1": "idle", "sim2": "idle", "sim3": "drained", "sim4": "idle"}
    ran_on = cluster.run("srun", "-N3", "-l", "printenv", "SLURMD_NODENAME").stdout.split()
    assert sorted(ran_on[1::2]) == ["sim1", "sim2", "sim4"]
    with pytest.raises(SlurmClusterError, match="Required node not available"):
        cluster.run("srun", "-w", "sim3", "--immediate=5", "true", timeout=WAIT_S + 30)

    cluster.resume("sim3")
    assert cluster.wait_node_state("sim3", "idle") == "idle"  # `idle*` until slurmctld pinged it
    assert cluster.node_reason("sim3") == ""
    assert cluster.run("srun", "-w", "sim3", "printenv", "SLURMD_NODENAME").stdout == "sim3\n"


@slurm
def test_a_sleep_job_runs_on_its_node_and_cancel_ends_it(slurm_cluster: StartCluster) -> None:
    cluster = slurm_cluster(loopback_nodes(3))

    job = cluster.submit_sleep("sim2", 600)
    assert cluster.job_state(job) == "RUNNING"
    assert cluster.run("squeue", "-h", "-j", str(job), "-o", "%N").stdout.strip() == "sim2"
    assert cluster.node_state("sim2") == "allocated"
    assert cluster.jobs() == [job]
    eventually(lambda: len(sleepers(cluster, job)) == 1, f"job {job}'s sleep runs")
    (sleeper,) = sleepers(cluster, job)
    assert environ(sleeper)["SLURMD_NODENAME"] == "sim2"

    cluster.cancel(job)
    assert cluster.job_state(job) == ""
    assert cluster.jobs() == []
    eventually(lambda: not live(sleeper), f"job {job}'s sleep ends")
    assert cluster.wait_node_state("sim2", "idle") == "idle"


@slurm
def test_a_maintenance_reservation_admits_only_its_own_steps(slurm_cluster: StartCluster) -> None:
    cluster = slurm_cluster(loopback_nodes(2))
    assert cluster.reservations() == []

    cluster.run("scontrol", "create", "reservation", "ReservationName=fleet-maint", "Nodes=sim2", "StartTime=now",
                "Duration=UNLIMITED", "Users=root", "Flags=MAINT,IGNORE_JOBS")
    assert cluster.reservations() == ["fleet-maint"]
    out = cluster.run("srun", "--reservation=fleet-maint", "-w", "sim2", "printenv", "SLURMD_NODENAME").stdout
    assert out == "sim2\n"
    with pytest.raises(SlurmClusterError, match="Required node not available"):
        cluster.run("srun", "-w", "sim2", "--immediate=5", "true", timeout=WAIT_S + 30)

    cluster.run("scontrol", "delete", "ReservationName=fleet-maint")
    assert cluster.reservations() == []


@slurm
def test_partitions_as_given_the_first_is_the_default(slurm_cluster: StartCluster) -> None:
    cluster = slurm_cluster(loopback_nodes(3), partitions={"batch": ["sim1", "sim2"], "debug": ["sim3"]})
    out = cluster.run("sinfo", "-h", "-o", "%P %N").stdout.split("\n")
    assert out[:2] == ["batch* sim[1-2]", "debug sim3"]
    assert sorted(cluster.run("srun", "-N2", "-l", "printenv", "SLURMD_NODENAME").stdout.split()[1::2]) == [
        "sim1", "sim2"]
    assert cluster.run("srun", "-p", "debug", "printenv", "SLURMD_NODENAME").stdout == "sim3\n"


@slurm
def test_stop_leaves_no_process_and_frees_every_port(slurm_cluster: StartCluster) -> None:
    cluster = slurm_cluster(loopback_nodes(4))
    cluster.submit_sleep("sim1")
    step = subprocess.Popen(["srun", "-w", "sim2", "sleep", "300"], env=cluster.client_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        eventually(lambda: len(cluster.jobs()) == 2 and len(slurmstepds(cluster)) >= 2, "both jobs run")
        daemons = dict(cluster.pids)
        steps = slurmstepds(cluster)
        tasks = _tasks_of(cluster)
        ports = [cluster.controller_port, *cluster.node_ports.values()]
        assert not any(port_free(port) for port in ports)  # the daemons listen there

        cluster.stop()

        assert leftovers(cluster) == []
        assert cluster.processes() == []
        gone = {**daemons, **{f"slurmstepd {pid}": pid for pid in steps}, **{f"task {pid}": pid for pid in tasks}}
        assert [name for name, pid in gone.items() if live(pid)] == []
        assert [port for port in ports if not port_free(port)] == []
        assert step.wait(timeout=WAIT_S) != 0  # the srun client learns its step was ended
        cluster.stop()  # idempotent
    finally:
        if step.poll() is None:
            step.kill()
        step.wait()


@slurm
def test_stop_kills_the_slurmstepds_even_when_slurmctld_is_gone(slurm_cluster: StartCluster) -> None:
    cluster = slurm_cluster(loopback_nodes(2))
    job = cluster.submit_sleep("sim1")
    eventually(lambda: len(sleepers(cluster, job)) == 1 and slurmstepds(cluster) != [], "the job's sleep runs")
    (sleeper,) = sleepers(cluster, job)
    steps = slurmstepds(cluster)
    os.kill(cluster.pids["slurmctld"], signal.SIGKILL)  # no scancel possible: stop() must find them itself
    eventually(lambda: not live(cluster.pids["slurmctld"]), "slurmctld is gone")

    cluster.stop()

    assert leftovers(cluster) == []
    assert [pid for pid in [sleeper, *steps] if live(pid)] == []


@slurm
def test_a_start_that_fails_stops_what_it_started_and_says_why(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ports.free_ports
    cluster = SlurmCluster(short_tmp / "slurm", loopback_nodes(3))
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        taken = held.getsockname()[1]
        monkeypatch.setattr(slurmcluster, "free_ports", lambda n: [*real(n)[:-1], taken])  # the last slurmd's
        try:
            with pytest.raises(SlurmClusterError, match=r"(?s)slurmd sim3 exited .*Address already in use"):
                cluster.start()
            assert set(cluster.pids) == {"munged", "slurmctld", "slurmd sim1", "slurmd sim2", "slurmd sim3"}
            assert leftovers(cluster) == []
            assert [name for name, pid in cluster.pids.items() if live(pid)] == []
        finally:
            cluster.stop()


def test_nodes_must_be_on_loopback_and_well_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a loopback address"):
        SlurmCluster(tmp_path, {"sim1": "10.0.0.1"})
    with pytest.raises(ValueError, match="not an IPv4 address"):
        SlurmCluster(tmp_path, {"sim1": "localhost"})
    with pytest.raises(ValueError, match="node name"):
        SlurmCluster(tmp_path, {"sim 1": "127.0.0.2"})
    with pytest.raises(ValueError, match="unknown nodes"):
        SlurmCluster(tmp_path, {"sim1": "127.0.0.2"}, partitions={"gpu": ["sim2"]})
    with pytest.raises(ValueError, match="newline"):
        SlurmCluster(tmp_path, {"sim1": "127.0.0.2"}, task_env={"sim1": {"X": "a\nb"}})
    with pytest.raises(ValueError, match="unknown node"):
        SlurmCluster(tmp_path, {"sim1": "127.0.0.2"}, task_env={"sim9": {"X": "1"}})
    with pytest.raises(ValueError, match="cannot be set"):
        SlurmCluster(tmp_path, {"sim1": "127.0.0.2"}, task_env={"sim1": {"BAD-NAME": "1"}})


def test_a_root_too_long_for_unix_sockets_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="too long for unix sockets"):
        SlurmCluster(tmp_path / ("x" * 80), {"sim1": "127.0.0.2"})


def test_its_errors_are_sim_errors() -> None:
    assert issubclass(SlurmClusterError, SimError)

