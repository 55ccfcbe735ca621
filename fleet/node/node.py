"""A node as the steps see it: one host, its transport and its log. It runs probes, bounded and logged.

`Node.ask(probe)` runs a probe within the host's command_timeout and the step's budget, through `sudo -n`
when the probe needs root (on a `become` host), logs the command, checks its exit status and parses what it
printed. Every failure is a `StepFailed` with one line; a transport that gives no answer raises
`TransportError` (the host's boundary deals with it).
"""

from __future__ import annotations

import time
from typing import Any, TypeVar

from fleet.errors import CommandTimeout, StepFailed
from fleet.inventory.host import Host
from fleet.node.budget import Budget
from fleet.node.probe import Probe
from fleet.report.models import Reason, StepName, StepStatus
from fleet.transport.base import RELEASE_TIMEOUT_S, CommandResult, Held, Transport, clip

T = TypeVar("T")
# Output kept per stream in the per-node log.
LOG_OUTPUT_LIMIT = 4096


class Node:
    """What the steps talk to: one host, its transport, its log."""

    def __init__(self, host: Host, transport: Transport, log: Any) -> None:
        self.host = host
        self.transport = transport
        self.log = log
        self.commands = 0

    async def ask(self, probe: Probe[T], *, step: StepName | None = None, budget: Budget | None = None) -> T:
        """Run the probe (see `run`) and parse its stdout; unreadable output fails the step."""
        return probe.read(await self.run(probe, step=step, budget=budget))

    async def run(self, probe: Probe[Any], *, step: StepName | None = None,
                  budget: Budget | None = None) -> CommandResult:
        """Run one probe bounded by command_timeout and the step's budget; log it either way.

        An exit status the probe does not call an answer fails the step; so does a hang of a probe
        that says what a hang means (`Probe.hang`).
        """
        limit = self.host.command_timeout
        timeout = budget.command_timeout(limit) if budget else limit
        self.commands += 1
        try:
            result = await self.transport.run(probe.argv, timeout=timeout, privileged=probe.needs_root)
        except CommandTimeout as exc:
            self._log_result(exc.result, step, timeout, timed_out=True)
            if probe.hang is not None:
                raise StepFailed(probe.hang.format(s=f"{exc.deadline_s:g}"), StepStatus.TIMEOUT,
                                 Reason.COMMAND_TIMEOUT) from exc
            raise
        self._log_result(result, step, timeout, timed_out=False)
        if not probe.answered(result):
            raise StepFailed(probe.failure(result))
        return result

    async def hold(self, probe: Probe[Any], *, timeout: float) -> Held:
        """Start a long-lived command (see `Transport.hold`); it is logged when it ends."""
        self.commands += 1
        started = time.monotonic()
        try:
            held = await self.transport.hold(probe.argv, timeout=timeout, privileged=probe.needs_root)
        except CommandTimeout as exc:
            self._log_result(exc.result, None, timeout, timed_out=True)
            raise
        if held.result is not None:
            self._log_result(held.result, None, timeout, timed_out=False)
            return held
        return Held(held.first_line, release=lambda: self._release(held, probe.argv, timeout, started))

    async def _release(self, held: Held, argv: tuple[str, ...], timeout: float,
                       started: float) -> CommandResult | None:
        """Release a held command and log how it ended; one that had to be killed is logged as such
        (its duration, like every command's, counted from its start)."""
        result = await held.release()
        if result is not None:
            self._log_result(result, None, timeout, timed_out=False)
            return result
        self._log_result(CommandResult(argv, None, "", "", time.monotonic() - started, "KILL"), None,
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
            stdout=clip(result.stdout, LOG_OUTPUT_LIMIT),
            stderr=clip(result.stderr, LOG_OUTPUT_LIMIT),
        )
