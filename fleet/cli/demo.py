"""`fleet demo`: a busy simulated fleet on loopback, reset end to end through the real code path.

One node is unhealthy on purpose (a GPU fell off the bus), and one runs an older driver than the rest: the demo
exits 0 when the run ended as planned (every other node clean, the sick one failed by its health gate, the older
driver's node named the odd one out in the summary's `settings:` line, by its driver and its fabric manager), 1
otherwise.

Each simulated node is served by its own SSH server on its own loopback address
with its own host key; fleet reaches it exactly as it reaches a real node
(inventory -> asyncssh with host-key checking -> real commands). Everything the
demo starts is ended by its recorded pid and its folder removed, even on Ctrl-C.

`fleet demo --slurm` puts a real Slurm cluster over the same nodes (slurmctld and a
slurmd per node, `fleet.sim.slurmcluster`), a job that outlives --drain-wait on one
node and an admin's drain ("bad DIMM") on another, and resets with `--slurm` (SSH
fan-out, or one srun step with `--via srun`). As planned: the job's node skipped and
back in service as it was, the admin's node reset and still drained with its reason,
the sick node left drained with fleet's reason, every other node clean and resumed.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio

from fleet.app.run import run_and_report
from fleet.engine.options import RunOptions, SchedulerOptions
from fleet.history import DEMO
from fleet.inventory.load import load_inventory
from fleet.inventory.targeting import select
from fleet.model.report import HostReport, HostStatus, RunReport, StepName
from fleet.model.uniformity import odd
from fleet.report import render as reporting
from fleet.runlog.folder import demo_log_dir
from fleet.sim import slurmcluster
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, UnitSpec, WorkerSpec
from fleet.sim.slurmcluster import SlurmCluster
from fleet.terminal import say

CUT = (reporting.INTERRUPTED, reporting.HUNG_UP)  # a signal cut the run: the demo exits with its status

ALL_GPUS = (0, 1, 2, 3, 4, 5, 6, 7)


def node_name(number: int) -> str:
    """The demo's node `number`: `demo-b01`, never a name a real inventory (or the README's `gpu-b01`) uses."""
    return f"demo-b{number:02d}"


def demo_specs(count: int) -> list[NodeSpec]:
    """Busy nodes: a serving unit on all GPUs, a stray process outside it, persistenced that must live.

    Every fourth node has a stray that ignores SIGTERM; every third a serving unit
    whose memory takes 2 s to come back after it dies. One node (SICK, when there are
    at least two) is unhealthy: its kernel log says GPU 5 fell off the bus (Xid 79),
    so its health gate fails it however clean its memory is. Every node is an NVSwitch one, its fabric manager
    on its driver's version. One (OLD_DRIVER's, when there are at least three) runs an older driver and the
    fabric manager that goes with it: clean, and the odd one out of the rack compared, by both. Two
    (`left_settings`, from eight nodes) were left with a last user's GPU settings: a locked clock, a lowered power
    limit; the demo's `--restore-settings` gives them back.
    """
    specs = []
    for i in range(1, count + 1):
        unit = UnitSpec(name="sglang.service", gpus=ALL_GPUS, mib=70_000, process_name="sglang")
        stray = WorkerSpec(gpus=(0,), mib=1523, name="python3", ignore_sigterm=i % 4 == 0)
        name = node_name(i)
        spec = NodeSpec(name=name, units=(unit,), workers=(stray,), linger_s=2.0 if i % 3 == 0 else 0.5,
                        xids=SICK_XIDS if count > 1 and name == sick(count) else ())
        spec = replace(spec, driver_version=OLDER_DRIVER) if name == old_driver(count) else spec
        spec = replace(spec, fabric_manager=spec.driver_version)  # NVSwitch nodes: FM goes with the driver
        left = left_settings(count).get(name)
        specs.append(replace(spec, **left) if left else spec)
    return specs


def left_settings(count: int) -> dict[str, dict[str, Any]]:
    """The nodes a last user left GPU settings on, and which (`NodeSpec` fields): from eight nodes, demo-b03's
    GPU 2 with locked clocks and demo-b05's GPU 3 with its power limit lowered to 450 W (default 700)."""
    if count < 8:
        return {}
    return {node_name(3): {"locked_clock_gpus": (2,)}, node_name(5): {"power_limits": ((3, 450.0),)}}


SICK_XIDS = ((5, 79, "pid=2718, name=sglang, GPU has fallen off the bus."),)


def sick(count: int) -> str:
    """The node the demo makes unhealthy: the last one."""
    return node_name(count)


OLDER_DRIVER = "535.183.01"  # a real driver's version (tests/fixtures/nvidia-smi), older than NodeSpec's


def old_driver(count: int) -> str | None:
    """The node the demo gives an older driver: demo-b07, or with fewer than eight nodes the one before the sick
    one; none with fewer than three (one of two would be a tie, no odd one out)."""
    if count < 3:
        return None
    return node_name(7 if count >= 8 else count - 1)


def went_as_expected(report: RunReport, count: int) -> bool:
    """Every node clean but the sick one, which failed its health gate on the Xid; the older driver's node named
    the only odd one out, by its driver and its fabric manager alone."""
    bad = {n: h for n, h in report.hosts.items() if h.status is not HostStatus.CLEAN}
    older = old_driver(count)
    named = odd(report.hosts)
    if set(named) != ({older} if older else set()):
        return False
    if older is not None and [why.split(" (")[0] for why in named[older]] != [
            f"driver {OLDER_DRIVER}", f"fabric manager {OLDER_DRIVER}"]:
        return False
    if not all(restored(report.hosts.get(name)) for name in left_settings(count)):
        return False
    if count < 2:
        return not bad
    host = bad.get(sick(count))
    return list(bad) == [sick(count)] and host is not None and "Xid 79" in (host.error or "")


def restored(host: HostReport | None) -> bool:
    """The host ended clean, its settle says nvidia-smi changes took, and verify found nothing left to restore."""
    if host is None or host.status is not HostStatus.CLEAN:
        return False
    settle = next((step for step in host.steps if step.name is StepName.SETTLE), None)
    found = [f for gpu in host.gpus for f in gpu.health if f.check == "gpu_settings"]
    return settle is not None and "nvidia-smi change" in (settle.detail or "") and "took" in settle.detail and not found


def _describe(sim: SimFleet) -> None:
    for name, node in sim.nodes.items():
        used = node.gpu_memory()
        total = sum(m or 0 for m in used)
        say(f"  {name} {sim.address(name)}:{sim.port(name)}  {len(used)} GPUs, {total} MiB in use")


async def _demo(nodes: int, as_json: bool, log_dir: Path | None) -> int:
    with tempfile.TemporaryDirectory(prefix="fleet-demo-") as tmp:
        specs = demo_specs(nodes)
        say(f"starting {nodes} simulated 8-GPU nodes on loopback ...")
        async with SimFleet(Path(tmp), specs, groups={"blackwell": [s.name for s in specs]}) as sim:
            _describe(sim)
            inventory = load_inventory(sim.inventory_path)
            targets = select(inventory, groups=["blackwell"])
            say(f"\n$ fleet reset -i {sim.inventory_path.name} --group blackwell --restore-settings -y\n")
            options = RunOptions(restore_settings=True)
            code, report = await run_and_report(targets, options, as_json=as_json, log_dir=log_dir, per_host=True,
                                                recorded_as=DEMO, handle_signals=True, progress_view=True)
            say("\nwhat the nodes themselves say now:")
            _describe(sim)
        say("simulated fleet torn down")
    return _verdict(report, nodes, code)


def _verdict(report: RunReport, nodes: int, code: int = 0) -> int:
    """The demo's exit status: the run's when a signal cut it (130, a hang-up 129), else whether it went as
    expected."""
    if code in CUT:
        return code
    if not went_as_expected(report, nodes):
        say("fleet demo: the run did not end as the demo planned (see above)")
        return 1
    if nodes > 1:
        say(f"as planned: every node clean but {sick(nodes)}, whose GPU 5 fell off the bus (Xid 79 in its kernel log)")
    if old_driver(nodes):
        say(f"as planned: {old_driver(nodes)}, on driver and fabric manager {OLDER_DRIVER}, named the odd one out by"
            " both (settings: above)")
    if left_settings(nodes):
        say("as planned: the settings a last user left (demo-b03's locked clocks, demo-b05's 450 W power limit)"
            " restored and read back")
    return 0


# --- with Slurm -----------------------------------------------------------------------------------

SLURM_DRAIN_WAIT_S = 5.0


def slurm_roles(count: int) -> tuple[str | None, str | None]:
    """(the node running a job past --drain-wait, the node an admin drained): the first two, when there are
    enough nodes besides the sick one."""
    if count < 4:
        return None, None
    return node_name(1), node_name(2)


def slurm_surprises(report: RunReport, count: int, cluster: SlurmCluster, via_srun: bool = False) -> list[str]:
    """What did not go as the Slurm demo expected (empty: all of it did). Through srun, the admin's node is
    skipped: a job step cannot run on a drained node."""
    busy, admin = slurm_roles(count)
    wrong = []
    for name, host in report.hosts.items():
        state, reason = cluster.node_state(name).rstrip("*"), cluster.node_reason(name)
        if name == busy:
            ok = host.status is HostStatus.SKIPPED and state == "allocated"
        elif name == admin:
            admin_status = HostStatus.SKIPPED if via_srun else HostStatus.CLEAN
            ok = host.status is admin_status and state == "drained" and reason == "bad DIMM"
        elif count > 1 and name == sick(count):
            ok = host.status is HostStatus.FAILED and state == "drained" and reason.startswith(
                f"fleet: run {report.run_id}: ")
        else:
            ok = host.status is HostStatus.CLEAN and state == "idle"
        if not ok:
            wrong.append(f"{name}: {host.status.value}, Slurm {state} {reason!r}")
    return wrong


def _sinfo(cluster: SlurmCluster) -> None:
    for line in cluster.run("sinfo", "-N", "-h", "-o", "%N %T %E").stdout.splitlines():
        say(f"  {line}")


async def _slurm_demo(nodes: int, as_json: bool, log_dir: Path | None, via_srun: bool) -> int:
    missing = slurmcluster.available()
    if missing is not None:
        say(f"fleet demo --slurm: {missing}")
        return 2
    with tempfile.TemporaryDirectory(prefix="fleet-demo-") as tmp:
        specs = demo_specs(nodes)
        say(f"starting {nodes} simulated 8-GPU nodes on loopback, and a Slurm cluster over them ...")
        async with SimFleet(Path(tmp), specs, groups={"blackwell": [s.name for s in specs]}) as sim:
            task_env = {n: {"PATH": node.env()["PATH"]} for n, node in sim.nodes.items()}
            addresses = {n: sim.address(n) for n in sim.nodes}
            gpus = {s.name: s.gpus for s in specs}  # Gres=gpu:8, as a GPU cluster has them
            with SlurmCluster(Path(tmp) / "slurm", addresses, task_env=task_env, gpus=gpus) as cluster, \
                    _environment(cluster.env):
                busy, admin = slurm_roles(nodes)
                if busy:
                    job = cluster.submit_sleep(busy, 600)
                    say(f"  job {job} runs on {busy} (sleep 600: it outlives --drain-wait)")
                if admin:
                    cluster.drain(admin, "bad DIMM")
                    say(f"  an admin drained {admin}: bad DIMM")
                _sinfo(cluster)
                targets = select(load_inventory(sim.inventory_path), groups=["blackwell"])
                via = " --via srun" if via_srun else ""
                say(f"\n$ fleet reset -i {sim.inventory_path.name} --group blackwell --slurm"
                    f" --drain-wait {SLURM_DRAIN_WAIT_S:g}s{via} -y\n")
                slurm = SchedulerOptions(name="slurm", drain_wait_s=SLURM_DRAIN_WAIT_S, fan_out=via_srun)
                options = RunOptions(scheduler=slurm)
                code, report = await run_and_report(targets, options, as_json=as_json, log_dir=log_dir,
                                                    per_host=True, recorded_as=DEMO, handle_signals=True)
                say("\nwhat Slurm says now (sinfo -N):")
                _sinfo(cluster)
                wrong = slurm_surprises(report, nodes, cluster, via_srun)
        say("simulated fleet and Slurm cluster torn down")
    if code in CUT:
        return code
    if wrong:
        say("fleet demo --slurm: the run did not end as the demo planned: " + "; ".join(wrong))
        return 1
    admin = "skipped (no job step runs on a drained node)" if via_srun else "reset"
    say(f"as planned: the job's node skipped and back in service, the admin's node {admin} and still drained,"
        " the sick node drained with fleet's reason, every other node clean and resumed")
    return 0


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the block (Slurm's clients read SLURM_CONF), then put them back."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_demo(*, nodes: int = 16, as_json: bool = False, log_dir: Path | None = None, slurm: bool = False,
             via_srun: bool = False) -> int:
    """The demo's exit status; its runs go to `log_dir`, else to its own folder (`demo_log_dir`), never into the
    operator's history."""
    folder = log_dir or demo_log_dir()
    if slurm or via_srun:
        code = anyio.run(_slurm_demo, nodes, as_json, folder, via_srun)
    else:
        code = anyio.run(_demo, nodes, as_json, folder)
    if log_dir is None and code != 2:
        say(f"the demo's runs are kept apart from yours: fleet runs --log-dir {folder}")
    return code
