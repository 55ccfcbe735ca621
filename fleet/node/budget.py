"""A step's time on the monotonic clock: every command a step runs fits in what is left of it."""

from __future__ import annotations

import time
from dataclasses import dataclass


class BudgetSpent(Exception):
    """A step ran out of its time budget before it could start a command."""


@dataclass
class Budget:
    """A step's time on the monotonic clock.

    `window` is how long the step waits for the node to change (a unit to stop,
    memory to come back); `slack` is room for the command that observes the end
    of the window. No command runs past `window + slack`.
    """

    window: float
    slack: float = 0.0
    started: float = 0.0

    def __post_init__(self) -> None:
        self.started = time.monotonic()

    @property
    def seconds(self) -> float:
        return self.window + self.slack

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def remaining(self) -> float:
        return self.seconds - self.elapsed

    @property
    def window_left(self) -> float:
        return self.window - self.elapsed

    def command_timeout(self, limit: float) -> float:
        """A command's timeout: the host's command_timeout, never past the step's end."""
        left = self.remaining
        if left <= 0.05:
            raise BudgetSpent(f"step budget of {self.seconds:g} s spent")
        return min(limit, left)
