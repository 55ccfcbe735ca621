"""`--via srun`'s maintenance reservation, `fleet-<run_id>`: created before the step, removed after it.

    create   `scontrol create reservation ReservationName=fleet-<run_id> ... Flags=MAINT,IGNORE_JOBS`; after an
             error the next try first looks for it by its name (`scontrol show reservation`): a create whose
             reply was lost took, and the reservation found is used, never created twice
    remove   `scontrol delete ReservationName=...`; after an error, read back: a reservation Slurm no longer has
             is removed (a lost reply); one it still has (the step's job still completing) is tried again

Both go through `fleet.slurm.tries`. `held` says whether Slurm may have the reservation: from the first create
sent (its reply may be lost) until a removal is confirmed, so that a run that gave up creating it still removes
what it may have left.
"""

from __future__ import annotations

import getpass
from collections.abc import Sequence

from fleet.slurm.control import Slurm, SlurmError, hostlist
from fleet.slurm.tries import retry
from fleet.slurm.waiting import POLL_S

# Seconds between two tries at removing the reservation (the step's job may still be completing: Slurm refuses).
DELETE_RETRY_S = 1.0
# Tries at removing it: 45 s of the cleanup's bound, once a second.
DELETE_TRIES = 45


class Reservation:
    """One run's reservation; see the module docstring."""

    def __init__(self, slurm: Slurm, name: str, pause_s: float = POLL_S) -> None:
        self.slurm, self.name, self.pause_s = slurm, name, pause_s
        self.held = False
        self.nodes: list[str] = []  # the nodes it was asked for

    def create_argv(self, nodes: Sequence[str], minutes: int) -> list[str]:
        return ["scontrol", "create", "reservation", f"ReservationName={self.name}", "StartTime=now",
                f"Duration={minutes}", f"Nodes={hostlist(nodes)}", f"Users={getpass.getuser()}",
                "Flags=MAINT,IGNORE_JOBS"]

    async def create(self, nodes: Sequence[str], minutes: int) -> None:
        """The reservation over `nodes` for `minutes`, created or found after a lost reply; SlurmError when the
        tries are spent (`held` then says whether Slurm may have it all the same)."""

        async def attempt(number: int) -> None:
            if number > 1 and await self.slurm.reservation(self.name):
                return
            self.held, self.nodes = True, list(nodes)
            await self.slurm.run(self.create_argv(nodes, minutes))

        await retry(attempt, pause_s=self.pause_s)

    async def remove(self) -> SlurmError | None:
        """Remove it (nothing to do unless `held`); the last error when Slurm still shows it after the tries."""
        if not self.held:
            return None

        async def attempt(number: int) -> None:
            try:
                await self.slurm.run(["scontrol", "delete", f"ReservationName={self.name}"])
            except SlurmError:
                if await self.slurm.reservation(self.name):
                    raise
            self.held = False

        try:
            await retry(attempt, pause_s=DELETE_RETRY_S, tries=DELETE_TRIES)
        except SlurmError as exc:
            return exc
        return None
