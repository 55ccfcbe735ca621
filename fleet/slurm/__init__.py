"""Slurm around a reset: drain before, resume after, and fan-out through `srun`.

    records.py    what Slurm says: `scontrol show node` and `squeue` output, parsed (pure)
    policy.py     what fleet does about it: drain, adopt or leave a node; resume, keep or undo (pure)
    control.py    the Slurm client commands (scontrol, squeue, sinfo), bounded, run on this machine
    lifecycle.py  the scheduler seam the task graph calls: admit a wave, wait for its jobs, release a host
    srun.py       `--via srun`: one job step over the targets in a maintenance reservation
    noderun.py    the node side of `--via srun`: reset this node, stream JSON lines back

The Slurm client commands run where fleet runs (a login or admin node), with the
configuration Slurm's own tools find there (`SLURM_CONF`, else /etc/slurm/slurm.conf).
"""
