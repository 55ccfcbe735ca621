"""One host's way through a run: drain -> kill -> settle -> verify (reset), verify alone (check), or the survey
(plan), and the host's outcome.

`HostRun` is the mutable progress of one host, frozen into a `HostReport` at the end. `walk` runs the
steps the mode asks for in order: settle only after a kill that succeeded, verify always (it is the
proof). A step's own failure (`StepFailed`, a spent budget, a command timeout) ends that step, not the
host; losing the transport ends the host (the task graph, `fleet.engine.graph`, catches it at the host boundary).
A reset holds the node's lock (`fleet.reset.lock`) for its whole walk.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from fleet.inventory.host import Host
from fleet.model.errors import CommandTimeout, StepFailed
from fleet.model.fabric import FabricManager
from fleet.model.report import (
    GpuReport,
    HostFinding,
    HostPlan,
    HostReport,
    HostStatus,
    KeptProcess,
    KilledProcess,
    Reason,
    SchedulerRecord,
    StepName,
    StepOutcome,
    StepResult,
    StepStatus,
)
from fleet.node.budget import BudgetSpent
from fleet.node.node import Node
from fleet.reset import baselines, drain, kill, plan, restore, settle, verdict_time, verify
from fleet.reset.lock import LockError, host_lock

# What ends a step but not the host: the step says why, the host goes on to verify.
STEP_ENDERS = (StepFailed, BudgetSpent, CommandTimeout)
# The reason a step ends with when one of its commands failed (`systemctl stop` refused: the drain failed).
FAILED_STEP_REASONS = {StepName.DRAIN: Reason.DRAIN_FAILED, StepName.KILL: Reason.KILL_FAILED}
# Reasons of an earlier step that say whose the memory (or the device) verify then finds held is, more telling than
# verify's `memory_held` or `holders_left`: settle's (a leaked context, a job's) and the kill's (a holder came back).
WHOSE_MEMORY = frozenset({Reason.MEMORY_LEAKED, Reason.MEMORY_HELD_BY_JOB, Reason.RESPAWNED})
# Each step's place in a host's report: drain, kill, settle, verify (iterating it is StepName's order, without the
# enum's slow __iter__).
STEP_ORDER = {name: place for place, name in enumerate(StepName)}


class Mode(StrEnum):
    """What a run does to each host."""

    RESET = "reset"  # drain -> kill -> settle -> verify, under the node's lock
    CHECK = "check"  # verify only, read-only
    PLAN = "plan"  # the dry run of a reset: a read-only survey, hosts end `planned`

    @property
    def command(self) -> str:
        """The command the report names (a dry run is a reset that was only planned)."""
        return "check" if self is Mode.CHECK else "reset"


@dataclass(kw_only=True)
class HostRun:
    """The mutable progress of one host; frozen into a HostReport at the end."""

    host: Host
    started: float | None = None
    ended: float | None = None
    status: HostStatus | None = None
    error: str | None = None
    reason: Reason | None = None
    current: StepName | None = None
    step_started: float | None = None  # when the step in flight began (monotonic clock)
    locking: float | None = None  # since when it waits for the node's reset lock (None: not waiting)
    steps: list[StepResult] = field(default_factory=list)
    killed: tuple[KilledProcess, ...] = ()
    kept: tuple[KeptProcess, ...] = ()  # GPU holders the kill left alive on purpose, each with why
    gpus: tuple[GpuReport, ...] = ()
    plan: HostPlan | None = None
    memory_before: tuple[int | None, ...] | None = None  # each GPU's memory.used as the reset began
    health: tuple[HostFinding, ...] = ()  # verify's health findings on no listed GPU
    fabric_manager: FabricManager | None = None  # verify's read of the node's fabric manager
    stopped: tuple[str, ...] = ()  # units the reset found up and stopped
    restored: tuple[str, ...] = ()  # `--restore-settings`: the changes that took
    scheduler: SchedulerRecord | None = None  # what the scheduler seam (`fleet.engine.schedulers`) decided for it
    final: HostReport | None = None  # its report, made once as it ended (the task graph's `_host_task`)
    # The longest a host that goes wrong in one way takes to its verdict, by the phase it is held in
    # (`fleet.reset.verdict_time`): what the progress line counts on once the host is past the typical duration.
    worst_by_phase: Mapping[str, float] = field(default_factory=dict)

    @property
    def worst_s(self) -> float | None:
        """The longest this host takes to its verdict, from its start, when one thing goes wrong where it is now."""
        return self.worst_by_phase.get(self.current.value if self.current else verdict_time.CONNECT)

    def finish(self, status: HostStatus, error: str | None = None, reason: Reason | None = None) -> None:
        self.status, self.error, self.reason, self.ended = status, error, reason, time.monotonic()

    def report(self, cut_short: str = "interrupted", cut_reason: Reason = Reason.INTERRUPTED,
               run_started: float | None = None) -> HostReport:
        """Freeze; a host that never finished was cut short (`cut_short` says by what, `cut_reason` its code).
        `run_started` (the run's start, monotonic clock) gives the report the host's start in the run (`start_s`)."""
        status, error, reason = self.status, self.error, self.reason
        if status is None:
            status = HostStatus.FAILED if self.started is not None else HostStatus.SKIPPED
            error = f"{cut_short} during {self.current or 'connect'}" if self.started else f"{cut_short} before start"
            reason = cut_reason
        if status in (HostStatus.CLEAN, HostStatus.PLANNED):
            reason = None
        elif reason is None:
            reason = Reason.INTERNAL  # every way a host fails sets its reason: a missing one is a bug
        steps = list(self.steps)
        if status is not self.status and self.current is not None and all(s.name != self.current for s in steps):
            since = self.step_started if self.step_started is not None else self.started or time.monotonic()
            steps.append(StepResult(name=self.current, status=StepStatus.INTERRUPTED,
                                    duration_s=round(time.monotonic() - since, 3),
                                    error=cut_short, reason=cut_reason))
        done = {s.name for s in steps}
        skipped = [StepResult(name=n, status=StepStatus.SKIPPED) for n in STEP_ORDER if n not in done]
        ordered = sorted([*steps, *skipped], key=lambda s: STEP_ORDER[s.name])
        end = self.ended or time.monotonic()
        duration = round(end - self.started, 3) if self.started is not None else 0.0
        start = (round(max(self.started - run_started, 0.0), 3)
                 if self.started is not None and run_started is not None else None)
        return HostReport(name=self.host.name, status=status, duration_s=duration, error=error, steps=tuple(ordered),
                          killed=self.killed, gpus=self.gpus, plan=self.plan, scheduler=self.scheduler, reason=reason,
                          memory_before_mib=self.memory_before, health=self.health, start_s=start, kept=self.kept,
                          fabric_manager=self.fabric_manager, stopped=self.stopped, restored=self.restored)


HostEnded = Callable[[HostReport], None]  # told each host's final report as it finishes (the run's history)
Watch = Callable[[Mapping[str, HostRun]], Coroutine[Any, Any, None]]  # watches the hosts as they go, until cancelled


def worst_by_phase(host: Host, mode: Mode, *, stop_units: bool = False, gpu_reset: bool = False,
                   restore_settings: bool = False) -> dict[str, float]:
    """`HostRun.worst_by_phase` for what `mode` does on this host."""
    if mode is Mode.CHECK:
        phases = verdict_time.check_phases(host)
    elif mode is Mode.PLAN:
        phases = verdict_time.plan_phases(host, restore_settings=restore_settings)
    else:
        phases = verdict_time.reset_phases(host, stop_units=stop_units, gpu_reset=gpu_reset,
                                           restore_settings=restore_settings)
    return {p.name: p.worst_s for p in phases}


async def walk_host(node: Node, run: HostRun, mode: Mode, run_id: str, *, stop_units: bool = False,
                    gpu_reset: bool = False, restore_settings: bool = False) -> None:
    """What `mode` does on this host, start to outcome (a reset under the node's lock)."""
    if mode is Mode.PLAN:
        await _survey(node, run, restore_settings=restore_settings, gpu_reset=gpu_reset)
    elif mode is Mode.CHECK:
        await _walk(node, run, mode)
    else:
        try:
            held_s = verdict_time.held_s(node.host, stop_units=stop_units, gpu_reset=gpu_reset,
                                         restore_settings=restore_settings)
            run.locking = time.monotonic()
            async with host_lock(node, run_id, held_s=held_s):
                run.locking = None
                await _walk(node, run, mode, stop_units=stop_units, gpu_reset=gpu_reset,
                            restore_settings=restore_settings)
        except LockError as exc:
            run.finish(HostStatus.FAILED, str(exc), exc.reason)
        finally:
            run.locking = None


async def _walk(node: Node, run: HostRun, mode: Mode, *, stop_units: bool = False, gpu_reset: bool = False,
                restore_settings: bool = False) -> None:
    settle_s: dict[int, float] = {}
    baseline, spared, restored = None, frozenset[int](), restore.Restored()
    if mode is Mode.RESET:
        run.current = StepName.DRAIN  # the baselines are read as drain begins (and logged in it)
        baseline, run.memory_before = await baselines.read(node)
        run.stopped = (await _run_step(node, run, StepName.DRAIN, lambda: drain.drain(node))).stopped
        killed = await _run_step(node, run, StepName.KILL, lambda: kill.kill(node, stop_respawning=stop_units))
        run.killed, run.kept, spared = killed.killed, killed.left_alive, killed.spared
        run.stopped += killed.stopped
        if killed.result.status is StepStatus.OK:
            async def settling() -> StepOutcome:
                nonlocal restored
                if restore_settings:
                    restored = (await restore.restore_settings(node, gpu_reset=gpu_reset))[1]
                    run.restored = restored.done
                settled = await settle.settle(node, killed.kept, killed.job_pids, gpu_reset=gpu_reset)
                said = restored.detail
                if not said:  # nothing restored, or not asked: settle's own result
                    return settled
                return replace(settled, result=replace(settled.result, detail=settled.result.detail + said))
            settled = await _run_step(node, run, StepName.SETTLE, settling)
            settle_s = dict(settled.settle_s)
    verified = await _run_step(node, run, StepName.VERIFY,
                               lambda: verify.verify(node, settle_s, baseline, run.killed, spared, restored.refused))
    run.gpus, run.health, run.fabric_manager = verified.gpus, verified.health, verified.fabric_manager
    run.current = None
    run.finish(*host_outcome(run.steps))


async def _run_step(node: Node, run: HostRun, name: StepName,
                    body: Callable[[], Awaitable[StepOutcome]]) -> StepOutcome:
    """Run one step, turning a step's own failure into its outcome; transport loss propagates."""
    run.current = name
    started = run.step_started = time.monotonic()
    node.log.info("step_start", step=name.value)
    try:
        outcome = await body()
    except STEP_ENDERS as exc:
        status = exc.status if isinstance(exc, StepFailed) else StepStatus.TIMEOUT
        reason = exc.reason if isinstance(exc, StepFailed) else Reason.COMMAND_TIMEOUT
        if reason is Reason.PROBE_FAILED:  # a command the step relies on failed: the step itself failed
            reason = FAILED_STEP_REASONS.get(name, reason)
        took = round(time.monotonic() - started, 3)
        outcome = StepOutcome(result=StepResult(name=name, status=status, duration_s=took, detail=str(exc),
                                                error=str(exc), reason=reason))
    result = outcome.result
    run.steps.append(result)
    level = node.log.info if result.status is StepStatus.OK else node.log.warning
    level("step_end", step=name.value, status=result.status.value, duration_s=result.duration_s,
          detail=result.detail, error=result.error)
    return outcome


async def _survey(node: Node, run: HostRun, *, restore_settings: bool = False, gpu_reset: bool = False) -> None:
    """Dry run: read the node, say per step what a reset would do (the settings it would restore too, asked),
    change nothing."""
    run.current = StepName.DRAIN
    try:
        run.plan = await plan.survey(node)
        if restore_settings:
            would, _ = await restore.restore_settings(node, gpu_reset=gpu_reset, planned=True)
            run.plan = replace(run.plan, would_restore=tuple(c.line for c in would.changes) + would.held)
    except STEP_ENDERS as exc:
        reason = exc.reason if isinstance(exc, StepFailed) else Reason.COMMAND_TIMEOUT
        run.finish(HostStatus.FAILED, f"dry run could not read the node: {exc}", reason)
        return
    run.steps = plan.planned_steps(run.plan)
    run.current = None
    run.finish(HostStatus.PLANNED)


def host_outcome(results: Sequence[StepResult]) -> tuple[HostStatus, str | None, Reason | None]:
    """Clean only when every step that ran is ok; the error (and its reason) is a GPU reset's that did not free
    the memory (`needs_reboot`), else an earlier step's saying whose the memory is (a leaked context, a Slurm job's,
    a holder that came back) when verify found memory or a device still held (or verify did not run), else
    verify's if it failed, else the first failure's."""
    bad = [s for s in results if s.status is not StepStatus.OK]
    if not bad:
        return HostStatus.CLEAN, None, None
    failed_verify = next((s for s in bad if s.name is StepName.VERIFY), None)
    reboot = next((s for s in bad if s.reason is Reason.NEEDS_REBOOT), None)  # the remedy verify's memory needs
    whose = next((s for s in bad if s.reason in WHOSE_MEMORY), None)
    if failed_verify is not None and failed_verify.reason not in (Reason.MEMORY_HELD, Reason.HOLDERS_LEFT):
        whose = None  # verify found something else first (an Xid, a missing GPU): that is the host's error
    first = reboot or whose or failed_verify or bad[0]
    line = first.error or first.detail or first.status.value
    reason = first.reason or (Reason.COMMAND_TIMEOUT if first.status is StepStatus.TIMEOUT else Reason.PROBE_FAILED)
    return HostStatus.FAILED, line if first is failed_verify else f"{first.name}: {line}", reason
