"""`--via srun`: the whole reset as one Slurm job step, each node resetting itself; no SSH from this machine.

    read       one `scontrol show node` and one `squeue` for the targets (tried again after an error,
               `fleet.slurm.tries`); a node Slurm does not know fails, a node out of service (drained,
               down) is skipped: a job step cannot run there
    reserve    `scontrol create reservation fleet-<run_id> ... Flags=MAINT,IGNORE_JOBS`
               (`fleet.slurm.reservation`: tried again, found by its name after a lost reply): other
               users' jobs stay off the nodes from now on, the running ones are waited for (--drain-wait)
    step       `srun --reservation=... --exclusive --gres=gpu:N fleet node-run` over the nodes with no
               job (one srun per GPU count: a step sees only the GPUs it asks for), the controller's
               document on every task's stdin; each task streams its node's log events and, last,
               its report as JSON lines (`fleet.slurm.noderun`), merged into the run's report and logs.
               srun runs in an environment fleet controls (`srun_env`: no SLURM_* input variable
               reframes its output or puts the step in someone's allocation)
    cleanup    always (failure, deadline, Ctrl-C; shielded, bounded by `cleanup_s`; a third interrupt
               abandons it): the step's jobs cancelled by their ids, whether or not srun still lives, and
               read back until Slurm shows none; every node the step failed, or that sent no report (its
               reset may have run), drained with fleet's reason whatever its base state, read back, in
               tries (`fleet.slurm.cleanup`), *before* the reservation is removed (no moment lets a job
               onto an unclean node); a drain still unconfirmed keeps the reservation, naming the nodes;
               leftover reservations settled; then the nodes read at once for the report

The controller's work does not grow with the nodes: a fixed number of Slurm commands and one srun,
whose fan-out is slurmd's tree.
"""

from __future__ import annotations

import getpass
import itertools
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
from anyio.abc import ByteReceiveStream
from anyio.streams.buffered import BufferedByteReceiveStream

from fleet.engine.graph import host_runs, run_bounded
from fleet.engine.interrupts import Interrupts
from fleet.engine.options import RunOptions, RunState
from fleet.engine.walk import HostEnded, HostRun, Mode, Watch
from fleet.inventory.host import Host
from fleet.inventory.load import host_vars
from fleet.model.codec import host_from_document
from fleet.model.errors import DocumentError
from fleet.model.report import (
    HostPlan,
    HostReport,
    HostStatus,
    Reason,
    RunReport,
    SchedulerRecord,
    StepName,
    StepStatus,
)
from fleet.node.budget import TimeBudget
from fleet.node.poll import poll_until
from fleet.reset import verdict_time
from fleet.runlog.folder import RunLogs
from fleet.slurm import NAME, policy
from fleet.slurm.cleanup import Ended, drain_failed
from fleet.slurm.control import Slurm, SlurmError, hostlist
from fleet.slurm.frames import Assembler, FrameError
from fleet.slurm.leftovers import Leftovers
from fleet.slurm.records import SlurmNode
from fleet.slurm.reservation import DELETE_RETRY_S, DELETE_TRIES, Reservation
from fleet.slurm.runner import Stream
from fleet.slurm.tries import retry, tries_s
from fleet.slurm.variables import node_name
from fleet.slurm.waiting import POLL_S, JobWaits, Wait
from fleet.transport.base import client_deadline
from fleet.transport.sessions import REAP_TIMEOUT_S
from fleet.version import __version__

# The command each task runs; found on the node's PATH, as any installed tool.
NODE_COMMAND = ("fleet", "node-run")
# Seconds srun may wait for the reserved nodes to be allocated before it gives up (--immediate).
IMMEDIATE_S = 60
# Seconds, after the step's job is cancelled, to go on reading the nodes' (interrupted) reports, and for Slurm to
# show the step's jobs gone.
CANCEL_GRACE_S = 20.0
# Seconds between two looks at the step's jobs while they end.
JOB_POLL_S = 1.0
# Slurm commands in one try of the cleanup's drains: the read, a drain, the read back.
DRAIN_COMMANDS = 3
# What the error of a node that sent no report says it may be.
NO_REPORT = "no report from the node: its reset may have run"
# Bytes of one stdout line read from srun (a frame is under 1 KB; anything longer is noise).
LINE_LIMIT = 1024 * 1024
# Characters of srun's stderr kept, the last ones (its last lines explain a node that sent no report).
STDERR_LIMIT = 256 * 1024
# Environment variables srun must not inherit: Slurm's input variables (srun's, and salloc's and sbatch's that
# srun reads inside an allocation) reframe its output (SLURM_LABELIO), buffer it, or put the step into another
# job's allocation (SLURM_JOB_ID). SLURM_CONF, which only says where the configuration is, is kept.
SLURM_INPUT_PREFIXES = ("SLURM_", "SRUN_", "SALLOC_", "SBATCH_")
KEPT_VARIABLES = frozenset({"SLURM_CONF"})


def srun_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment srun runs in: this process's, without Slurm's input variables (SLURM_CONF kept)."""
    return {k: v for k, v in environ.items() if k in KEPT_VARIABLES or not k.startswith(SLURM_INPUT_PREFIXES)}


def step_seconds(hosts: Sequence[Host], options: RunOptions) -> float:
    """The step's time limit: the longest one of its nodes' resets can take, its lock taken and every step at its
    longest (`fleet.reset.verdict_time`), with the run's options."""
    return max(verdict_time.walk_s(h, stop_units=options.stop_units, gpu_reset=options.gpu_reset,
                                   restore_settings=options.restore_settings) for h in hosts)


def cleanup_s(command_s: float, pause_s: float) -> float:
    """The longest the cleanup takes (it runs shielded, even on Ctrl-C), each Slurm command at its client deadline:
    the step's jobs cancelled and seen gone (CANCEL_GRACE_S, then a last look and its scancel), the drains' tries,
    the reservation's removal (its tries a second apart, one command hanging), the leftovers' read and removal, and
    the last read for the report."""
    command = client_deadline(command_s)
    jobs = CANCEL_GRACE_S + 2 * command
    drains = tries_s(DRAIN_COMMANDS, command_s, pause_s=pause_s)
    removal = DELETE_TRIES * DELETE_RETRY_S + 2 * command
    return jobs + drains + removal + 2 * command + command


def srun_argv(reservation: str, nodes: Sequence[str], minutes: int, gpus: int = 0) -> list[str]:
    """srun over `nodes` in the reservation: whole nodes (`--exclusive`) and, where Slurm gives GPUs out, every
    one of them (`--gres=gpu:N`: on a ConstrainDevices cluster a step sees only the GPUs it was given); one
    task a node, every task the same stdin, no task's failure ending the others."""
    return [
        "srun", f"--reservation={reservation}", f"--job-name={reservation}", f"--nodelist={hostlist(nodes)}",
        f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1", "--exclusive",
        *([f"--gres=gpu:{gpus}"] if gpus else []), "--input=all",
        "--kill-on-bad-exit=0", f"--immediate={IMMEDIATE_S}", f"--time={minutes}", "--chdir=/", "--quiet",
        *NODE_COMMAND,
    ]


def by_gpus(nodes: Sequence[str], seen: Mapping[str, SlurmNode]) -> dict[int, list[str]]:
    """The nodes grouped by how many GPUs Slurm gives out on each: one step a group (a step's `--gres` is per
    node, the same on all of its nodes)."""
    groups: dict[int, list[str]] = {}
    for name in nodes:
        node = seen.get(name)
        groups.setdefault(node.gpus if node else 0, []).append(name)
    return groups


@dataclass(kw_only=True)
class _Step:
    """What the step saw: each node's report, whether it began working, and what srun said on stderr."""

    reports: dict[str, HostReport] = field(default_factory=dict)
    reported_at: dict[str, float] = field(default_factory=dict)  # when each report came (monotonic): the node's end
    heard_from: set[str] = field(default_factory=set)  # nodes a whole message came from
    stderr_text: str = ""
    noise: list[str] = field(default_factory=list)  # stdout lines that were no node's JSON
    exit_status: dict[str, int | None] = field(default_factory=dict)  # each node's srun's

    def touched(self, name: str) -> bool:
        """Whether the step may have done anything to the node. Only a node that said so is untouched: its report
        says no step ran (a version refusal). A node srun was asked to run on that sent no report may have been
        reset, whatever srun then did (killed before its first frame, its task's output lost): touched."""
        report = self.reports.get(name)
        return report is None or _ran(report)

    @property
    def stderr(self) -> list[str]:
        """srun's stderr (its own messages and the tasks'), by line."""
        return [line for line in self.stderr_text.splitlines() if line.strip()]


class SrunRun:
    """One `--via srun` run; see the module docstring."""

    def __init__(self, slurm: Slurm, runs: Sequence[HostRun], options: RunOptions, logs: RunLogs,
                 on_host_end: HostEnded | None = None, interrupts: Interrupts | None = None, *,
                 poll_s: float = POLL_S, tell: Callable[[str], None] | None = None) -> None:
        """`poll_s`: the pause between two tries at a Slurm command that failed (and between two looks at jobs)."""
        assert options.scheduler is not None
        self.slurm, self.options, self.logs, self.poll_s = slurm, options, logs, poll_s
        self.on_host_end = on_host_end
        self.run_id = logs.run_id
        self.maintenance = Reservation(slurm, f"fleet-{self.run_id}", poll_s)
        self.reservation = self.maintenance.name
        self.runs = {node_name(r.host): r for r in runs}
        self.log = {name: logs.host_logger(r.host.name) for name, r in self.runs.items()}
        self.before: dict[str, SlurmNode] = {}
        self.stepped: list[str] = []
        self.step = _Step()
        self.frames = Assembler()
        self.cleaned = False
        self.cancelled: set[str] = set()  # the step's jobs scancelled
        self.leftovers = Leftovers(slurm, self.run_id, logs.path.parent, self.log, reset=options.mode is Mode.RESET,
                                   **({"say": tell} if tell is not None else {}))
        self.cleanup_s = cleanup_s(slurm.timeout, poll_s)
        self.finishing = (interrupts or Interrupts()).finishing(
            self._still_doing, self.cleanup_s + CANCEL_GRACE_S,
            f"the reservation {self.reservation} in place and failed nodes maybe not drained")

    def _still_doing(self) -> str | None:
        if self.cleaned or not (self.maintenance.held or self.stepped):
            return None
        return f"ending the job step and removing the reservation {self.reservation}"

    async def body(self, state: RunState) -> None:
        try:
            await self.leftovers.find(list(self.runs))
            eligible = await self._read()
            if self.options.mode is Mode.PLAN:
                self._plan(eligible)
            elif eligible:
                ready = await self._reserve_and_wait(eligible)
                if ready:
                    await self._run_step(ready)
        finally:
            with self.finishing.shielded() as shield, anyio.move_on_after(self.cleanup_s) as bound:
                await self._cleanup()
                await self.leftovers.settle(n for n, r in self.runs.items() if r.status is HostStatus.CLEAN)
                await self._read_after()
            self.cleaned = True
            if shield.cancelled_caught:
                self._abandoned()
            elif bound.cancelled_caught and self.maintenance.held:
                self._keep_reservation(f"the cleanup took over {self.cleanup_s:g} s", [])

    # --- read: who can take part -----------------------------------------------------------------

    async def _read(self) -> list[str]:
        names = list(self.runs)
        try:
            self.before, jobs = await retry(lambda number: self.slurm.look(names), pause_s=self.poll_s)
        except SlurmError as exc:
            self._end_all(names, HostStatus.FAILED, f"slurm: cannot read the nodes: {exc}", Reason.SLURM)
            return []
        eligible = []
        for name, run in self.runs.items():
            node = self.before.get(name)
            run.scheduler = SchedulerRecord(node=name, by=NAME, state_before=node.state if node else None,
                                            reason_before=node.reason if node else None,
                                    jobs=jobs.get(name, ()))
            if node is None:
                self._end(name, HostStatus.FAILED, f"slurm: Slurm has no node {name} (set slurm.node if its Slurm"
                                                   " name differs)", Reason.SLURM)
            elif not node.in_service and not self.leftovers.in_fleets_maintenance(node):
                self._end(name, HostStatus.SKIPPED, f"slurm: {name} is {policy.describe(node)}: a job step cannot"
                                                    " run there; reset it over SSH (--via ssh)", Reason.SLURM)
            else:
                eligible.append(name)
        return eligible

    def _plan(self, eligible: list[str]) -> None:
        """Dry run: what the step would do, from Slurm alone (the nodes' own survey needs the step)."""
        wait_s = self.options.scheduler.drain_wait_s if self.options.scheduler else 0.0
        for name in eligible:
            run = self.runs[name]
            jobs = run.scheduler.jobs if run.scheduler else ()
            waits = f", wait up to {wait_s:g} s for job {', '.join(jobs)}" if jobs else ""
            self._record(name, plan=f"slurm {self.before[name].state}: would reserve it ({self.reservation}){waits},"
                                    " reset it in one srun step; the node's own survey needs the step: for its"
                                    " processes, run the dry run over SSH")
            run.plan = HostPlan()
            run.finish(HostStatus.PLANNED)

    # --- reserve, then wait for the running jobs ------------------------------------------------

    async def _reserve_and_wait(self, eligible: list[str]) -> list[str]:
        wait_s = self.options.scheduler.drain_wait_s if self.options.scheduler else 0.0
        step_s = step_seconds([self.runs[n].host for n in eligible], self.options)
        minutes = _minutes(wait_s + step_s + CANCEL_GRACE_S)
        try:
            await self.maintenance.create(eligible, minutes)
        except SlurmError as exc:
            self._end_all(eligible, HostStatus.FAILED, f"slurm: cannot create reservation {self.reservation}: {exc}",
                          Reason.SLURM)
            return []
        for name in eligible:
            self.log[name].info("slurm_reserved", node=name, reservation=self.reservation, minutes=minutes)
        return await self._wait_for_jobs(eligible, wait_s)

    async def _wait_for_jobs(self, nodes: list[str], wait_s: float) -> list[str]:
        """The reserved nodes once no job holds them (`fleet.slurm.waiting`, as `--slurm` waits); a node still busy
        after wait_s is skipped. Each node's record keeps how long it waited (`waited_s`): the one step starts once
        the last node is free, so that is the wait of every node that takes part."""
        waits = JobWaits(self.slurm, self.poll_s)
        started = anyio.current_time()
        until = started + wait_s
        each = {name: Wait(name=name) for name in nodes}
        async with anyio.create_task_group() as group:
            group.start_soon(waits.serve)
            async with anyio.create_task_group() as waiting:
                for wait in each.values():
                    waiting.start_soon(waits.wait, wait, until)
            group.cancel_scope.cancel()
        ready = []
        waited = round(anyio.current_time() - started, 3)
        for name, wait in each.items():
            self._record(name, jobs=wait.jobs, waited_s=waited)
            error = wait.outcome(wait_s)
            if error is None:
                ready.append(name)
                continue
            self._end(name, HostStatus.SKIPPED, error, Reason.SLURM if wait.lost else Reason.JOBS_RUNNING)
        return ready

    # --- the step ---------------------------------------------------------------------------------

    def _document(self, nodes: Sequence[str]) -> bytes:
        options = self.options
        return json.dumps({
            "fleet_version": __version__,
            "run_id": self.run_id,
            "options": {"stop_units": options.stop_units, "gpu_reset": options.gpu_reset,
                        "restore_settings": options.restore_settings, "deadline_s": options.deadline_s},
            "hosts": {n: {"name": self.runs[n].host.name, "vars": host_vars(self.runs[n].host)} for n in nodes},
        }).encode() + b"\n"

    async def _run_step(self, nodes: list[str]) -> None:
        """One srun per GPU count, at once (all in the one reservation, under the one job name)."""
        self.stepped = nodes
        for name in nodes:
            self.runs[name].started = time.monotonic()
            self.log[name].info("host_start", command="reset", via="srun", reservation=self.reservation)
        async with anyio.create_task_group() as group:
            for gpus, members in by_gpus(nodes, self.before).items():
                group.start_soon(self._one_step, members, gpus)

    async def _one_step(self, nodes: list[str], gpus: int) -> None:
        bound = step_seconds([self.runs[n].host for n in nodes], self.options) + IMMEDIATE_S
        process = await self.slurm.start(srun_argv(self.reservation, nodes, _minutes(bound), gpus), timeout=bound,
                                         env=srun_env(os.environ))
        out = BufferedByteReceiveStream(process.stdout)
        finished = False
        try:
            with anyio.move_on_after(client_deadline(bound)):
                async with anyio.create_task_group() as group:
                    group.start_soon(self._read_lines, out)
                    group.start_soon(self._read_stderr, process.stderr)
                    with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                        await process.stdin.send(self._document(nodes))
                        await process.stdin.aclose()
                    await process.wait()
            finished = True
        finally:
            with self.finishing.shielded():
                await self._end_step(process, out)
            self.step.exit_status.update(dict.fromkeys(nodes, process.returncode))
            self._merge(nodes, finished)

    async def _end_step(self, process: Stream, out: BufferedByteReceiveStream) -> None:
        """A step cut short: cancel its job (the nodes' fleets end their commands and report), read what they
        still say, then end srun."""
        if process.returncode is None:
            with suppress(SlurmError):
                await self._cancel(await self.slurm.jobs_named(self.reservation, getpass.getuser()))
            with anyio.move_on_after(CANCEL_GRACE_S):
                await self._read_lines(out)
            process.kill()
        with anyio.move_on_after(REAP_TIMEOUT_S):
            await process.wait()

    async def _read_lines(self, out: BufferedByteReceiveStream) -> None:
        while True:
            try:
                line = await out.receive_until(b"\n", LINE_LIMIT)
            except (anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError):
                return
            except anyio.DelimiterNotFound:
                self.step.noise.append(f"a line over {LINE_LIMIT} bytes")
                return
            self._take(line)

    async def _read_stderr(self, stream: ByteReceiveStream) -> None:
        with suppress(anyio.EndOfStream, anyio.ClosedResourceError):
            async for chunk in stream:
                self.step.stderr_text = (self.step.stderr_text + chunk.decode(errors="replace"))[-STDERR_LIMIT:]

    def _take(self, raw: bytes) -> None:
        line = raw.decode(errors="replace")
        try:
            whole = self.frames.feed(line)
        except FrameError as exc:
            self.step.noise.append(f"{exc}: {line[:120]}")
            return
        if whole is None:
            return
        node, message = whole
        run = self.runs.get(node)
        if run is None:
            self.step.noise.append(f"a message from {node}, which is no target")
            return
        self.step.heard_from.add(node)
        if "log" in message:
            self.logs.relay(run.host.name, message["log"])
            if message["log"].get("event") == "step_start":
                with suppress(ValueError):
                    run.current = StepName(message["log"].get("step"))
        elif "report" in message:
            try:
                self.step.reports[node] = host_from_document(run.host.name, message["report"])
                self.step.reported_at[node] = time.monotonic()
            except DocumentError as exc:
                self.step.noise.append(f"{node}: a report fleet cannot read ({exc})")

    def _merge(self, nodes: Sequence[str], finished: bool) -> None:
        """Each node's report into its host; a node that sent none failed, unless the run was cut short (its
        report then says by what, during the step its log last began)."""
        for name in nodes:
            run, report = self.runs[name], self.step.reports.get(name)
            if report is None and not finished:
                continue
            if report is None:
                said = "; ".join(self.step.stderr[-3:] + self.step.noise[-2:]) or "nothing on stderr"
                self._end(name, HostStatus.FAILED,
                          f"no report from {name} (srun exit status {self.step.exit_status.get(name)}): {said}"[:500],
                          Reason.NO_REPORT)
                continue
            run.steps, run.killed, run.kept, run.gpus = list(report.steps), report.killed, report.kept, report.gpus
            run.memory_before, run.health = report.memory_before_mib, report.health
            run.fabric_manager = report.fabric_manager
            run.finish(report.status, report.error, report.reason)
            run.ended = self.step.reported_at.get(name, run.ended)  # as the node ended, not as the whole step did
            run.started = (run.ended or time.monotonic()) - report.duration_s
            self._ended(run)

    # --- cleanup ------------------------------------------------------------------------------------

    async def _cleanup(self) -> None:
        """End the step's jobs, drain what must stay out of service, then remove the reservation: in that order, so
        that no moment lets a job onto a node the step failed, and Slurm accepts the removal (it refuses one a job
        still uses). A drain Slurm could not be seen to take after the tries keeps the reservation (it ends by
        itself at its Duration), naming the nodes."""
        if self.stepped:
            still = await self._end_jobs()
            if still is not None:  # the reservation's removal, refused while a job uses it, then says what is left
                for name in self.stepped:
                    self.log[name].warning("slurm_error", node=name, error=still)
        ended = [Ended(name=name, status=self.runs[name].status or HostStatus.FAILED,
                       error=self.runs[name].error or NO_REPORT, touched=self.step.touched(name))
                 for name in self.stepped]
        drained = await drain_failed(self.slurm, self.run_id, ended, self.log, self.poll_s)
        if not drained.unconfirmed:
            removed = await self.maintenance.remove()
            if removed is not None:
                self._keep_reservation(f"not removed: {removed}", [])
        if drained.unconfirmed:
            self._keep_reservation(str(drained.error), drained.unconfirmed)

    async def _end_jobs(self) -> str | None:
        """Cancel the step's jobs by their ids until Slurm shows none: whether or not srun still lives (a srun killed
        before its first frame leaves its job, and the reset in it, running). None once none is left; else what
        is left (the ids, or why Slurm could not say), after CANCEL_GRACE_S."""
        user = getpass.getuser()

        async def look() -> tuple[str, ...] | SlurmError:
            try:
                jobs = await self.slurm.jobs_named(self.reservation, user)
                await self._cancel(jobs)
            except SlurmError as exc:
                return exc
            return jobs

        polled = await poll_until(look, lambda seen: seen == (), itertools.repeat(JOB_POLL_S),
                                  within=TimeBudget(window=CANCEL_GRACE_S))
        if polled.met:
            return None
        if isinstance(polled.last, SlurmError):
            return f"cannot tell whether the step's job ended: {polled.last}"
        return f"job {', '.join(polled.last)} of the step still in Slurm after {CANCEL_GRACE_S:g} s"

    async def _cancel(self, jobs: Sequence[str]) -> None:
        """scancel each job once (Slurm then signals its tasks and, after KillWait, kills them: a second scancel
        would only interrupt what the nodes' fleets do while they end, their verify)."""
        fresh = [job for job in jobs if job not in self.cancelled]
        if fresh:
            await self.slurm.cancel(fresh)
            self.cancelled.update(fresh)

    async def _read_after(self) -> None:
        """Every node as Slurm shows it now, after every change the cleanup made (drains, the reservation and the
        leftovers removed): the report's state_after and reason_after."""
        after = await self._read_all(self.stepped)
        for name, run in self.runs.items():
            if name in self.stepped and after is not None:
                self._record_after(name, after.get(name))
            elif name not in self.stepped and run.scheduler is not None and run.scheduler.state_after is None:
                self._record_after(name, self.before.get(name))

    async def _read_all(self, names: Sequence[str]) -> dict[str, SlurmNode] | None:
        """Every named node in one `scontrol show node`; None (each node's record says why) when Slurm failed."""
        if not names:
            return {}
        try:
            return await self.slurm.nodes(names)
        except SlurmError as exc:
            for name in names:
                self._record(name, error=f"slurm: {exc}")
            return None

    def _record_after(self, name: str, node: SlurmNode | None) -> None:
        self._record(name, state_after=node.state if node else None, reason_after=node.reason if node else None)

    def _keep_reservation(self, why: str, unconfirmed: Sequence[str]) -> None:
        """The reservation stays (it keeps other jobs off the nodes until its Duration ends): every reserved node's
        record says so, and names the nodes not seen drained."""
        delete = f"scontrol delete ReservationName={self.reservation}"
        what = f"{hostlist(unconfirmed)} not seen drained ({why}); once drained: {delete}" if unconfirmed \
            else f"{why}; to remove it: {delete}"
        error = f"slurm: reservation {self.reservation} kept until its Duration ends: {what}"
        for name in self.maintenance.nodes:
            self.log[name].error("slurm_error", node=name, error=error)
            self._record(name, error=error)

    def _abandoned(self) -> None:
        """A third interrupt stopped the cleanup: every stepped node's record says what may be left."""
        left = f"reservation {self.reservation} still in place" if self.maintenance.held else "reservation removed"
        for name in self.stepped:
            self._record(name, abandoned=True, error=f"slurm: cleanup abandoned at the third interrupt ({left});"
                                                     f" check with: scontrol show reservation {self.reservation}")

    # --- outcomes -----------------------------------------------------------------------------------

    def _end(self, name: str, status: HostStatus, error: str, reason: Reason) -> None:
        run = self.runs[name]
        run.finish(status, error, reason)
        self.log[name].warning("host_end", status=status.value, error=error, reason=reason.value)
        self._ended(run)

    def _ended(self, run: HostRun) -> None:
        """Tell the run's history this host's outcome as it is known (the release's Slurm state comes with the
        run's end)."""
        if self.on_host_end is not None:
            with suppress(Exception):
                self.on_host_end(run.report())

    def _end_all(self, names: Sequence[str], status: HostStatus, error: str, reason: Reason) -> None:
        for name in names:
            self._end(name, status, error, reason)

    def _record(self, name: str, **changes: Any) -> None:
        """The node's record, changed (this run body is the scheduler here: it records on the host itself)."""
        run = self.runs[name]
        if run.scheduler is not None:
            run.scheduler = replace(run.scheduler, **changes)


def _ran(report: HostReport | None) -> bool:
    """Whether the node's reset did anything: a step that ran (a version refusal runs none)."""
    return report is None or any(s.status is not StepStatus.SKIPPED for s in report.steps)


def _minutes(seconds: float) -> int:
    return max(1, math.ceil(seconds / 60))


async def run_via_srun(hosts: Sequence[Host], options: RunOptions, logs: RunLogs, slurm: Slurm | None = None,
                       on_host_end: HostEnded | None = None, interrupts: Interrupts | None = None,
                       watch: Watch | None = None,
                       tell: Callable[[str], None] | None = None) -> tuple[RunReport, RunState]:
    """The run's report, as `fleet.engine.graph.run_hosts` gives it, from one job step instead of SSH fan-out;
    `tell`: the operator's lines (a leftover reservation kept or removed)."""
    runs = host_runs(hosts, options)
    srun = SrunRun(slurm or Slurm(), runs, options, logs, on_host_end, interrupts, tell=tell)
    return await run_bounded(runs, options, logs.run_id, srun.body, interrupts, watch)
