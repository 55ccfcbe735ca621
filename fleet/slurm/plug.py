"""Slurm as a `fleet.engine.schedulers` plug: the drain / wait / resume lifecycle around SSH fan-out
(`fleet.slurm.lifecycle`), and the whole reset as one job step (`--via srun`, `fleet.slurm.srun`)."""

from __future__ import annotations

from fleet.engine.interrupts import Interrupts
from fleet.engine.options import RunOptions
from fleet.engine.run_folder import RunLiveness, RunLogs, run_liveness
from fleet.engine.schedulers import Plug, Scheduler
from fleet.slurm.control import Slurm
from fleet.slurm.lifecycle import SlurmLifecycle
from fleet.slurm.srun import run_via_srun


def lifecycle(options: RunOptions, logs: RunLogs, interrupts: Interrupts | None) -> Scheduler:
    """The run's Slurm lifecycle; an earlier run's drain is known to be over when its log folder, beside this run's,
    says so (`fleet.engine.run_folder.run_liveness`)."""
    assert options.scheduler is not None

    def run_over(run_id: str) -> bool:
        return run_liveness(logs.path.parent, run_id) is RunLiveness.OVER

    return SlurmLifecycle(Slurm(), logs.run_id, options.mode, drain_wait_s=options.scheduler.drain_wait_s,
                          run_over=run_over, interrupts=interrupts)


PLUG = Plug(lifecycle=lifecycle, run_via=run_via_srun)
