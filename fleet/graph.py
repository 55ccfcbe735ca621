"""The task graph: every targeted host walks drain -> kill -> settle -> verify at once.

One anyio task group; one task per host; a CapacityLimiter bounds how many hosts
have remote work in flight (from their first command to their last, connect
included). A failure is caught at the host boundary and becomes that host's
outcome; cancellation never is. A run-level interrupt cancels every host,
closes connections (shielded) and still yields a full report.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio

from fleet.errors import CommandTimeout, TransportError
from fleet.inventory.host import Host
from fleet.node.lock import LockError, host_lock
from fleet.node.node import BudgetSpent, Remote
from fleet.report.logs import RunLogs
from fleet.report.models import (
    GpuReport,
    HostPlan,
    HostReport,
    HostStatus,
    KilledProcess,
    RunReport,
    StepName,
    StepResult,
    StepStatus,
)
from fleet.report.render import fold
from fleet.reset import steps
from fleet.reset.plan import describe_plan
from fleet.transport.base import Transport
from fleet.transport.connect import connect
from fleet.waves import Amount, FailureBudget, plan_waves, tolerated

Connector = Callable[[Host], Awaitable[Transport]]
CLOSE_TIMEOUT_S = 5.0


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
    plan: HostPlan | None = None

    def finish(self, status: HostStatus, error: str | None = None) -> None:
        self.status, self.error, self.ended = status, error, time.monotonic()

    def report(self, cut_short: str = "interrupted") -> HostReport:
        """Freeze; a host that never finished was cut short (`cut_short` says by what)."""
        status, error = self.status, self.error
        if status is None:
            status = HostStatus.FAILED if self.started is not None else HostStatus.SKIPPED
            error = f"{cut_short} during {self.current or 'connect'}" if self.started else f"{cut_short} before start"
        done = {s.name for s in self.steps}
        skipped = [StepResult(n, StepStatus.SKIPPED) for n in StepName if n not in done]
        ordered = sorted([*self.steps, *skipped], key=lambda s: list(StepName).index(s.name))
        end = self.ended or time.monotonic()
        duration = round(end - self.started, 3) if self.started is not None else 0.0
        return HostReport(self.host.name, status, duration, error, tuple(ordered), self.killed, self.gpus, self.plan)


@dataclass(frozen=True)
class RunOptions:
    command: str = "reset"  # "reset" or "check"
    concurrency: int | None = None
    dry_run: bool = False
    handle_signals: bool = False
    batch: Amount | None = None
    max_fail: Amount | None = None
    canary: int = 0
    deadline_s: float | None = None
    stop_units: bool = False  # stop the unit of a holder that respawns (not in services, not protected)


@dataclass
class RunState:
    interrupted: bool = False
    deadline_hit: bool = False
    deadline_at: float | None = None  # anyio clock
    stopped: str | None = None  # why no new host starts: the failure budget or the canary

    def cut_short(self, options: RunOptions) -> str:
        """What ends unfinished hosts: the run deadline once it has passed, else an interrupt."""
        passed = self.deadline_at is not None and anyio.current_time() >= self.deadline_at
        if (self.deadline_hit or passed) and options.deadline_s is not None and not self.interrupted:
            return f"run deadline of {options.deadline_s:g} s reached"
        return "interrupted"


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


async def _survey(remote: Remote, run: HostRun) -> None:
    """Dry run: read the node, say per step what a reset would do, change nothing."""
    run.current = StepName.DRAIN
    try:
        run.plan = await steps.survey(remote)
    except (steps.StepFailed, BudgetSpent, CommandTimeout) as exc:
        run.finish(HostStatus.FAILED, f"dry run could not read the node: {exc}")
        return
    lines = describe_plan(run.plan)
    run.steps = [StepResult(n, StepStatus.SKIPPED, 0.0, lines[n]) for n in StepName]
    run.current = None
    run.finish(HostStatus.PLANNED)


async def _walk(remote: Remote, run: HostRun, options: RunOptions) -> None:
    if options.dry_run:
        await _survey(remote, run)
        return
    settle_s: dict[int, float] = {}
    log = remote.log
    if options.command == "reset":
        await _run_step(run, log, StepName.DRAIN, lambda: steps.drain(remote))
        kill = await _run_step(run, log, StepName.KILL, lambda: steps.kill(remote, stop_units=options.stop_units))
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


async def _host_task(run: HostRun, options: RunOptions, gate: Gate, logs: RunLogs, connector: Connector) -> None:
    async with gate.limiter:
        if gate.state.stopped:
            run.finish(HostStatus.SKIPPED, gate.state.stopped)
            return
        run.started = time.monotonic()
        log = logs.host_logger(run.host.name)
        log.info("host_start", command=options.command, address=run.host.address, port=run.host.port)
        try:
            await _connected_walk(run, options, log, connector, logs.run_id)
        finally:
            gate.settle(run)
            report = run.report(gate.state.cut_short(options))
            log.info("host_end", status=str(report.status), error=report.error, duration_s=report.duration_s)


async def _connected_walk(run: HostRun, options: RunOptions, log: Any, connector: Connector, run_id: str) -> None:
    try:
        transport = await connector(run.host)
    except TransportError as exc:
        log.warning("unreachable", error=str(exc))
        run.finish(HostStatus.UNREACHABLE, str(exc))
        return
    try:
        remote = Remote(run.host, transport, log)
        if options.command == "reset" and not options.dry_run:
            await _locked_walk(remote, run, options, run_id)
        else:
            await _walk(remote, run, options)
    except TransportError as exc:
        run.finish(HostStatus.FAILED, f"{exc} (during {run.current})")
        log.error("transport_error", step=str(run.current), error=str(exc))
    except Exception as exc:  # the host boundary: one host's bug never stops the others
        run.finish(HostStatus.FAILED, f"internal error during {run.current}: {type(exc).__name__}: {exc}")
        log.exception("internal_error", step=str(run.current))
    finally:
        await _close(transport)


async def _locked_walk(remote: Remote, run: HostRun, options: RunOptions, run_id: str) -> None:
    """A reset under the host's lock: two runs never interleave kills on one node."""
    try:
        async with host_lock(remote, run_id):
            await _walk(remote, run, options)
    except LockError as exc:
        run.finish(HostStatus.FAILED, str(exc))


async def _watch_signals(scope: anyio.CancelScope, state: RunState) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            state.interrupted = True
            scope.cancel()
            return


@dataclass
class Gate:
    """What decides whether a host may start: the concurrency limiter and the failure budget."""

    limiter: anyio.CapacityLimiter
    budget: FailureBudget
    state: RunState

    def settle(self, run: HostRun) -> None:
        """Count a finished host against the budget; once spent, no new host starts."""
        if run.status in (HostStatus.FAILED, HostStatus.UNREACHABLE):
            self.budget.note_failure()
            if self.budget.spent and not self.state.stopped:
                self.state.stopped = self.budget.reason()


async def run_hosts(
    hosts: Sequence[Host], options: RunOptions, logs: RunLogs, *, connector: Connector = connect
) -> tuple[RunReport, RunState]:
    """Run the command on every host (in waves when asked); always return a full report."""
    started_at, t0 = datetime.now(UTC).isoformat(timespec="seconds"), time.monotonic()
    runs = {h.name: HostRun(h) for h in hosts}
    state = RunState()
    await _run_all(list(runs.values()), options, logs, connector, state)
    cut_short = state.cut_short(options)
    for run in runs.values():
        if run.status is None and run.started is None and state.stopped:
            run.finish(HostStatus.SKIPPED, state.stopped)
    report = RunReport(
        run_id=logs.run_id, command=options.command, started_at=started_at,
        duration_s=round(time.monotonic() - t0, 3), hosts={n: r.report(cut_short) for n, r in runs.items()},
    )
    return report, state


async def _run_all(runs: list[HostRun], options: RunOptions, logs: RunLogs, connector: Connector,
                   state: RunState) -> None:
    limiter = anyio.CapacityLimiter(max(1, options.concurrency or len(runs) or 1))
    gate = Gate(limiter, FailureBudget(tolerated(options.max_fail, len(runs))), state)
    waves = plan_waves(runs, options.batch, options.canary)
    async with anyio.create_task_group() as outer:
        if options.handle_signals:
            outer.start_soon(_watch_signals, outer.cancel_scope, state)
        if options.deadline_s:
            state.deadline_at = anyio.current_time() + options.deadline_s
        with anyio.move_on_after(options.deadline_s if options.deadline_s else math.inf) as deadline:
            for number, wave in enumerate(waves):
                if state.stopped:
                    break
                async with anyio.create_task_group() as hosts_group:
                    for run in wave:
                        hosts_group.start_soon(_host_task, run, options, gate, logs, connector)
                if number == 0 and options.canary and not state.stopped:
                    state.stopped = _canary_verdict(wave)
        state.deadline_hit = deadline.cancelled_caught
        outer.cancel_scope.cancel()


def _canary_verdict(wave: Sequence[HostRun]) -> str | None:
    """Why the run stops after the canary wave, or None when every canary host ended clean."""
    bad = [r.host.name for r in wave if r.status is not HostStatus.CLEAN]
    if not bad:
        return None
    return f"canary failed on {fold(bad)}: no other host started"
