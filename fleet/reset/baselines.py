"""The baselines: what the node holds as a reset begins, read in one command as drain begins (and logged in it).

Asks the node: the kernel log to its end (`journalctl -k`), then each GPU's memory.used and the compute apps
(`nvidia-smi`), in one batch, each read at its own bound. Decides nothing: verify judges the Xids logged after
the cursor, and an Xid's owner from the apps; the memory is the report's and the history's "before".
"""

from __future__ import annotations

from typing import Any

from fleet.inventory.host import Host
from fleet.model.errors import CommandTimeout, StepFailed
from fleet.model.report import StepName
from fleet.node.bounds import commands_s
from fleet.node.budget import BudgetSpent
from fleet.node.node import Node
from fleet.node.probe import Probe
from fleet.node.probes import jobs, kernel_log, smi
from fleet.reset import verify

# What ends a read here but not the reset: the memory and the apps are then unknown.
UNREAD = (StepFailed, BudgetSpent, CommandTimeout)
# The nvidia-smi reads: the GPU memory and the compute apps.
SMI_READS = 2


def longest_s(host: Host) -> float:
    """The longest the baselines can take: the kernel log and which compute apps are a job's (unless Xids are
    ignored) and the two nvidia-smi reads, each at its bound (the batch has no budget of its own)."""
    return commands_s(host, smi=SMI_READS, other=2 if reads_xids(host) else 0)


def reads_xids(host: Host) -> bool:
    """Whether the kernel log is read: not when the host ignores Xids."""
    return "xid" not in host.health_ignore


async def read(node: Node) -> tuple[verify.Baseline, tuple[int | None, ...] | None]:
    """What the node holds as the reset begins, in one command: the kernel log read to its end (its Xids, and the
    cursor verify reads on from: any Xid after it was logged during the reset), the compute apps (which GPU each
    process held: an application Xid without a pid, during the reset, on a GPU whose holder fleet killed, only
    warns) and each GPU's memory.used (the report's and the history's "before").

    The kernel log comes first: a section that times out ends its batch, and the log is the one read here a
    verdict rests on (verify fails the Xid check without it), while the memory and the apps are optional; so
    an nvidia-smi that is slow or hung never keeps the log from being read (a journalctl that hangs costs
    only the optional reads). The kernel log that cannot be read is said so in the baseline (verify fails the
    Xid check with why, unless the host ignores Xids: then it is not read); the memory is None when it cannot
    be read now (settle and verify will say why, the warning names the bound that ended it); the apps are
    empty. Each read has its own bound (`fleet.node.bounds`: command_timeout for journalctl, nvidia-smi's for
    the two queries), none a constant; the batch has no budget of its own beyond them.
    """
    host = node.host
    log_probe = kernel_log.read() if reads_xids(host) else None
    memory_probe, apps_probe = smi.gpu_query(host.nvidia_smi, smi.SETTLE_FIELDS), smi.compute_apps(host.nvidia_smi)
    asked: list[Probe[Any]] = [] if log_probe is None else [log_probe]
    answers = await node.batch([*asked, memory_probe, apps_probe], step=StepName.DRAIN)
    log, unread = None, None
    if log_probe is not None:
        got = verify.read_kernel_log(answers, log_probe)
        log, unread = (got, None) if isinstance(got, kernel_log.KernelLog) else (None, got)
        if unread is not None:
            node.log.warning("kernel_log_unread", error=unread)
    memory: tuple[int | None, ...] | None = None
    apps: tuple[smi.ComputeApp, ...] = ()
    try:
        memory = tuple(r.memory_used_mib for r in answers.read(memory_probe))
        apps = answers.read(apps_probe)
    except UNREAD as exc:
        node.log.warning("memory_unread", error=str(exc))
    jobs = await _jobs(node, apps) if apps and log_probe is not None else frozenset()
    return verify.Baseline(log=log, unread=unread, apps=apps, jobs=jobs), memory


async def _jobs(node: Node, apps: tuple[smi.ComputeApp, ...]) -> frozenset[int]:
    """The compute apps that are a job's processes (their cgroup names a job), in one more command: fleet never
    ends them, so one that ends on its own during the reset was not ended by it, and its application Xid fails.
    A read that fails counts every app as a job's: not known is never "the reset ended it"."""
    pids = sorted({a.pid for a in apps})
    try:
        found = await node.ask(jobs.job_cgroups(pids), step=StepName.DRAIN)
        return frozenset(found)
    except UNREAD as exc:
        node.log.warning("jobs_unread", error=str(exc))
        return frozenset(pids)
