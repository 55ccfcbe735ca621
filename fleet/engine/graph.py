"""The task graph: every targeted host walks its steps (`fleet.engine.walk`) at once, within the run's bounds.

One anyio task group; one task per host; a CapacityLimiter bounds how many hosts
have remote work in flight (from their first command to their last, connect
included). Hosts start in waves (`--batch`, the `--canary` wave first; the
arithmetic is `fleet.engine.waves`); once the failure budget (`--max-fail`) is spent
or the canary failed, no new host starts. A failure is caught at the host
boundary and becomes that host's outcome; cancellation never is. The run
deadline (`--deadline`) and an interrupt (SIGINT/SIGTERM) cancel every host,
close connections (shielded) and still yield a full report.

A `Scheduler` (chosen by name from `fleet.engine.schedulers`; Slurm's is `fleet.slurm.lifecycle`) wraps each host's
walk: it admits each wave before it starts (drains its nodes), keeps each host until its node runs no job
(outside the concurrency limit: a host waiting for a job holds no slot), and releases each host once it has its
outcome, also when the run is cut short. It returns what it decided (a `SchedulerRecord` per host, and whether a
host may start); the graph records it on the host.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime

import anyio
import anyio.lowlevel

from fleet.engine.interrupts import Interrupts
from fleet.engine.options import Deadline, RunOptions, RunState
from fleet.engine.schedulers import Scheduler
from fleet.engine.walk import HostEnded, HostRun, Watch, walk_host, worst_by_phase
from fleet.engine.waves import FailureBudget, split_waves, tolerated
from fleet.inventory.host import Connection, Host
from fleet.inventory.nodesets import fold
from fleet.model.errors import TransportError
from fleet.model.hostlog import HostLog, NoLog
from fleet.model.report import HostReport, HostStatus, Reason, RunReport
from fleet.node.node import Node
from fleet.runlog.folder import RunLogs
from fleet.transport import Transport, connect
from fleet.transport.base import notes_of

Connector = Callable[[Host], Awaitable[Transport]]
CLOSE_TIMEOUT_S = 5.0


async def _close(transport: Transport, log: HostLog) -> None:
    """Close the host's session (shielded, bounded); a close that fails is logged, never the host's outcome."""
    try:
        with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
            await transport.close()
    except Exception:
        log.exception("close_error")


async def _host_task(run: HostRun, options: RunOptions, gate: Gate, logs: RunLogs, connector: Connector,
                     scheduler: Scheduler | None, on_host_end: HostEnded | None = None) -> None:
    """One host from start to outcome. The host boundary: whatever it raises (but a cancel) is its outcome."""
    log: HostLog | None = None
    try:
        if scheduler is not None:
            log = logs.host_logger(run.host.name)
            ready = await scheduler.ready(run, log)
            run.scheduler = ready.record
            if ready.outcome is not None:
                run.finish(*ready.outcome)
                return
        async with gate.limiter:
            if gate.state.stopped:
                run.finish(HostStatus.SKIPPED, gate.state.stopped, Reason.STOPPED)
                return
            run.started = time.monotonic()
            log = log or logs.host_logger(run.host.name)
            where = ({"address": run.host.address, "port": run.host.port} if run.host.connection == Connection.SSH
                     else {"connection": str(run.host.connection)})
            log.info("host_start", command=options.mode.command, **where)
            await _connected_walk(run, options, log, connector, logs.run_id, gate.state.why_cut)
    except Exception as exc:  # connect, the log, a bug: one host never stops the others
        _internal_error(run, log, exc, run.current or ("connect" if run.started else "start"))
    finally:
        gate.count(run)
        cut = gate.state.cut_short(), gate.state.cut_reason()
        if scheduler is not None:
            await _release(scheduler, run, run.report(*cut), log or NoLog())
        report = run.report(*cut, run_started=gate.state.started)  # after the release: the Slurm state it left
        if run.status is not None:
            run.final = report  # it ended: the run's report has it so (one cut short waits for what cut the run)
        _log_end(log, report)
        if on_host_end is not None:
            with suppress(Exception):  # the history is never the host's outcome
                on_host_end(report)


async def _admit(scheduler: Scheduler, wave: Sequence[HostRun]) -> None:
    """Admit a wave whole or not at all: not once the run is cut short; shielded once begun, so that no node is
    drained without its host's task, whose end (`_release`) gives it back."""
    await anyio.lowlevel.checkpoint()
    with anyio.CancelScope(shield=True):
        records = await scheduler.admit(wave)
    for run in wave:
        run.scheduler = records.get(run.host.name)


async def _release(scheduler: Scheduler, run: HostRun, report: HostReport, log: HostLog) -> None:
    """The scheduler's end of a host: never the host's outcome, never the run's end."""
    try:
        record = await scheduler.release(run, report, log)
        if record is not None:
            run.scheduler = record
    except Exception:
        if log is not None:
            with suppress(OSError, ValueError):
                log.exception("internal_error", step="release")


async def _connected_walk(run: HostRun, options: RunOptions, log: HostLog, connector: Connector, run_id: str,
                          why_cut: Callable[[], str | None]) -> None:
    try:
        transport = await connector(run.host)
    except TransportError as exc:
        log.warning("unreachable", error=str(exc), reason=exc.reason.value)
        run.finish(HostStatus.UNREACHABLE, str(exc), exc.reason)
        return
    try:
        for note in notes_of(transport):  # what connecting saw (known_hosts lines skipped), once per host
            log.warning(note.event, **note.fields)
        await walk_host(Node(run.host, transport, log, why_cut), run, options.mode, run_id,
                        stop_units=options.stop_units, gpu_reset=options.gpu_reset,
                        restore_settings=options.restore_settings)
    except TransportError as exc:
        run.finish(HostStatus.FAILED, exc.during(run.current), exc.reason)
        log.error("transport_error", step=str(run.current), error=str(exc))
    except Exception as exc:  # the host boundary: one host's bug never stops the others
        _internal_error(run, log, exc, run.current)
    finally:
        await _close(transport, log)


def _internal_error(run: HostRun, log: HostLog | None, exc: Exception, where: object) -> None:
    """A host's bug becomes its `failed` outcome with one line; the traceback goes to its log (when it has one).

    Called in the `except` block, so that the log finds the exception being handled.
    """
    lines = str(exc).strip().splitlines()
    run.finish(HostStatus.FAILED, f"internal error during {where}: {type(exc).__name__}: {lines[0] if lines else ''}",
               Reason.INTERNAL)
    if log is not None:
        with suppress(OSError, ValueError):  # a log that cannot be written: the report still says it
            log.exception("internal_error", step=str(where))


def _log_end(log: HostLog | None, report: HostReport) -> None:
    if log is not None:
        with suppress(OSError, ValueError):  # a log that cannot be written: the report still says it
            log.info("host_end", status=str(report.status), reason=report.reason, error=report.error,
                     duration_s=report.duration_s)


class Unlimited:
    """The limiter of a run whose hosts may all have remote work in flight at once (no `--concurrency` below their
    number): no host ever waits, so none asks a CapacityLimiter (each acquire costs a turn of the event loop); a
    host whose run was cut short before it began still never begins."""

    async def __aenter__(self) -> None:
        await anyio.lowlevel.checkpoint_if_cancelled()

    async def __aexit__(self, *exc_info: object) -> None:
        return None


@dataclass
class Gate:
    """What decides whether a host may start: the concurrency limiter and the failure budget."""

    limiter: anyio.CapacityLimiter | Unlimited
    budget: FailureBudget
    state: RunState

    def count(self, run: HostRun) -> None:
        """Count a finished host against the budget; once spent, no new host starts."""
        if run.status in (HostStatus.FAILED, HostStatus.UNREACHABLE):
            self.budget.note_failure()
            if self.budget.spent and not self.state.stopped:
                self.state.stopped = self.budget.reason()


def host_runs(hosts: Sequence[Host], options: RunOptions) -> list[HostRun]:
    """Each host's progress as a run begins, with how long it can take where it may go wrong (`worst_by_phase`)."""
    return [HostRun(host=h, worst_by_phase=worst_by_phase(h, options.mode, stop_units=options.stop_units,
                                                          gpu_reset=options.gpu_reset,
                                                          restore_settings=options.restore_settings)) for h in hosts]


async def run_hosts(
    hosts: Sequence[Host], options: RunOptions, logs: RunLogs, *, connector: Connector = connect,
    scheduler: Scheduler | None = None, on_host_end: HostEnded | None = None, interrupts: Interrupts | None = None,
    watch: Watch | None = None,
) -> tuple[RunReport, RunState]:
    """Run the command on every host (in waves when asked); always return a full report. `on_host_end` is told
    each host's report as the host finishes."""
    runs = host_runs(hosts, options)

    async def body(state: RunState) -> None:
        await _run_waves(runs, options, logs, connector, state, scheduler, on_host_end)

    return await run_bounded(runs, options, logs.run_id, body, interrupts, watch)


async def run_bounded(runs: Sequence[HostRun], options: RunOptions, run_id: str,
                      body: Callable[[RunState], Awaitable[None]],
                      interrupts: Interrupts | None = None, watch: Watch | None = None) -> tuple[RunReport, RunState]:
    """Run `body` within the run's bounds (the deadline, and the signals `interrupts` hears: both cancel it); then
    the full report of every host, those the run cut short included.

    `interrupts`: the caller's, whose handlers the caller installed (`Interrupts.watch`) and keeps until its report
    is written; `watch`: the caller's view of the hosts as they go (the CLI's progress line), cancelled as the run
    ends."""
    started_at, t0 = datetime.now(UTC).isoformat(timespec="seconds"), time.monotonic()
    state = RunState(deadline=Deadline(options.deadline_s), started=t0)
    async with anyio.create_task_group() as outer:
        if interrupts is not None:
            interrupts.cuts(outer.cancel_scope, state)
        if watch is not None:
            outer.start_soon(watch, {r.host.name: r for r in runs})
        with anyio.move_on_after(state.deadline.start()) as deadline:
            await body(state)
        state.deadline.hit = deadline.cancelled_caught
        outer.cancel_scope.cancel()
    cut_short, cut_reason = state.cut_short(), state.cut_reason()
    for run in runs:
        if run.status is None and run.started is None and state.stopped:
            run.finish(HostStatus.SKIPPED, state.stopped, Reason.STOPPED)
    report = RunReport(
        run_id=run_id, command=options.mode.command, started_at=started_at,
        duration_s=round(time.monotonic() - t0, 3),
        interrupted_by=(state.by or "signal") if state.interrupted else None, cut_short=state.why_cut(),
        stopped=state.stopped,
        hosts={r.host.name: r.final if r.final is not None else r.report(cut_short, cut_reason, run_started=t0)
               for r in runs},
    )
    return report, state


async def _run_waves(runs: list[HostRun], options: RunOptions, logs: RunLogs, connector: Connector,
                     state: RunState, scheduler: Scheduler | None, on_host_end: HostEnded | None = None) -> None:
    width = options.concurrency or len(runs)
    limiter = anyio.CapacityLimiter(max(1, width)) if width < len(runs) else Unlimited()
    gate = Gate(limiter, FailureBudget(tolerated(options.max_fail, len(runs))), state)
    waves = split_waves(runs, options.batch, options.canary)
    async with anyio.create_task_group() as group:
        if scheduler is not None:
            group.start_soon(scheduler.serve)
        for number, wave in enumerate(waves):
            if state.stopped:
                break
            if scheduler is not None:
                await _admit(scheduler, wave)
            async with anyio.create_task_group() as hosts_group:
                for run in wave:
                    hosts_group.start_soon(_host_task, run, options, gate, logs, connector, scheduler, on_host_end)
            if number == 0 and options.canary and not state.stopped:
                state.stopped = _canary_verdict(wave)
        group.cancel_scope.cancel()


def _canary_verdict(wave: Sequence[HostRun]) -> str | None:
    """Why the run stops after the canary wave, or None when every canary host passed: ended clean, or, in a
    dry run, planned."""
    bad = [r.host.name for r in wave if r.status not in (HostStatus.CLEAN, HostStatus.PLANNED)]
    if not bad:
        return None
    return f"canary failed on {fold(bad)}: no other host started"
