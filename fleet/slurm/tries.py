"""Bounded tries at a Slurm change, for `--slurm`'s admission and release and `--via srun`'s admission and cleanup.

A Slurm command that answered with an error may still have been applied (`Socket timed out on send/recv
operation`: slurmctld took the request, its reply was lost), or may pass a moment later (slurmctld restarting).
So a change is never assumed done nor failed from one answer: each try reads what Slurm shows, decides from
that, and acts; a `SlurmError` anywhere in a try (the read, the update, the read-back) is followed by a pause
and a new try, up to `UPDATE_TRIES`. Every caller writes only its try; the loop is this one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from fleet.slurm.control import SlurmError

# Tries at one change: read, decide, update (and read back); again after any Slurm error in them.
UPDATE_TRIES = 3

T = TypeVar("T")


def _quiet(attempt: int, error: SlurmError) -> None:
    """The default `failed`: nothing to log."""


async def tried(attempt: Callable[[int], Awaitable[T]], *, pause_s: float, tries: int = UPDATE_TRIES,
                failed: Callable[[int, SlurmError], None] = _quiet) -> T:
    """`attempt(1)`, and after a SlurmError `attempt(2)`, ... up to `tries`, `pause_s` apart: the first result.
    `failed(n, error)` is told of each error; the last one is raised when no try succeeded."""
    number = 1
    while True:
        try:
            return await attempt(number)
        except SlurmError as exc:
            failed(number, exc)
            if number >= tries:
                raise
        await anyio.sleep(pause_s)
        number += 1
