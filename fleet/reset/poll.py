"""Polling without a fixed sleep: the backoff every step that waits for the node uses."""

from __future__ import annotations

import functools

# Backoff for polls: first wait, factor, cap (seconds).
POLL_FIRST_S = 0.1
POLL_FACTOR = 1.5
POLL_CAP_S = 1.0
# A poll is not started with less than this left in the step's budget.
POLL_MARGIN_S = 0.05


@functools.cache
def backoff() -> tuple[float, ...]:
    """The poll waits: 0.1, 0.15, 0.225 ... capped at 1 s (computed once; a tuple is testable)."""
    waits: list[float] = []
    wait = POLL_FIRST_S
    while len(waits) < 200:
        waits.append(wait)
        wait = min(wait * POLL_FACTOR, POLL_CAP_S)
    return tuple(waits)
