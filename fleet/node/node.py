"""A host's transport plus its log and a step budget: every command logged, every command bounded.

`Remote` also decides, per command, whether it needs root (`probes.needs_root`):
steps never say it themselves.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fleet.errors import CommandTimeout
from fleet.inventory.host import Host
from fleet.node import probes
from fleet.report.models import StepName
from fleet.transport.base import RELEASE_TIMEOUT_S, CommandResult, Held, Transport

# Output kept per stream in the per-node log.
LOG_OUTPUT_LIMIT = 4096


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


def _clip_for_log(text: str) -> str:
    if len(text) <= LOG_OUTPUT_LIMIT:
        return text
    return text[:LOG_OUTPUT_LIMIT] + f"[... {len(text) - LOG_OUTPUT_LIMIT} more characters]"


class Remote:
    """What the steps talk to: one host, its transport, its log."""

    def __init__(self, host: Host, transport: Transport, log: Any) -> None:
        self.host = host
        self.transport = transport
        self.log = log
        self.commands = 0

    async def run(self, argv: Sequence[str], *, step: StepName | None = None,
                  budget: Budget | None = None) -> CommandResult:
        """Run one command bounded by command_timeout and the step's budget; log it either way."""
        limit = self.host.command_timeout
        timeout = budget.command_timeout(limit) if budget else limit
        self.commands += 1
        try:
            result = await self.transport.run(argv, timeout=timeout, privileged=probes.needs_root(argv))
        except CommandTimeout as exc:
            self._log_result(exc.result, step, timeout, timed_out=True)
            raise
        self._log_result(result, step, timeout, timed_out=False)
        return result

    async def hold(self, argv: Sequence[str], *, timeout: float) -> Held:
        """Start a long-lived command (see `Transport.hold`); it is logged when it ends."""
        self.commands += 1
        started = time.monotonic()
        try:
            held = await self.transport.hold(argv, timeout=timeout, privileged=probes.needs_root(argv))
        except CommandTimeout as exc:
            self._log_result(exc.result, None, timeout, timed_out=True)
            raise
        if held.result is not None:
            self._log_result(held.result, None, timeout, timed_out=False)
            return held
        return Held(held.first_line, release=lambda: self._release(held, argv, timeout, started))

    async def _release(self, held: Held, argv: Sequence[str], timeout: float, started: float) -> CommandResult | None:
        """Release a held command and log how it ended; one that had to be killed is logged as such
        (its duration, like every command's, counted from its start)."""
        result = await held.release()
        if result is not None:
            self._log_result(result, None, timeout, timed_out=False)
            return result
        self._log_result(CommandResult(tuple(argv), None, "", "", time.monotonic() - started, "KILL"), None,
                         timeout, timed_out=True, note=f"did not end within {RELEASE_TIMEOUT_S:g} s of release: killed")
        return None

    def _log_result(self, result: CommandResult, step: StepName | None, timeout: float, *, timed_out: bool,
                    note: str | None = None) -> None:
        where: dict[str, str] = {"step": str(step)} if step is not None else {}
        if note:
            where["note"] = note
        self.log.info(
            "command",
            **where,
            argv=list(result.argv),
            exit_status=result.exit_status,
            signal=result.signal,
            timed_out=timed_out,
            timeout_s=round(timeout, 3),
            duration_s=round(result.duration_s, 4),
            stdout=_clip_for_log(result.stdout),
            stderr=_clip_for_log(result.stderr),
        )
