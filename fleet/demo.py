"""`fleet demo`: a busy simulated fleet on loopback, reset end to end through the real code path.

One node is unhealthy on purpose (a GPU fell off the bus): the demo exits 0 when the run ended as
planned (every other node clean, that one failed by its health gate), 1 otherwise.

Each simulated node is served by its own SSH server on its own loopback address
with its own host key; fleet reaches it exactly as it reaches a real node
(inventory -> asyncssh with host-key checking -> real commands). Everything the
demo starts is ended by its recorded pid and its folder removed, even on Ctrl-C.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import anyio

from fleet.graph import RunOptions
from fleet.inventory.load import load_inventory
from fleet.inventory.targeting import select
from fleet.report.models import HostStatus, RunReport
from fleet.run import run_and_report, say
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, UnitSpec, WorkerSpec

ALL_GPUS = (0, 1, 2, 3, 4, 5, 6, 7)


def demo_specs(count: int) -> list[NodeSpec]:
    """Busy nodes: a serving unit on all GPUs, a stray process outside it, persistenced that must live.

    Every fourth node has a stray that ignores SIGTERM; every third a serving unit
    whose memory takes 2 s to come back after it dies. One node (SICK, when there are
    at least two) is unhealthy: its kernel log says GPU 5 fell off the bus (Xid 79),
    so its health gate fails it however clean its memory is.
    """
    specs = []
    for i in range(1, count + 1):
        unit = UnitSpec("sglang.service", gpus=ALL_GPUS, mib=70_000, process_name="sglang")
        stray = WorkerSpec(gpus=(0,), mib=1523, name="python3", ignore_sigterm=i % 4 == 0)
        name = f"gpu-b{i:02d}"
        specs.append(NodeSpec(name=name, units=(unit,), workers=(stray,), linger_s=2.0 if i % 3 == 0 else 0.5,
                              xids=SICK_XIDS if count > 1 and name == sick(count) else ()))
    return specs


SICK_XIDS = ((5, 79, "pid=2718, name=sglang, GPU has fallen off the bus."),)


def sick(count: int) -> str:
    """The node the demo makes unhealthy: the last one."""
    return f"gpu-b{count:02d}"


def as_planned(report: RunReport, count: int) -> bool:
    """Every node clean but the sick one, which failed its health gate on the Xid."""
    bad = {n: h for n, h in report.hosts.items() if h.status is not HostStatus.CLEAN}
    if count < 2:
        return not bad
    host = bad.get(sick(count))
    return list(bad) == [sick(count)] and host is not None and "Xid 79" in (host.error or "")


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
            say(f"\n$ fleet reset -i {sim.inventory_path.name} --group blackwell -y\n")
            options = RunOptions(handle_signals=True)
            _, report = await run_and_report(targets, options, as_json=as_json, log_dir=log_dir, table=True)
            say("\nwhat the nodes themselves say now:")
            _describe(sim)
        say("simulated fleet torn down")
    if not as_planned(report, nodes):
        say("fleet demo: the run did not end as the demo planned (see above)")
        return 1
    if nodes > 1:
        say(f"as planned: every node clean but {sick(nodes)}, whose GPU 5 fell off the bus (Xid 79 in its kernel log)")
    return 0


def run_demo(*, nodes: int = 16, as_json: bool = False, log_dir: Path | None = None) -> int:
    return anyio.run(_demo, nodes, as_json, log_dir)
