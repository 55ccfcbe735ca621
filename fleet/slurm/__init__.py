"""Slurm around a reset: drain before, resume after, and fan-out through `srun`.

    records.py    what Slurm says: `scontrol show node` and `squeue` output, parsed (pure)
    policy.py     what fleet does about it: drain, adopt or leave a node; resume, keep or undo (pure)
    control.py    the Slurm client commands (scontrol, squeue, sinfo), bounded, run on this machine
    runner.py     the one seam they all run through, srun's step included (a test swaps it)
    tries.py      bounded tries at a Slurm change: read, decide, act; again after an error (both modes)
    lifecycle.py  the scheduler seam the task graph calls: admit a wave, wait for its jobs, release a host
    srun.py       `--via srun`: one job step over the targets in a maintenance reservation
    reservation.py  `--via srun`'s reservation: created (found after a lost reply), removed (read back)
    cleanup.py    `--via srun`'s failed nodes drained with fleet's reason, read back, before the reservation goes
    noderun.py    the node side of `--via srun`: reset this node, stream JSON lines back
    plug.py       the plug (`PLUG`); jobs.py its node side (`JOBS`); variables.py its host variables (`slurm:`)

The Slurm client commands run where fleet runs (a login or admin node), with the
configuration Slurm's own tools find there (`SLURM_CONF`, else /etc/slurm/slurm.conf).
"""

NAME = "slurm"  # its name in the scheduler registry (`fleet.model.plugs.SCHEDULERS`), its records and the inventory
