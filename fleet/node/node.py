"""A node as the steps see it: one host, its transport and its log. It runs probes, bounded and logged.

`Node.ask(probe)` runs a probe within its bound (`fleet.node.bounds`: the host's command_timeout, nvidia-smi's for
a probe that asks the GPU driver) and the step's budget, through `sudo -n`
when the probe needs root (on a `become` host), logs the command, checks its exit status and parses what it
printed. Every failure is a `StepFailed` with one line; a transport that gives no answer raises
`TransportError` (the host's boundary deals with it).

`Node.batch(probes)` runs several probes in one remote command (`fleet.transport.batch`), one a privilege, and
returns `Answers`: each probe is then read exactly as `ask` would have read it alone (its own exit status,
timeout and parse), so one probe's failure never spoils another's answer.

A driver asked once: once a probe that asks the GPU driver (nvidia-smi) has run past its own bound, the node's
driver is suspect for the rest of the run (`Node.driver_hung` says when and how long it was waited for). No
later probe asks it again: each is answered at once with `driver_suspect`'s line, while the probes that do not
ask the driver (the process scan, the kill, the kernel log) still run. A wedged driver costs the host one
nvidia-smi bound, not one a step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from fleet.inventory.host import Host
from fleet.model.errors import CommandTimeout, StepFailed
from fleet.model.hostlog import HostLog
from fleet.model.outcomes import Reason, StepName, StepStatus
from fleet.node import bounds
from fleet.node.bounds import Bound
from fleet.node.budget import TimeBudget
from fleet.node.probe import Probe
from fleet.transport import batch as framing
from fleet.transport.base import RELEASE_TIMEOUT_S, CommandResult, OpenCommand, Transport, clip

T = TypeVar("T")
# Output kept per stream in the per-node log.
LOG_OUTPUT_LIMIT = 4096


def is_remote_command(event: Mapping[str, object]) -> bool:
    """Whether a per-node log event stands for one remote command: a `batch` (its sections are `command` events
    that name it), or a `command` that ran on its own."""
    return event.get("event") == "batch" or (event.get("event") == "command" and "batch" not in event)


class Node:
    """What the steps talk to: one host, its transport, its log."""

    def __init__(self, host: Host, transport: Transport, log: HostLog,
                 why_cut: Callable[[], str | None] = lambda: None) -> None:
        self.host = host
        self.transport = transport
        self.log = log
        self.why_cut = why_cut  # what cut the run short (a signal, the deadline) once it has; None before
        self.commands = 0
        self.batches = 0
        self.driver_hung: str | None = None  # how the driver's first hang went; None while it has answered

    def _driver_hung(self, probe: Probe[Any], bound: Bound, step: StepName | None) -> None:
        """Note that this driver probe ran past its own bound (a step's budget that ended it is no hang): the
        driver is suspect from now on. Logged once, as `driver_suspect`."""
        if probe.driver and not bounds.is_budget(bound.name) and self.driver_hung is None:
            where = f" in {step}" if step is not None else ""
            self.driver_hung = f"{probe.what} did not answer within {bound}{where}"
            self.log.warning("driver_suspect", error=self.driver_hung)

    def _not_asked(self, probe: Probe[Any], step: StepName | None) -> StepFailed:
        """A driver probe not run because the driver is suspect: its failure, logged as a `not_asked` event (never
        a `command`: nothing ran, and the log's commands are what ran on the node)."""
        where: dict[str, str] = {"step": str(step)} if step is not None else {}
        self.log.info("not_asked", **where, argv=list(probe.argv), why=self.driver_hung)
        return StepFailed(driver_suspect(self.driver_hung or ""), StepStatus.TIMEOUT, Reason.COMMAND_TIMEOUT)

    async def ask(self, probe: Probe[T], *, step: StepName | None = None, budget: TimeBudget | None = None) -> T:
        """Run the probe (see `run`) and parse its stdout; unreadable output fails the step."""
        return probe.read(await self.run(probe, step=step, budget=budget))

    async def run(self, probe: Probe[Any], *, step: StepName | None = None,
                  budget: TimeBudget | None = None) -> CommandResult:
        """Run one probe within its bound and the step's budget; log it either way.

        An exit status the probe does not call an answer fails the step; so does a hang of a probe
        that says what a hang means (`Probe.hang`). A timeout names the bound that ended the command.
        """
        if probe.driver and self.driver_hung is not None:
            raise self._not_asked(probe, step)
        bound = bounds.within(bounds.of(self.host, probe.driver), budget, step)
        timeout = bound.seconds
        self.commands += 1
        started = time.monotonic()
        try:
            result = await self.transport.run(probe.argv, timeout=timeout, privileged=probe.needs_root)
        except anyio.get_cancelled_exc_class():
            self._log_cut_short("command", probe.argv, step, timeout, started)
            raise
        except CommandTimeout as exc:
            self._log_result(exc.result, step, timeout, timed_out=True, bound=bound.name)
            self._driver_hung(probe, bound, step)
            named = CommandTimeout(exc.result, exc.deadline_s, bound.name)
            if probe.hang is not None:
                raise StepFailed(hang_line(probe, named), StepStatus.TIMEOUT, Reason.COMMAND_TIMEOUT) from exc
            raise named from exc
        self._log_result(result, step, timeout, timed_out=False)
        if not probe.answered(result):
            raise StepFailed(probe.failure(result))
        return result

    async def batch(self, probes: Sequence[Probe[Any] | tuple[Probe[Any], Bound]], *, step: StepName | None = None,
                    budget: TimeBudget | None = None) -> Answers:
        """Run the probes in one remote command a privilege (on a `become` host, those that need root in one
        through sudo, the rest in another); read each with `Answers.read`. A probe given as (probe, bound)
        gets that bound instead of its own (`fleet.node.bounds.of`). A batch costs one command; its sections are
        logged as commands of their own (`batch` names the batch), the wire command as a `batch` event."""
        asked = [p if isinstance(p, tuple) else (p, bounds.of(self.host, p.driver)) for p in probes]
        if len({id(p) for p, _ in asked}) < len(asked):  # answers are the probe's: one would hide the other's
            raise ValueError("a batch asks the same probe twice (probes are made once and shared: ask it once)")
        answers: dict[int, CommandResult | CommandTimeout | StepFailed] = {}
        if self.driver_hung is not None:  # the driver is suspect: its probes are answered here, the rest run
            answers.update({id(p): self._not_asked(p, step) for p, _ in asked if p.driver})
            asked = [(p, b) for p, b in asked if not p.driver]
        groups = [[a for a in asked if a[0].needs_root == root] for root in (True, False)] if self.host.become \
            else [asked]
        for group in groups:
            if group:
                answers.update(await self._batch(group, step, budget))
        return Answers(answers)

    async def _batch(self, asked: Sequence[tuple[Probe[Any], Bound]], step: StepName | None,
                     budget: TimeBudget | None) -> dict[int, CommandResult | CommandTimeout | StepFailed]:
        limits = [bounds.within(limit, budget, step) for _, limit in asked]
        tag, self.commands, self.batches = framing.new_tag(), self.commands + 1, self.batches + 1
        argv = framing.batch_argv([(b.seconds, p.argv) for (p, _), b in zip(asked, limits, strict=True)])
        whole = framing.batch_timeout([b.seconds for b in limits])
        timeout = budget.command_timeout(whole) if budget else whole  # never past the step's end either
        privileged = any(p.needs_root for p, _ in asked)
        started = time.monotonic()
        try:
            result = await self.transport.run(argv, timeout=timeout, privileged=privileged,
                                              stdin=framing.batch_input(tag))
            timed_out = False
        except anyio.get_cancelled_exc_class():
            self._log_cut_short("batch", argv, step, timeout, started, asked=[p.what for p, _ in asked])
            raise
        except CommandTimeout as exc:
            result, timed_out = exc.result, True
        self._log_batch(result, step, timeout, timed_out, len(asked))
        found = framing.answers(tag, len(asked), result.stdout, result.stderr)
        answers: dict[int, CommandResult | CommandTimeout | StepFailed] = {}
        hung: str | None = None  # the section that timed out, and its bound: the ones after it never ran
        spent = _spent(budget, step, timeout) if timed_out and timeout < whole else None
        where = _where(step, batch=self.batches)  # the leading fields of each section that ran within its bound
        for index, ((probe, _), bound, section) in enumerate(zip(asked, limits, found, strict=True)):
            if section is None and spent is not None:  # the step's time ran out, not the section's own bound
                answers[id(probe)] = self._cut(probe, bound, result, spent, framing.opened(tag, index, result.stdout),
                                               step)
                continue
            if section is None:
                answers[id(probe)] = self._no_section(probe, bound, result, timed_out, hung, step)
                if timed_out and hung is None and framing.opened(tag, index, result.stdout):
                    self._driver_hung(probe, bound, step)  # it was running when the batch's own bound ended it
                continue
            answer = self._section_answer(probe, bound, section, result, step, where)
            answers[id(probe)] = answer
            if isinstance(answer, CommandTimeout):
                hung = f"{probe.what} timed out after {bound}"
        return answers

    def _section_answer(self, probe: Probe[Any], bound: Bound, section: framing.Said, batch: CommandResult,
                        step: StepName | None, where: Mapping[str, object]) -> CommandResult | CommandTimeout:
        """One section (`framing.answers`) as its own command's result; a CommandTimeout (naming its bound) when
        its own `timeout` ended it (its event then names the bound too). `where`: the batch's leading fields."""
        status, stdout, stderr, ran_s = section
        result = CommandResult(argv=probe.argv, exit_status=status, stdout=stdout, stderr=stderr,
                               duration_s=batch.duration_s)
        if not framing.bound_fired(status, ran_s, bound.seconds):
            self._log_command(result, where, bound.seconds, timed_out=False)
            return result
        self._log_result(result, step, bound.seconds, timed_out=True, batch=self.batches, bound=bound.name)
        self._driver_hung(probe, bound, step)
        return CommandTimeout(result, bound.seconds, bound.name)

    def _no_section(self, probe: Probe[Any], bound: Bound, batch: CommandResult, batch_timed_out: bool,
                    hung: str | None, step: StepName | None) -> CommandTimeout | StepFailed:
        """A section with no complete frame: no answer, never an empty one. Why, in this order: an earlier
        section timed out (this one never ran), the batch itself timed out, or its output was cut (the
        transport's bound) or it ended early: unreadable."""
        cut = CommandResult(argv=probe.argv, exit_status=None, stdout="", stderr="", duration_s=batch.duration_s,
                            signal=batch.signal)
        if hung is not None:
            note = f"not run: {hung} before it in the batch"
            failure = StepFailed(f"{probe.what} not run: {hung}", StepStatus.TIMEOUT, Reason.COMMAND_TIMEOUT)
        elif batch_timed_out:
            self._log_result(cut, step, bound.seconds, timed_out=True, batch=self.batches,
                             note="no answer: the batch timed out before this section ended", bound=bound.name)
            return CommandTimeout(cut, bound.seconds, bound.name)
        else:
            note = f"no complete answer: the batch's output was cut or it ended early (exit {batch.exit_status})"
            failure = StepFailed(probe.unreadable(note))
        self._log_result(cut, step, bound.seconds, timed_out=False, batch=self.batches, note=note)
        return failure

    def _cut(self, probe: Probe[Any], bound: Bound, batch: CommandResult, spent: str, running: bool,
             step: StepName | None) -> StepFailed:
        """A section the step's budget ended before its own bound could (it was running), or kept from running:
        said so, never as a hang of its bound."""
        why = f"cut: {spent}" if running else f"not run: {spent}"
        self._log_result(CommandResult(argv=probe.argv, exit_status=None, stdout="", stderr="",
                                       duration_s=batch.duration_s, signal=batch.signal), step,
                         bound.seconds, timed_out=running, batch=self.batches, note=why)
        return StepFailed(f"{probe.what} {why}", StepStatus.TIMEOUT, Reason.COMMAND_TIMEOUT)

    async def open_command(self, probe: Probe[Any], *, timeout: float) -> OpenCommand:
        """Start a long-lived command (see `Transport.open_command`); it is logged when it ends."""
        self.commands += 1
        started = time.monotonic()
        try:
            held = await self.transport.open_command(probe.argv, timeout=timeout, privileged=probe.needs_root)
        except CommandTimeout as exc:
            self._log_result(exc.result, None, timeout, timed_out=True)
            raise
        if held.result is not None:
            self._log_result(held.result, None, timeout, timed_out=False)
            return held
        return OpenCommand(held.first_line, release=lambda: self._release(held, probe.argv, timeout, started))

    async def _release(self, held: OpenCommand, argv: tuple[str, ...], timeout: float,
                       started: float) -> CommandResult | None:
        """Release a held command and log how it ended; one that had to be killed is logged as such
        (its duration, like every command's, counted from its start)."""
        result = await held.release()
        if result is not None:
            self._log_result(result, None, timeout, timed_out=False)
            return result
        self._log_result(CommandResult(argv=argv, exit_status=None, stdout="", stderr="",
                                       duration_s=time.monotonic() - started, signal="KILL"), None,
                         timeout, timed_out=True, note=f"did not end within {RELEASE_TIMEOUT_S:g} s of release: killed")
        return None

    def _log_cut_short(self, event: str, argv: Sequence[str], step: StepName | None, timeout: float, started: float,
                       **more: object) -> None:
        """A command (or a batch) the run cancelled while it ran: still one event in the log, with how long it had
        run and what ended it (`ended`: the interrupt, the run's deadline; `cancelled` when the run was not cut
        short). Its transport ends it on the node (`fleet.transport.base`); it has no exit status."""
        where: dict[str, object] = {"step": str(step)} if step is not None else {}
        if event == "batch":
            where["batch"] = self.batches
        with suppress(OSError, ValueError):  # a log that cannot be written never stands in the cancel's way
            self.log.warning(event, **where, argv=list(argv), exit_status=None, timed_out=False,
                             timeout_s=round(timeout, 3), duration_s=round(time.monotonic() - started, 4),
                             ended=self.why_cut() or "cancelled", **more)

    def _log_batch(self, result: CommandResult, step: StepName | None, timeout: float, timed_out: bool,
                   sections: int) -> None:
        """The wire command of a batch: its own exit status and duration; what each section printed is in
        the section's `command` event (the frames themselves are not logged again)."""
        where: dict[str, str] = {"step": str(step)} if step is not None else {}
        self.log.info("batch", **where, batch=self.batches, sections=sections, argv=list(result.argv),
                      exit_status=result.exit_status, signal=result.signal, timed_out=timed_out,
                      timeout_s=round(timeout, 3), duration_s=round(result.duration_s, 4))

    def _log_result(self, result: CommandResult, step: StepName | None, timeout: float, *, timed_out: bool,
                    note: str | None = None, batch: int | None = None, bound: str | None = None) -> None:
        """A `command` event; one that timed out names the bound that ended it (`bound`), when known."""
        self._log_command(result, _where(step, note, bound, batch), timeout, timed_out)

    def _log_command(self, result: CommandResult, where: Mapping[str, object], timeout: float,
                     timed_out: bool) -> None:
        """A `command` event after its leading fields (`where`: `_where`'s, made once for a batch's sections)."""
        out, err = result.stdout, result.stderr
        self.log.info("command", **where, argv=list(result.argv), exit_status=result.exit_status,
                      signal=result.signal, timed_out=timed_out, timeout_s=round(timeout, 3),
                      duration_s=round(result.duration_s, 4),
                      stdout=out if len(out) <= LOG_OUTPUT_LIMIT else clip(out, LOG_OUTPUT_LIMIT),
                      stderr=err if len(err) <= LOG_OUTPUT_LIMIT else clip(err, LOG_OUTPUT_LIMIT))


@dataclass(frozen=True)
class Answers:
    """What each probe of a batch answered, read as `Node.ask` would have read it alone."""

    by_probe: dict[int, CommandResult | CommandTimeout | StepFailed]

    def result(self, probe: Probe[Any]) -> CommandResult:
        """The probe's result; its timeout (StepFailed with `hang`, else CommandTimeout) or an exit status
        it does not call an answer (StepFailed) raised here, for this probe alone."""
        answer = self.by_probe[id(probe)]
        if isinstance(answer, StepFailed):
            raise answer
        if isinstance(answer, CommandTimeout):
            if probe.hang is not None:
                raise StepFailed(hang_line(probe, answer), StepStatus.TIMEOUT, Reason.COMMAND_TIMEOUT) from answer
            raise answer
        if not probe.answered(answer):
            raise StepFailed(probe.failure(answer))
        return answer

    def read(self, probe: Probe[T]) -> T:
        return probe.read(self.result(probe))


def _where(step: StepName | None, note: str | None = None, bound: str | None = None,
           batch: int | None = None) -> dict[str, object]:
    """A `command` event's leading fields, those it has, in their order: step, note, bound, batch."""
    where: dict[str, object] = {"step": str(step)} if step is not None else {}
    if note:
        where["note"] = note
    if bound is not None:
        where["bound"] = bound
    if batch is not None:
        where["batch"] = batch
    return where


def driver_suspect(hung: str) -> str:
    """The line of a driver probe not asked because an earlier one hung (`hung`: `Node.driver_hung`)."""
    return f"{hung}, not asked again: driver may be wedged; {bounds.WEDGED_REMEDY}"


def hang_line(probe: Probe[Any], timeout: CommandTimeout) -> str:
    """The probe's `hang` line for this timeout: its seconds and the bound that set them. A bound that was what
    was left of the step's budget did not fire on a hang of the command's own: the step's time ran out."""
    if bounds.is_budget(timeout.bound):
        return f"{probe.what} did not answer within {timeout.deadline_s:g} s ({timeout.bound}): the step's time ran out"
    return (probe.hang or "").format(s=f"{timeout.deadline_s:g}", bound=timeout.bound or bounds.COMMAND)


def _spent(budget: TimeBudget | None, step: StepName | None, timeout: float) -> str:
    """Why a batch the step's budget bounded was ended: the step's time ran out (its budget, and what was left)."""
    whose = f"{step}'s" if step is not None else "the step's"
    total = f" {budget.seconds:g} s" if budget is not None else ""
    return f"{whose} time ran out (what was left of its{total} budget: {timeout:g} s)"
