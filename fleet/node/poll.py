"""The one wait: look, decide, pause, look again, until what is seen is what is wanted or the time is over.

Every wait of fleet is `poll_until`: a step waiting for its node (drain's units going down, kill's signalled
processes going and its respawn scan, settle's GPU memory coming back) and Slurm's waits and tries (the poller of
the nodes waiting for their jobs, a resumed node's NOT_RESPONDING, the bounded tries at a change). A caller gives
the look (an async callable), what it waits for (a predicate on what was seen), the pauses between looks (the
backoff below, a fixed pause, or a few pauses: a number of tries) and, when the wait has a window, the step's
`TimeBudget`, which runs on the controller's attention clock (`fleet.transport.attention`): the seconds the event
loop was held are not the node's, so a late controller only makes a wait slower.

It never gives up without looking after its last wake-up, however late that wake-up came: a window that "ended"
while the loop was held is decided on what the node shows now, never on what it showed before the stall.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

import anyio

from fleet.node.budget import TimeBudget

# Backoff for polls: first wait, factor, cap (seconds).
POLL_FIRST_S = 0.1
POLL_FACTOR = 1.5
POLL_CAP_S = 1.0
# A poll is not started with less than this left in the window.
POLL_MARGIN_S = 0.05

T = TypeVar("T")


class Unlooked(Enum):
    """`first` not given: poll_until looks before it decides anything."""

    UNLOOKED = "unlooked"


@dataclass(frozen=True)
class Polled(Generic[T]):
    """What a wait came to: the last thing seen, how many looks it took (`first` not counted), and whether the
    last thing seen is what was waited for."""

    last: T
    looks: int
    met: bool


def backoff() -> Iterator[float]:
    """The waits of a poll: 0.1, 0.15, 0.225 ... then 1 s for as long as the window lasts."""
    return itertools.chain(_GROWING, itertools.repeat(POLL_CAP_S))


# The waits before the cap, made once: every poll of every host begins with them.
_GROWING = tuple(itertools.takewhile(lambda wait: wait < POLL_CAP_S,
                                     (POLL_FIRST_S * POLL_FACTOR ** n for n in itertools.count())))


async def poll_until(look: Callable[[], Awaitable[T]], met: Callable[[T], bool], waits: Iterable[float], *,
                     within: TimeBudget | None = None, first: T | Unlooked = Unlooked.UNLOOKED) -> Polled[T]:
    """Look until `met(seen)`, pausing `waits` between looks (anyio.sleep, never past the window of `within`);
    give up when the waits run out or the window has no more than POLL_MARGIN_S left after a look.

    `first`: something already seen (the wait decides on it before its first look). What `look` raises is the
    caller's: it ends the wait.
    """
    pauses = iter(waits)
    seen, looks = (await look(), 1) if isinstance(first, Unlooked) else (first, 0)
    while not met(seen):
        pause = _next_pause(pauses, within)
        if pause is None:
            return Polled(seen, looks, met=False)
        await anyio.sleep(pause)
        seen, looks = await look(), looks + 1  # after every wake-up, however late: the node decides, not the stall
    return Polled(seen, looks, met=True)


def _next_pause(pauses: Iterator[float], within: TimeBudget | None) -> float | None:
    """The pause before the next look, or None when the waits or the window are over."""
    left = math.inf if within is None else within.window_left
    if left <= POLL_MARGIN_S:
        return None
    pause = next(pauses, None)
    return None if pause is None else min(pause, left)
