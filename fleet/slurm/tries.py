"""Bounded tries at a Slurm change, for `--slurm`'s admission and release and `--via srun`'s admission and cleanup.

A Slurm command that answered with an error may still have been applied (`Socket timed out on send/recv
operation`: slurmctld took the request, its reply was lost), or may pass a moment later (slurmctld restarting).
So a change is never assumed done nor failed from one answer: each try reads what Slurm shows, decides from
that, and acts; a `SlurmError` anywhere in a try (the read, the update, the read-back) is followed by a pause
and a new try, up to `UPDATE_TRIES`. Every caller writes only its try; the loop is `fleet.node.poll.poll_until`,
the one wait, with a fixed number of tries.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fleet.node.poll import poll_until
from fleet.slurm.control import SlurmError
from fleet.transport.base import client_deadline

# Tries at one change: read, decide, update (and read back); again after any Slurm error in them.
UPDATE_TRIES = 3

T = TypeVar("T")


def tries_s(commands: int, command_s: float, *, pause_s: float, tries: int = UPDATE_TRIES) -> float:
    """The longest `retry` can take when each try runs `commands` Slurm commands, each bounded by `command_s` (its
    client deadline, `fleet.transport.base.client_deadline`): every try at its longest, and the pauses between."""
    return tries * commands * client_deadline(command_s) + (tries - 1) * pause_s


def _quiet(attempt: int, error: SlurmError) -> None:
    """The default `failed`: nothing to log."""


async def retry(attempt: Callable[[int], Awaitable[T]], *, pause_s: float, tries: int = UPDATE_TRIES,
                failed: Callable[[int, SlurmError], None] = _quiet) -> T:
    """`attempt(1)`, and after a SlurmError `attempt(2)`, ... up to `tries`, `pause_s` apart: the first result.
    `failed(n, error)` is told of each error; the last one is raised when no try succeeded."""
    numbers = itertools.count(1)

    async def one_try() -> T | SlurmError:
        number = next(numbers)
        try:
            return await attempt(number)
        except SlurmError as exc:
            failed(number, exc)
            return exc

    polled = await poll_until(one_try, _succeeded, itertools.repeat(pause_s, tries - 1))
    if isinstance(polled.last, SlurmError):
        raise polled.last
    return polled.last


def _succeeded(seen: object) -> bool:
    return not isinstance(seen, SlurmError)
