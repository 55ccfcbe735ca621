"""A step's time on the controller's attention clock: every command a step runs fits in what is left of it.

The clock leaves out the seconds the controller's event loop was late (`fleet.transport.attention`): a step whose
window "ended" while the controller was held has had no more of its time, so it looks at the node again before it
decides; a late controller only makes a run slower. The node's own `timeout` still bounds each command there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleet.transport.attention import Clock, clock


@dataclass(frozen=True)
class Room:
    """A step's time as it is declared, before the step starts: the window it waits for the node and the slack for
    the commands that see the window end. Pure: the longest a step can take is read off it
    (`fleet.reset.verdict_time`), and `start()` makes the running budget from the same two numbers."""

    window: float
    slack: float = 0.0

    @property
    def seconds(self) -> float:
        return self.window + self.slack

    def start(self) -> TimeBudget:
        return TimeBudget(window=self.window, slack=self.slack)


class BudgetSpent(Exception):
    """A step ran out of its time budget before it could start a command."""


@dataclass(kw_only=True)
class TimeBudget:
    """A step's time on the attention clock.

    `window` is how long the step waits for the node to change (a unit to stop,
    memory to come back); `slack` is room for the command that observes the end
    of the window. No command runs past `window + slack`.
    """

    window: float
    slack: float = 0.0
    started: float = 0.0
    clock: Clock = field(default_factory=clock, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.started = self.clock.now()

    @property
    def seconds(self) -> float:
        return self.window + self.slack

    @property
    def elapsed(self) -> float:
        return self.clock.now() - self.started

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
