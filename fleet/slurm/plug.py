"""Slurm as a `fleet.engine.schedulers` plug: the drain / wait / resume lifecycle around SSH fan-out
(`fleet.slurm.lifecycle`), the whole reset as one job step (`--via srun`, `fleet.slurm.srun`), and a partition's
nodes as targets (`--partition`). Its node side (slurmstepd, job cgroups) is `fleet.slurm.jobs`."""

from __future__ import annotations

import anyio

from fleet.engine.interrupts import Interrupts
from fleet.engine.options import RunOptions
from fleet.engine.schedulers import Plug, Scheduler
from fleet.inventory.load import Inventory
from fleet.model.errors import UsageError
from fleet.runlog.folder import RunLiveness, RunLogs, run_liveness
from fleet.slurm.control import Slurm, SlurmError
from fleet.slurm.lifecycle import SlurmLifecycle
from fleet.slurm.srun import run_via_srun
from fleet.slurm.variables import node_name


def lifecycle(options: RunOptions, logs: RunLogs, interrupts: Interrupts | None) -> Scheduler:
    """The run's Slurm lifecycle; an earlier run's drain is known to be over when its log folder, beside this run's,
    says so (`fleet.runlog.folder.run_liveness`)."""
    assert options.scheduler is not None

    def run_over(run_id: str) -> bool:
        return run_liveness(logs.path.parent, run_id) is RunLiveness.OVER

    return SlurmLifecycle(Slurm(), logs.run_id, options.mode, drain_wait_s=options.scheduler.drain_wait_s,
                          run_over=run_over, interrupts=interrupts)


def partition_hosts(partition: str, inv: Inventory | None) -> list[str]:
    """The host names of a Slurm partition's nodes: the inventory host whose `slurm.node` it is, else the node name."""
    try:
        nodes = anyio.run(Slurm().partition, partition)
    except SlurmError as exc:
        raise UsageError(f"--partition {partition}: {exc}") from None
    by_node = {node_name(h): h.name for h in (inv.hosts.values() if inv else ())}
    return [by_node.get(node, node) for node in nodes]


PLUG = Plug(lifecycle=lifecycle, run_via=run_via_srun, targets=partition_hosts)
