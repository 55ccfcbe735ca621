"""Four busy simulated nodes under a real Slurm (the slurm_cluster fixture), a reset of them through fleet's
scheduler seam, and the CLI run as a process against them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from fleet.app.run import run_and_report
from fleet.engine.options import RunOptions, SchedulerOptions
from fleet.engine.walk import Mode
from fleet.inventory.load import load_inventory
from fleet.inventory.targeting import select
from fleet.model.report import HostReport, RunReport
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, UnitSpec, WorkerSpec
from fleet.sim.slurmcluster import SlurmCluster
from support.sim_fleet import ALL, FAST
from support.slurm import StartCluster
from support.waits import until

XID_79 = ((5, 79, "pid=2718, name=sglang, GPU has fallen off the bus."),)
NAMES = ("sim1", "sim2", "sim3", "sim4")


def spec(name: str, **kw: Any) -> NodeSpec:
    unit = UnitSpec(name="sglang.service", gpus=ALL, mib=30000, process_name="sglang")
    stray = WorkerSpec(gpus=(0,), mib=1523, name="python3")
    return NodeSpec(name=name, units=(unit,), workers=(stray,), **kw)


@pytest.fixture
async def sim(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[SimFleet]:
    """Four busy nodes; sim4's kernel log says GPU 5 fell off the bus (its reset ends failed). Parametrized
    indirectly, `linger_s` is how long the units' memory stays after they die, `settle_timeout` how long settle
    waits for it (FAST's otherwise)."""
    param = getattr(request, "param", {})
    linger = param.get("linger_s", 0.3)
    specs = [spec(n, xids=XID_79 if n == "sim4" else (), linger_s=linger) for n in NAMES]
    host_vars = {n: {**FAST, **{k: v for k, v in param.items() if k == "settle_timeout"}} for n in NAMES}
    async with SimFleet(tmp_path / "fleet", specs, host_vars=host_vars) as fleet:
        yield fleet


@pytest.fixture
def cluster(sim: SimFleet, slurm_cluster: StartCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """Slurm over the same nodes, each with `Gres=gpu:8` as a GPU cluster configures them; fleet's Slurm commands
    find it through SLURM_CONF, as on a login node."""
    started = slurm_cluster({n: sim.address(n) for n in NAMES},
                            task_env={n: {"PATH": node.env()["PATH"]} for n, node in sim.nodes.items()},
                            gpus=dict.fromkeys(NAMES, len(ALL)))
    monkeypatch.setenv("SLURM_CONF", started.env["SLURM_CONF"])
    return started


async def reset(sim: SimFleet, tmp_path: Path, *, drain_wait_s: float = 4.0, via_srun: bool = False,
                mode: Mode = Mode.RESET) -> RunReport:
    hosts = select(load_inventory(sim.inventory_path), groups=["sim"])
    slurm = SchedulerOptions(name="slurm", drain_wait_s=drain_wait_s, fan_out=via_srun)
    options = RunOptions(mode=mode, scheduler=slurm)
    _, report = await run_and_report(hosts, options, as_json=False, log_dir=tmp_path / "logs")
    return report


def events(tmp_path: Path, report: RunReport, host: str) -> list[dict[str, Any]]:
    path = tmp_path / "logs" / report.run_id / f"{host}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def slurm_of(host: HostReport) -> Any:
    assert host.scheduler is not None
    return host.scheduler


def state(cluster: SlurmCluster, node: str) -> str:
    """sinfo's state without the `*` (not responding) that a resumed node carries until slurmctld's next ping."""
    return cluster.node_state(node).rstrip("*")


def busy_mib(sim: SimFleet, name: str) -> int:
    return sum(m or 0 for m in sim.nodes[name].gpu_memory())


WAIT_S = 90.0


def logged(logs: Path, host: str, event: str, **fields: Any) -> bool:
    """Some run under `logs` logged `event` (with these fields) for host. The log is read while its run writes it:
    a line is read once it is whole (a long line reaches the file in more than one write)."""
    for path in logs.glob(f"*/{host}.jsonl"):
        for line in path.read_bytes().split(b"\n")[:-1]:
            record = json.loads(line)
            if record.get("event") == event and all(record.get(k) == v for k, v in fields.items()):
                return True
    return False


def start_cli(sim: SimFleet, cluster: SlurmCluster, tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], Path]:
    stderr = tmp_path / "stderr.txt"
    argv = [sys.executable, "-m", "fleet", "reset", "sim1", "sim2", "-y", "-i", str(sim.inventory_path),
            "--log-dir", str(tmp_path / "logs"), "--json", *args]
    with stderr.open("w") as err:
        process = subprocess.Popen(argv, env={**os.environ, **cluster.env}, stdout=subprocess.PIPE, stderr=err,
                                   text=True)
    return process, stderr


async def finish(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = await anyio.to_thread.run_sync(lambda: process.communicate(timeout=WAIT_S))
    return dict(json.loads(out))


def settling(logs: Path) -> bool:
    return all(logged(logs, n, "step_start", step="settle") for n in ("sim1", "sim2"))


def stop(process: subprocess.Popen[str]) -> None:
    """End the run by its pid if it still runs, and close its pipe (a test that failed before `finish` read it)."""
    if process.poll() is None:
        process.kill()
        process.wait()
    if process.stdout is not None:
        process.stdout.close()


def released_as_interrupted(document: dict[str, Any], cluster: SlurmCluster) -> None:
    """Both nodes released, left drained with fleet's reason for a run cut during settle; nothing abandoned."""
    for name in ("sim1", "sim2"):
        host = document["hosts"][name]
        assert host["reason"] == "interrupted" and not host["slurm"].get("abandoned")
        assert host["slurm"]["state_after"] == "IDLE+DRAIN"
        assert cluster.node_reason(name) == host["slurm"]["reason_after"]
        assert cluster.node_reason(name).endswith("interrupted during settle")


async def down_with_slurmd_stopped(cluster: SlurmCluster, node: str, reason: str) -> int:
    """An admin's DOWN on `node`, its slurmd stopped (SIGSTOP) so that ReturnToService does not bring it back at its
    next registration: once its slurmd has said its last word about the step's job (the node done completing: a
    message still on its way once the node is DOWN returns it to service), and until Slurm shows it DOWN for
    `reason`. The slurmd's pid, for the caller to SIGCONT."""
    slurmd = cluster.pids[f"slurmd {node}"]
    await until(lambda: "completing" not in cluster.node_state(node).lower(), f"{node} done completing its job")
    os.kill(slurmd, signal.SIGSTOP)
    await anyio.to_thread.run_sync(lambda: cluster.run("scontrol", "update", f"NodeName={node}", "State=DOWN",
                                                       f"Reason={reason}"))
    await until(lambda: "down" in cluster.node_state(node).lower() and cluster.node_reason(node) == reason,
                f"Slurm shows {node} DOWN ({reason})")
    return slurmd
