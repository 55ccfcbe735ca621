"""Waiting for a node's jobs to end: one wait, for `--slurm` (each host waits in `ready`) and `--via srun` (every
reserved node before the step).

A `Wait` is one node's: it ends when Slurm shows no job holding the node (not busy, no job in `squeue`), when the
node is lost (gone from Slurm; or, for a node fleet drained, resumed by someone else), or when its time runs out.
One poller (`JobWaits.serve`) asks Slurm about every waiting node at once (one `scontrol show node`, one `squeue`),
every `poll_s` (`fleet.node.poll.poll_until`, the one wait); a wait that runs out gets one last look of its own.
A look that fails is asked again next round, never read as "no job".
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

import anyio

from fleet.node.poll import poll_until
from fleet.slurm import policy
from fleet.slurm.control import Slurm, SlurmError

# Seconds between two looks at the nodes still waiting for their jobs to end.
POLL_S = 2.0


@dataclass(kw_only=True)
class Wait:
    """One node's wait. `drained`: the node must stay drained meanwhile (fleet drained it: a resume by someone
    else loses it); `jobs`: the ids Slurm last showed on it."""

    name: str
    drained: bool = False
    jobs: tuple[str, ...] = ()
    lost: str | None = None  # why it ended without the node being free: gone, or resumed under us
    free: bool = False
    ended: anyio.Event = field(default_factory=anyio.Event)

    def outcome(self, wait_s: float) -> str | None:
        """None when the node is free; else why it is not reset (the same words in both modes)."""
        if self.lost is not None:
            return self.lost
        if self.free:
            return None
        return still_running(self.name, self.jobs, wait_s)


def still_running(name: str, jobs: tuple[str, ...], wait_s: float) -> str:
    return f"slurm: job {', '.join(jobs) or '?'} still running on {name} after {wait_s:g} s: not reset"


class JobWaits:
    """The nodes waiting for their jobs, and the one poller that looks at all of them."""

    def __init__(self, slurm: Slurm, poll_s: float = POLL_S) -> None:
        self.slurm = slurm
        self.poll_s = poll_s
        self._waiting: dict[str, Wait] = {}
        self._wake = anyio.Event()

    async def serve(self) -> None:
        """The poller: while nodes wait, ask Slurm about all of them at once, every poll_s (runs until cancelled)."""
        while True:
            if not self._waiting:
                self._wake = anyio.Event()
                await self._wake.wait()
            await poll_until(self._look_waiting, lambda still: not still, itertools.repeat(self.poll_s))

    async def _look_waiting(self) -> bool:
        """One look at every node waiting now; whether any still waits."""
        await self.look(list(self._waiting.values()))
        return bool(self._waiting)

    async def wait(self, wait: Wait, until: float) -> Wait:
        """Until the node is free or lost, or `until` (anyio clock) has passed; then one last look of its own."""
        remaining = until - anyio.current_time()
        if remaining > 0:
            self._waiting[wait.name] = wait
            self._wake.set()
            try:
                with anyio.move_on_after(remaining):
                    await wait.ended.wait()
            finally:
                self._waiting.pop(wait.name, None)
        if not wait.ended.is_set():  # --drain-wait 0, or jobs that ended as the wait ran out
            await self.look([wait])
        return wait

    async def look(self, waits: Iterable[Wait]) -> None:
        """One look at these nodes; each that is free or lost ends its wait."""
        waits = list(waits)
        if not waits:
            return
        try:
            seen, jobs = await self.slurm.look([w.name for w in waits])
        except SlurmError:
            return  # asked again next round; a wait that ends this way says the jobs it last saw
        for wait in waits:
            now = seen.get(wait.name)
            wait.jobs = jobs.get(wait.name, wait.jobs)
            if now is None:
                wait.lost = f"slurm: the node {wait.name} is gone from Slurm: not reset"
            elif wait.drained and not now.draining_or_drained:
                wait.lost = f"slurm: someone resumed {wait.name} during the wait ({policy.describe(now)}): not reset"
            elif now.busy or wait.jobs:
                continue
            else:
                wait.free = True
            wait.ended.set()
