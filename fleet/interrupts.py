"""SIGINT and SIGTERM over a whole run: the first cuts the run short, the second says what is still being
finished, only the third abandons it; the report is written whatever comes.

    1st   the run is cancelled: in-flight commands are ended, every host gets its outcome, and what a
          run must finish (a Slurm node's release, `--via srun`'s cleanup) goes on, shielded and bounded
    2nd   one line on stderr: what is still being finished and for how long at most, and what a third
          signal would leave behind (`still releasing 12 Slurm nodes (up to 45 s); again to abandon them
          drained`)
    3rd   what was being finished is abandoned (each `Finishing` says so in its hosts' reports); the
          report is still written

The signals stay handled from the moment `watch` starts until the report is on disk: an operator's
second Ctrl-C, or systemd's SIGTERM after its SIGINT, never kills fleet with its nodes drained and no
report. `Finishing` is what a part of the run registers while it must finish after a cancel.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import anyio
from anyio.abc import TaskStatus

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Cut(Protocol):
    """What the first signal marks (`fleet.graph.RunState`)."""

    interrupted: bool


@dataclass
class Finishing:
    """Work a run must finish after a cancel, described for the second signal and abandoned at the third.

    `doing()` says what is left ("releasing 12 Slurm nodes", None once nothing is), `bound_s` how long it
    may take at most, and `left_behind` what abandoning it leaves ("them drained"); `abandon()` cancels the
    shielded scopes opened with `shielded()`, and every later one at once."""

    doing: Callable[[], str | None]
    bound_s: float
    left_behind: str
    abandoned: bool = False
    _scopes: set[anyio.CancelScope] = field(default_factory=set)

    @contextmanager
    def shielded(self) -> Iterator[anyio.CancelScope]:
        """A shielded scope that only `abandon` cancels (cancelled at once once abandoned)."""
        scope = anyio.CancelScope(shield=True)
        if self.abandoned:
            scope.cancel()
        self._scopes.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._scopes.discard(scope)

    def abandon(self) -> None:
        self.abandoned = True
        for scope in list(self._scopes):
            scope.cancel()


class Interrupts:
    """Counts the run's SIGINT/SIGTERM and acts on each; see the module docstring."""

    def __init__(self, tell: Callable[[str], None] = say) -> None:
        self.count = 0
        self._tell = tell
        self._run: tuple[anyio.CancelScope, Cut] | None = None
        self._finishing: list[Finishing] = []

    @property
    def interrupted(self) -> bool:
        return self.count > 0

    def cuts(self, scope: anyio.CancelScope, state: Cut) -> None:
        """The run's scope and state: the first signal marks the state interrupted and cancels the scope (at once,
        when one already came)."""
        self._run = scope, state
        if self.count:
            self._cut()

    def _cut(self) -> None:
        if self._run is not None:
            scope, state = self._run
            state.interrupted = True
            scope.cancel()

    def finishing(self, doing: Callable[[], str | None], bound_s: float, left_behind: str) -> Finishing:
        work = Finishing(doing, bound_s, left_behind)
        self._finishing.append(work)
        return work

    async def watch(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Handle SIGINT and SIGTERM until cancelled (the caller's task group, once the report is written).
        Started with `TaskGroup.start`, it returns once the handlers are in place."""
        with anyio.open_signal_receiver(*SIGNALS) as signals:
            task_status.started()
            async for _ in signals:
                self.received()

    def received(self) -> None:
        self.count += 1
        if self.count == 1:
            self._cut()
            return
        left = [(work, what) for work in self._finishing if not work.abandoned if (what := work.doing())]
        if not left:
            self._tell("fleet: already interrupted: ending in-flight commands, then writing the report")
        elif self.count == 2:
            for work, what in left:
                self._tell(f"fleet: still {what} (up to {work.bound_s:g} s); again to abandon {work.left_behind}")
        else:
            for work, what in left:
                self._tell(f"fleet: stopped {what}: left {work.left_behind}; writing the report")
                work.abandon()
