"""Blast-radius control against simulated nodes over SSH: who is left alive, why, and respawns.

Asserted on the nodes' own state (which processes still run, which units are up)
and on what the report and the per-node log say about them.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from support.job_cgroup import job_cgroup
from support.sim_fleet import FAST, busy, step

from fleet.engine.graph import run_hosts
from fleet.engine.options import RunOptions
from fleet.inventory.load import load_inventory
from fleet.inventory.targeting import select
from fleet.model.report import HostStatus, Reason, RunReport, StepName, StepStatus
from fleet.runlog.folder import RunLogs
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, SimNode, UnitSpec, WorkerSpec


@pytest.fixture
async def make_fleet(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[SimFleet]]]:
    """Start a simulated fleet; it is always torn down, every process it started ended."""
    fleets: list[SimFleet] = []

    async def start(specs: Sequence[NodeSpec], host_vars: Mapping[str, Mapping[str, Any]]) -> SimFleet:
        sim = SimFleet(tmp_path / f"sim{len(fleets)}", specs, host_vars=host_vars)
        await sim.__aenter__()
        fleets.append(sim)
        return sim

    yield start
    for sim in fleets:
        await sim.__aexit__(None, None, None)
        for node in sim.nodes.values():
            assert not [p for p in node.recorded_pids() if node.alive(p)], "teardown left a process alive"


async def reset(sim: SimFleet, tmp_path: Path, options: RunOptions | None = None) -> tuple[RunReport, Path]:
    """Reset every simulated node; the report and the run's log folder."""
    hosts = select(load_inventory(sim.inventory_path), groups=["sim"])
    run_id = f"run-{os.urandom(3).hex()}"
    logs = RunLogs(tmp_path / "logs", run_id)
    logs.create()
    try:
        report, _ = await run_hosts(hosts, options or RunOptions(), logs)
    finally:
        logs.close()
    return report, tmp_path / "logs" / run_id


def events(run_dir: Path, host: str, name: str) -> list[dict[str, Any]]:
    lines = (run_dir / f"{host}.jsonl").read_text().splitlines()
    return [e for e in (json.loads(line) for line in lines) if e["event"] == name]


def pids_named(node: SimNode, comm: str) -> list[int]:
    return [p for p in node.recorded_pids() if node.alive(p) and Path(f"/proc/{p}/comm").read_text().strip() == comm]


async def test_long_named_daemons_and_a_daemons_child_survive_and_are_named(make_fleet: Any, tmp_path: Path) -> None:
    """nvidia-persistenced and nv-fabricmanager (names longer than comm's 15 characters) and the helper
    nv-fabricmanager started are kept, each named with why; the busy unit and a stray are dealt with."""
    sim = await make_fleet([busy("gpu-b01")], {"gpu-b01": FAST})
    node = sim.nodes["gpu-b01"]
    helper = WorkerSpec(gpus=(2,), mib=0, name="fm-helper", compute=False)
    fabric = node.spawn_worker(WorkerSpec(gpus=(), mib=0, name="nv-fabricmanager", compute=False, child=helper))
    [child] = node.children_of(fabric)
    [persistenced] = pids_named(node, "nvidia-persiste")
    stray = node.spawn_worker(WorkerSpec(gpus=(0,), mib=1523))

    report, run_dir = await reset(sim, tmp_path)

    host = report.hosts["gpu-b01"]
    assert host.status is HostStatus.CLEAN, host.error
    assert all(node.alive(p) for p in (persistenced, fabric, child))
    assert not node.alive(stray)
    detail = step(host, StepName.KILL).detail
    assert f"pid {persistenced} nvidia-persistenced (protected name nvidia-persistenced)" in detail
    assert f"pid {fabric} nv-fabricmanager (protected name nv-fabricmanager)" in detail
    assert f"pid {child} fm-helper (child of nv-fabricmanager (pid {fabric}))" in detail
    kept = {e["pid"]: e["reason"] for e in events(run_dir, "gpu-b01", "kept")}
    assert kept[child] == f"child of nv-fabricmanager (pid {fabric})"
    assert kept[persistenced] == "protected name nvidia-persistenced"


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as another user needs root")
async def test_kill_users_leaves_another_users_process_alive_and_says_so(make_fleet: Any, tmp_path: Path) -> None:
    """With kill_users: [root], nobody's job is not touched: the kill names it, verify says the GPU is held."""
    me = pwd.getpwuid(os.geteuid()).pw_name
    host_vars = {**FAST, "kill_users": [me], "settle_timeout": 2}
    sim = await make_fleet([NodeSpec(name="gpu-h01", linger_s=0.2)], {"gpu-h01": host_vars})
    node = sim.nodes["gpu-h01"]
    theirs = node.spawn_worker(WorkerSpec(gpus=(3,), mib=700, user="nobody"))
    mine = node.spawn_worker(WorkerSpec(gpus=(0,), mib=900))

    report, run_dir = await reset(sim, tmp_path)

    host = report.hosts["gpu-h01"]
    assert node.alive(theirs) and not node.alive(mine)
    kill = step(host, StepName.KILL)
    assert kill.status is StepStatus.OK
    assert f"pid {theirs} python3 (user nobody not in kill_users)" in kill.detail
    assert [(k.pid, k.user) for k in host.killed] == [(mine, me)]
    assert host.status is HostStatus.FAILED
    assert (host.error or "").startswith(f"gpu 3 holds 700 MiB (pid {theirs} python3)")
    assert {e["pid"]: e["reason"] for e in events(run_dir, "gpu-h01", "kept")}[theirs] == (
        "user nobody not in kill_users")


@pytest.mark.parametrize("version", ["v2", "v1"])
async def test_a_process_in_a_slurm_jobs_cgroup_is_kept_and_named_with_its_job(
    make_fleet: Any, tmp_path: Path, version: str
) -> None:
    """A real cgroup laid out as Slurm lays out job 4711's extern step (where pam_slurm_adopt puts an ssh login
    to a node where the user has a job), and a real process holding a simulated GPU moved into it: no slurmstepd
    above it, yet the reset keeps it, names its job, and the node is not clean; the stray beside it is killed.
    The job's memory fails the host at once (`memory_held_by_job`), not after settle_timeout (30 s here)."""
    sim = await make_fleet([NodeSpec(name="gpu-j01", linger_s=0.2)], {"gpu-j01": {**FAST, "settle_timeout": 30}})
    node = sim.nodes["gpu-j01"]
    with job_cgroup(version) as cgroup:
        adopted = node.spawn_worker(WorkerSpec(gpus=(3,), mib=700))
        path = cgroup.move(adopted)
        stray = node.spawn_worker(WorkerSpec(gpus=(0,), mib=900))

        report, run_dir = await reset(sim, tmp_path)

        host = report.hosts["gpu-j01"]
        assert node.alive(adopted) and not node.alive(stray)
        reason = f"a Slurm job's process (job 4711, cgroup {path})"
        assert f"pid {adopted} python3 ({reason})" in step(host, StepName.KILL).detail
        assert [k.pid for k in host.killed] == [stray]
        assert (host.status, host.reason) == (HostStatus.FAILED, Reason.MEMORY_HELD_BY_JOB)
        assert (host.error or "").startswith(
            f"settle: gpu 3 holds 700 MiB: memory held by Slurm job 4711 (pid {adopted} python3); ")
        assert step(host, StepName.SETTLE).duration_s < 15
        assert {e["pid"]: e["reason"] for e in events(run_dir, "gpu-j01", "kept")}[adopted] == reason


async def test_memory_held_below_slurmstepd_fails_at_once_naming_the_job(make_fleet: Any, tmp_path: Path) -> None:
    """Without --slurm: a process below a slurmstepd holds GPUs 0 and 1; the reset keeps it and, right after
    settle's first poll, fails the host naming the job's slurmstepd, instead of waiting settle_timeout (30 s)."""
    sim = await make_fleet([busy("gpu-j02")], {"gpu-j02": {**FAST, "settle_timeout": 30}})
    node = sim.nodes["gpu-j02"]
    task = WorkerSpec(gpus=(0, 1), mib=30000, name="python3")
    stepd = node.spawn_worker(WorkerSpec(gpus=(), mib=0, name="slurmstepd", compute=False, child=task))
    [child] = node.children_of(stepd)

    report, _ = await reset(sim, tmp_path)

    host = report.hosts["gpu-j02"]
    assert node.alive(stepd) and node.alive(child)
    assert node.unit_state("sglang.service") == "inactive"
    assert (host.status, host.reason) == (HostStatus.FAILED, Reason.MEMORY_HELD_BY_JOB)
    error = host.error or ""  # gpu 0 holds the task's 30000 MiB, and sglang's while they are still coming back
    assert error.startswith("settle: gpu 0 holds ")
    assert error.endswith("; fleet never kills a job's processes: drain the node in Slurm first (--slurm waits for"
                          " its jobs)")
    assert f" MiB (+1 more): memory held by a Slurm job (slurmstepd pid {stepd}); " in error
    settle = step(host, StepName.SETTLE)
    assert settle.status is StepStatus.FAILED and settle.duration_s < 15


def rogue_node(name: str) -> NodeSpec:
    rogue = UnitSpec(name="trainer.service", gpus=(2, 3), mib=20000, process_name="python3", restart="always",
                     restart_sec=0.2)
    return NodeSpec(name=name, units=(rogue,), linger_s=0.2)


async def test_restart_always_unit_not_in_services_is_named_in_the_error(make_fleet: Any, tmp_path: Path) -> None:
    sim = await make_fleet([rogue_node("gpu-h01")], {"gpu-h01": {**FAST, "services": [], "settle_timeout": 4}})
    node = sim.nodes["gpu-h01"]
    first = node.unit_main_pid("trainer.service")

    report, _ = await reset(sim, tmp_path)

    host = report.hosts["gpu-h01"]
    back = node.unit_main_pid("trainer.service")
    assert back != first and node.alive(back)
    assert host.status is HostStatus.FAILED
    kill = step(host, StepName.KILL)
    assert kill.status is StepStatus.FAILED
    assert kill.error is not None and kill.error.startswith("respawned: pid ")
    assert kill.error.endswith(" python3 (trainer.service, Restart=always); add it to services")
    assert node.unit_state("trainer.service") == "active"


async def test_stop_units_stops_the_respawning_unit_and_the_node_ends_clean(
    make_fleet: Any, tmp_path: Path
) -> None:
    """--stop-units: the unit goes down through drain's path, the node is clean."""
    sim = await make_fleet([rogue_node("gpu-h01")], {"gpu-h01": {**FAST, "services": []}})
    node = sim.nodes["gpu-h01"]
    first = node.unit_main_pid("trainer.service")

    report, run_dir = await reset(sim, tmp_path, RunOptions(stop_units=True))

    host = report.hosts["gpu-h01"]
    assert host.status is HostStatus.CLEAN, host.error
    assert node.unit_state("trainer.service") == "inactive"
    assert node.gpu_memory() == [0] * 8
    assert not node.alive(first)
    assert "stopped units of respawned holders: trainer.service inactive" in step(host, StepName.KILL).detail
    assert events(run_dir, "gpu-h01", "stop_respawning_units")[0]["units"] == ["trainer.service"]


HARNESS = """
import os, subprocess, sys
device = os.open(sys.argv[1], os.O_RDONLY)  # this job holds a GPU, then resets its own node
done = subprocess.run([sys.executable, "-m", "fleet", *sys.argv[2:]], capture_output=True, text=True)
sys.stdout.write(done.stdout)
sys.stderr.write(done.stderr)
print(os.getpid(), file=sys.stderr)
sys.exit(done.returncode)
"""


async def test_the_job_that_runs_fleet_on_its_own_node_is_not_killed(
    make_fleet: Any, tmp_path: Path, run_local: Callable[[SimNode, Sequence[str]], Awaitable[tuple[str, str]]]
) -> None:
    """connection: local from a job holding the GPU: fleet's own session is kept, and says so."""
    sim = await make_fleet([NodeSpec(name="gpu-l01", linger_s=0.2)], {"gpu-l01": FAST})
    node = sim.nodes["gpu-l01"]
    stray = node.spawn_worker(WorkerSpec(gpus=(1,), mib=500))
    out, err = await run_local(node, [str(node.dev_dir / "nvidia0")])
    harness = int(err.strip().splitlines()[-1])
    host = json.loads(out)["hosts"]["gpu-l01"]
    assert host["status"] == "clean", host["error"]
    kill = next(s for s in host["steps"] if s["name"] == "kill")
    assert re.search(rf"kept .*pid {harness} [^ ]+ \(fleet's own session\)", kill["detail"]), kill["detail"]
    assert [k["pid"] for k in host["killed"]] == [stray]


@pytest.fixture
def run_local(tmp_path: Path) -> Callable[[SimNode, Sequence[str]], Awaitable[tuple[str, str]]]:
    """Run HARNESS against a one-host inventory with `connection: local` for the node; (stdout, stderr)."""

    async def run(node: SimNode, args: Sequence[str]) -> tuple[str, str]:
        inventory = tmp_path / "local.yaml"
        host = {"connection": "local", "devices": [node.devices_glob], "nvidia_smi": node.nvidia_smi_path,
                "gpus": node.spec.gpus, "lock_file": node.lock_file, "simulated": True, **FAST}
        inventory.write_text(yaml.safe_dump({"hosts": {node.spec.name: host}}))
        argv = [sys.executable, "-c", HARNESS, *args, "reset", "-i", str(inventory), node.spec.name, "-y", "--json",
                "--log-dir", str(tmp_path / "local-logs")]
        with anyio.fail_after(60):
            done = await anyio.run_process(argv, env=node.env(), check=False)
        return done.stdout.decode(), done.stderr.decode()

    return run
