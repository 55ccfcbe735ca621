"""The task graph: every targeted host walks drain -> kill -> settle -> verify at once.

One anyio task group; one task per host; a CapacityLimiter bounds how many hosts
have remote work in flight (from their first command to their last, connect
included). A failure is caught at the host boundary and becomes that host's
outcome; cancellation never is. A run-level interrupt cancels every host,
closes connections (shielded) and still yields a full report.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio

from fleet import steps
from fleet.connect import connect
from fleet.errors import CommandTimeout, TransportError
from fleet.logs import RunLogs
from fleet.models import (
    GpuReport,
    Host,
    HostReport,
    HostStatus,
    KilledProcess,
    RunReport,
    StepName,
    StepResult,
    StepStatus,
)
from fleet.plan import plan_steps
from fleet.remote import BudgetSpent, Remote
from fleet.transport import Transport

Connector = Callable[[Host], Awaitable[Transport]]
CLOSE_TIMEOUT_S = 5.0
RESET_STEPS = (StepName.DRAIN, StepName.KILL, StepName.SETTLE)


@dataclass
class HostRun:
    """The mutable progress of one host; frozen into a HostReport at the end."""

    host: Host
    started: float | None = None
    ended: float | None = None
    status: HostStatus | None = None
    error: str | None = None
    current: StepName | None = None
    steps: list[StepResult] = field(default_factory=list)
    killed: tuple[KilledProcess, ...] = ()
    gpus: tuple[GpuReport, ...] = ()

    def finish(self, status: HostStatus, error: str | None = None) -> None:
        self.status, self.error, self.ended = status, error, time.monotonic()

    def report(self) -> HostReport:
        status, error = self.status, self.error
        if status is None:  # never finished: interrupted
            status = HostStatus.FAILED if self.started is not None else HostStatus.SKIPPED
            error = f"interrupted during {self.current or 'connect'}" if self.started else "interrupted before start"
        done = {s.name for s in self.steps}
        skipped = [StepResult(n, StepStatus.SKIPPED) for n in StepName if n not in done]
        ordered = sorted([*self.steps, *skipped], key=lambda s: list(StepName).index(s.name))
        end = self.ended or time.monotonic()
        duration = round(end - self.started, 3) if self.started is not None else 0.0
        return HostReport(self.host.name, status, duration, error, tuple(ordered), self.killed, self.gpus)


@dataclass(frozen=True)
class RunOptions:
    command: str = "reset"  # "reset" or "check"
    concurrency: int | None = None
    dry_run: bool = False
    handle_signals: bool = False


@dataclass
class RunState:
    interrupted: bool = False


async def _run_step(run: HostRun, log: Any, name: StepName, body: Callable[[], Awaitable[Any]]) -> Any:
    """Run one step, turning a step's own failure into a StepResult; transport loss propagates."""
    run.current = name
    started = time.monotonic()
    log.info("step_start", step=name.value)
    try:
        outcome = await body()
    except (steps.StepFailed, BudgetSpent, CommandTimeout) as exc:
        status = exc.status if isinstance(exc, steps.StepFailed) else StepStatus.TIMEOUT
        result = StepResult(name, status, round(time.monotonic() - started, 3), str(exc), str(exc))
        outcome = None
    else:
        result = outcome if isinstance(outcome, StepResult) else outcome.result
    run.steps.append(result)
    level = log.info if result.status is StepStatus.OK else log.warning
    level("step_end", step=name.value, status=result.status.value, duration_s=result.duration_s,
          detail=result.detail, error=result.error)
    return outcome


def _failed(run: HostRun, name: StepName) -> bool:
    return any(s.name is name and s.status is not StepStatus.OK for s in run.steps)


async def _walk(remote: Remote, run: HostRun, command: str) -> None:
    settle_s: dict[int, float] = {}
    log = remote.log
    if command == "reset":
        await _run_step(run, log, StepName.DRAIN, lambda: steps.drain(remote))
        kill = await _run_step(run, log, StepName.KILL, lambda: steps.kill(remote))
        if kill is not None:
            run.killed = kill.killed
        if not _failed(run, StepName.KILL):
            settled = await _run_step(run, log, StepName.SETTLE, lambda: steps.settle(remote))
            settle_s = settled.settle_s if settled is not None else {}
    verified = await _run_step(run, log, StepName.VERIFY, lambda: steps.verify(remote, settle_s))
    if verified is not None:
        run.gpus = verified.gpus
    run.current = None
    run.finish(*host_outcome(run.steps))


def host_outcome(results: Sequence[StepResult]) -> tuple[HostStatus, str | None]:
    """Clean only when every step that ran is ok; the error is verify's if it failed, else the first failure."""
    bad = [s for s in results if s.status is not StepStatus.OK]
    if not bad:
        return HostStatus.CLEAN, None
    verify = next((s for s in bad if s.name is StepName.VERIFY), None)
    first = verify or bad[0]
    reason = first.error or first.detail or first.status.value
    return HostStatus.FAILED, reason if first is verify else f"{first.name}: {reason}"


async def _close(transport: Transport) -> None:
    with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT_S):
        await transport.close()


async def _host_task(run: HostRun, options: RunOptions, limiter: anyio.CapacityLimiter,
                     logs: RunLogs, connector: Connector) -> None:
    async with limiter:
        run.started = time.monotonic()
        log = logs.host_logger(run.host.name)
        log.info("host_start", command=options.command, address=run.host.address, port=run.host.port)
        try:
            await _connected_walk(run, options, log, connector)
        finally:
            report = run.report()
            log.info("host_end", status=str(report.status), error=report.error, duration_s=report.duration_s)


async def _connected_walk(run: HostRun, options: RunOptions, log: Any, connector: Connector) -> None:
    try:
        transport = await connector(run.host)
    except TransportError as exc:
        log.warning("unreachable", error=str(exc))
        run.finish(HostStatus.UNREACHABLE, str(exc))
        return
    try:
        await _walk(Remote(run.host, transport, log), run, options.command)
    except TransportError as exc:
        run.finish(HostStatus.FAILED, f"{exc} (during {run.current})")
        log.error("transport_error", step=str(run.current), error=str(exc))
    except Exception as exc:  # the host boundary: one host's bug never stops the others
        run.finish(HostStatus.FAILED, f"internal error during {run.current}: {type(exc).__name__}: {exc}")
        log.exception("internal_error", step=str(run.current))
    finally:
        await _close(transport)


def _plan_run(run: HostRun) -> None:
    run.started = time.monotonic()
    run.steps = [StepResult(n, StepStatus.SKIPPED, 0.0, line) for n, line in plan_steps(run.host)]
    run.finish(HostStatus.PLANNED)


async def _watch_signals(scope: anyio.CancelScope, state: RunState) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            state.interrupted = True
            scope.cancel()
            return


async def run_hosts(
    hosts: Sequence[Host], options: RunOptions, logs: RunLogs, *, connector: Connector = connect
) -> tuple[RunReport, RunState]:
    """Run the command on every host at once; always return a full report."""
    started_at, t0 = datetime.now(UTC).isoformat(timespec="seconds"), time.monotonic()
    runs = {h.name: HostRun(h) for h in hosts}
    state = RunState()
    if options.dry_run:
        for run in runs.values():
            _plan_run(run)
    else:
        await _run_all(list(runs.values()), options, logs, connector, state)
    report = RunReport(
        run_id=logs.run_id, command=options.command, started_at=started_at,
        duration_s=round(time.monotonic() - t0, 3), hosts={n: r.report() for n, r in runs.items()},
    )
    return report, state


async def _run_all(runs: list[HostRun], options: RunOptions, logs: RunLogs, connector: Connector,
                   state: RunState) -> None:
    limiter = anyio.CapacityLimiter(max(1, options.concurrency or len(runs) or 1))
    async with anyio.create_task_group() as outer:
        if options.handle_signals:
            outer.start_soon(_watch_signals, outer.cancel_scope, state)
        async with anyio.create_task_group() as hosts_group:
            for run in runs:
                hosts_group.start_soon(_host_task, run, options, limiter, logs, connector)
        outer.cancel_scope.cancel()
