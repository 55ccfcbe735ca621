"""SIGINT, SIGTERM and SIGHUP over a whole run: the first cuts the run short, a later one says what is still
being finished, and only the third SIGINT or SIGTERM abandons it; the report is written whatever comes.

    1st   the run is cancelled: in-flight commands are ended, every host gets its outcome, and what a
          run must finish (a Slurm node's release, `--via srun`'s cleanup) goes on, shielded and bounded
    2nd   one line on stderr: what is still being finished and for how long at most, and what a third
          signal would leave behind (`still releasing 12 Slurm nodes (up to 234 s); again to abandon them
          drained`)
    3rd   SIGINT or SIGTERM: what was being finished is abandoned (each `Finishing` says so in its hosts'
          reports); the report is still written

Only the operator's own signals (SIGINT, SIGTERM) count towards the third: a hang-up cuts the run as the first
would, but never abandons anything, however many signals came before it.

The signals stay handled from the moment `watch` starts until the report is on disk: an operator's
second Ctrl-C, or systemd's SIGTERM after its SIGINT, never kills fleet with its nodes drained and no
report. `Finishing` is what a part of the run registers while it must finish after a cancel.

SIGHUP (the operator's terminal closed, their SSH session to the admin node lost) cuts the run as Ctrl-C
does, after silencing the standard streams that went with the terminal (`fleet.terminal`) and saying so in
one line; a run it cut (`by` SIGHUP) exits 129 (128 + SIGHUP) where SIGINT and SIGTERM exit 130. A hang-up
is one event however many processes relay it (the kernel to the session leader, the shell to its jobs): a
later SIGHUP neither tells nor abandons anything. Outside a run's window (`hangups_unwind`, over the whole
command) a SIGHUP raises `HungUp`, a KeyboardInterrupt: it unwinds as Ctrl-C does (the demo's simulated nodes
are torn down). Under `nohup` SIGHUP stays ignored, as the operator asked.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import anyio
from anyio.abc import TaskStatus

from fleet import terminal
from fleet.terminal import say

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# The operator's interrupt (SIGINT or SIGTERM) that abandons what a cut run still finishes
ABANDON_AT = 3
HANGUP_LINE = ("fleet: terminal hung up (SIGHUP): finishing as for Ctrl-C; run long resets under systemd-run or"
               " tmux")


class HungUp(KeyboardInterrupt):
    """SIGHUP outside a run's window: unwinds as Ctrl-C does; the command exits 129."""


def _hung_up(signum: int, frame: object) -> None:
    terminal.let_go()  # before anything (click's own newline on an interrupt) writes to a dead terminal
    raise HungUp


@contextmanager
def hangups_unwind() -> Iterator[None]:
    """Over a whole command: SIGHUP raises `HungUp` (unless ignored, `nohup`; only the main thread may set it);
    the handler found is put back after."""
    before = signal.getsignal(signal.SIGHUP)
    if before == signal.SIG_IGN or threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.signal(signal.SIGHUP, _hung_up)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, signal.SIG_DFL if before is None else before)


def handled() -> tuple[signal.Signals, ...]:
    """SIGINT and SIGTERM, and SIGHUP unless fleet was started with it ignored (`nohup`: outlive the terminal)."""
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        return SIGNALS
    return (*SIGNALS, signal.SIGHUP)


class Cut(Protocol):
    """What the first signal marks (`fleet.engine.options.RunState`): that it came, and which it was."""

    interrupted: bool
    by: str | None


@dataclass(kw_only=True)
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
    """Counts the run's SIGINT/SIGTERM/SIGHUP and acts on each; see the module docstring."""

    def __init__(self, tell: Callable[[str], None] = say) -> None:
        self.count = 0  # SIGINT and SIGTERM: the operator's interrupts, the third of which abandons
        self.by: signal.Signals | None = None  # the signal that cut the run
        self.hung_up = False
        self._tell = tell
        self._run: tuple[anyio.CancelScope, Cut] | None = None
        self._finishing: list[Finishing] = []

    @property
    def interrupted(self) -> bool:
        return self.count > 0 or self.hung_up

    def cuts(self, scope: anyio.CancelScope, state: Cut) -> None:
        """The run's scope and state: the first signal marks the state interrupted and cancels the scope (at once,
        when one already came)."""
        self._run = scope, state
        if self.interrupted:
            self._cut()

    def _cut(self) -> None:
        if self._run is not None:
            scope, state = self._run
            state.interrupted = True
            state.by = self.by.name if self.by is not None else None
            scope.cancel()

    def finishing(self, doing: Callable[[], str | None], bound_s: float, left_behind: str) -> Finishing:
        work = Finishing(doing=doing, bound_s=bound_s, left_behind=left_behind)
        self._finishing.append(work)
        return work

    async def watch(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Handle SIGINT, SIGTERM and SIGHUP (`handled()`) until cancelled (the caller's task group, once the
        report is written), then put back the handlers found. Started with `TaskGroup.start`, it returns once the
        handlers are in place."""
        wanted = handled()
        before = {signum: signal.getsignal(signum) for signum in wanted}
        try:
            with anyio.open_signal_receiver(*wanted) as signals:
                task_status.started()
                async for signum in signals:
                    self.received(signum)
        finally:
            for signum, handler in before.items():
                if handler is not None:  # None: a handler not set from Python, which asyncio's removal keeps
                    signal.signal(signum, handler)

    def received(self, signum: int = signal.SIGINT) -> None:
        first = not self.interrupted
        if signum == signal.SIGHUP:
            if self.hung_up:
                return
            self.hung_up = True
            terminal.let_go()
            self._tell(HANGUP_LINE)
        else:
            self.count += 1
        self.by = self.by or signal.Signals(signum)
        if first:
            self._cut()
            return
        if signum == signal.SIGHUP:
            return  # a hang-up after the cut: said once, never counted towards abandoning
        left = [(work, what) for work in self._finishing if not work.abandoned if (what := work.doing())]
        if not left:
            self._tell("fleet: already interrupted: ending in-flight commands, then writing the report")
        elif self.count < ABANDON_AT:
            more = "again" if self.count == ABANDON_AT - 1 else "twice more"
            for work, what in left:
                self._tell(f"fleet: still {what} (up to {work.bound_s:g} s); {more} to abandon {work.left_behind}")
        else:
            for work, what in left:
                self._tell(f"fleet: stopped {what}: left {work.left_behind}; writing the report")
                work.abandon()
