"""`--via srun`'s end for the nodes the step failed: each drained with fleet's reason, and Slurm seen to show it,
before the reservation goes (the caller removes it only then).

What to do to a node is `fleet.slurm.policy.after_step`'s (pure: a failed node is drained whatever Slurm's base
state); this is the doing, in tries (`fleet.slurm.tries`, the same as `--slurm`'s release): one `scontrol show
node` for the failed nodes, one `scontrol update ... State=DRAIN` per reason for those Slurm does not show
drained, and one read back. A Slurm error anywhere in a try (the read, a drain, the read back) starts a new try
from a fresh read, so a drain whose reply was lost is never sent twice and a refused one is sent again. A node
Slurm still does not show drained after the tries is unconfirmed: the caller keeps the reservation and names it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fleet.model.hostlog import HostLog
from fleet.model.report import HostStatus
from fleet.slurm import policy
from fleet.slurm.control import Slurm, SlurmError, hostlist
from fleet.slurm.records import SlurmNode
from fleet.slurm.tries import retry


@dataclass(frozen=True, kw_only=True)
class Ended:
    """A node of the step as the step left it: what its decision is made from."""

    name: str
    status: HostStatus
    error: str | None
    touched: bool  # the step may have done something to it (`fleet.slurm.srun`'s `_Step.touched`)

    @property
    def failed(self) -> bool:
        """Its decision depends on what Slurm shows: it may have to be drained."""
        return self.touched and self.status is not HostStatus.CLEAN


@dataclass
class Drained:
    """What the drains came to."""

    seen: dict[str, SlurmNode] | None = None  # the failed nodes as last read (None: never read)
    unconfirmed: list[str] = field(default_factory=list)  # failed nodes not shown drained after the tries
    error: SlurmError | None = None  # the last error, when some are unconfirmed


def decide(ended: Sequence[Ended], seen: Mapping[str, SlurmNode], run_id: str) -> dict[str, policy.Action]:
    return {e.name: policy.after_step(seen.get(e.name), run_id, e.status, e.error, e.touched) for e in ended}


def pending(drains: Mapping[str, list[str]]) -> list[str]:
    return [name for names in drains.values() for name in names]


async def drain_failed(slurm: Slurm, run_id: str, ended: Sequence[Ended], logs: Mapping[str, HostLog],
                       pause_s: float) -> Drained:
    """Drain every failed node Slurm does not show drained, read back; see the module docstring."""
    failed = [e for e in ended if e.failed]
    for e in ended:
        if not e.failed:
            action = policy.after_step(None, run_id, e.status, e.error, e.touched)
            logs[e.name].info("slurm_release", node=e.name, action=action.what.value, why=action.why)
    names = [e.name for e in failed]
    result = Drained(unconfirmed=names)
    if not failed:
        return result

    async def attempt(number: int) -> None:
        result.seen = await slurm.nodes(names)
        actions = decide(failed, result.seen, run_id)
        for name, action in actions.items():
            node = result.seen.get(name)
            logs[name].info("slurm_release", node=name, action=action.what.value, why=action.why, attempt=number,
                            state=node.state if node else None)
        drains = policy.drains(actions)
        result.unconfirmed = pending(drains)
        if not drains:
            return
        for reason, group in drains.items():
            await slurm.update(group, "DRAIN", reason)
        result.seen = await slurm.nodes(names)
        result.unconfirmed = pending(policy.drains(decide(failed, result.seen, run_id)))
        if result.unconfirmed:
            raise SlurmError(f"Slurm does not show {hostlist(result.unconfirmed)} drained after the update")

    def told(number: int, exc: SlurmError) -> None:
        for name in result.unconfirmed:
            logs[name].warning("slurm_error", node=name, error=str(exc), attempt=number)

    try:
        await retry(attempt, pause_s=pause_s, failed=told)
    except SlurmError as exc:
        result.error = exc
    return result
