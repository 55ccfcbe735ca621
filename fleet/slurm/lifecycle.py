"""Slurm around each host's walk: the scheduler seam of the task graph (`fleet.engine.schedulers.Scheduler`).

    admit(wave)   one `scontrol show node` and one `squeue` for the wave's nodes, then one
                  `scontrol update ... State=DRAIN Reason="fleet: run <id>"` for those in service
                  (and those an earlier fleet run left drained: adopted, `fleet.slurm.policy`);
                  a read or a drain that answered with an error is tried again (`fleet.slurm.tries`),
                  a drain after reading back what took: a node Slurm shows drained for this run goes
                  on; one still not drained after the tries fails untouched (and is still released)
    ready(host)   wait until no job holds the node (DRAINED, not DRAINING), up to --drain-wait
                  (`fleet.slurm.waiting`: one poller for every waiting node, the same wait srun uses)
    release(host) once the host has its outcome: read the node, decide (resume, restore, keep
                  drained or leave, `fleet.slurm.policy.release`), update; an update that answered
                  with an error is decided again from what Slurm then shows (`fleet.slurm.tries`); the
                  report's state_after/reason_after are Slurm's, read last (a resume's transient
                  NOT_RESPONDING waited out, up to SETTLE_READ_S); bounded by `release_s`, which holds
                  every try at its longest, and past it the node is left with fleet's
                  `release not finished` reason

In a dry run and in `check`, Slurm is only read: nothing is drained, nothing waited for. The releases
are what an interrupted run still finishes (`fleet.engine.interrupts`): a third signal abandons them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any

import anyio

from fleet.engine.interrupts import Interrupts
from fleet.engine.schedulers import Ready
from fleet.engine.walk import HostRun, Mode
from fleet.model.hostlog import HostLog
from fleet.model.report import HostReport, HostStatus, Reason, SchedulerRecord
from fleet.node.budget import TimeBudget
from fleet.node.poll import poll_until
from fleet.slurm import NAME, policy
from fleet.slurm.control import Slurm, SlurmError
from fleet.slurm.records import SlurmNode
from fleet.slurm.tries import retry, tries_s
from fleet.slurm.variables import node_name
from fleet.slurm.waiting import POLL_S, JobWaits, Wait
from fleet.transport.base import client_deadline

# Default --drain-wait: how long a node's jobs may take to end before the host is skipped.
DRAIN_WAIT_S = 600.0
# Seconds a resumed node's state is read again while Slurm still flags it NOT_RESPONDING (until its next ping).
SETTLE_READ_S = 10.0
SETTLE_POLL_S = 0.5
# Slurm commands in one try of a release: the read, and the update it decides.
RELEASE_COMMANDS = 2
# What a release whose bound ran out says, in the node's reason (fleet's own: the next run takes the drain over).
NOT_FINISHED = "release not finished"


def release_s(command_s: float, pause_s: float) -> float:
    """The longest a node's release takes (it runs shielded, even on Ctrl-C): its tries, each a read and an update at
    their client deadline, the pauses between, and the last read of what it left (waiting out a resumed node's
    NOT_RESPONDING, up to SETTLE_READ_S, then one more read). Past it, one read and one drain leave the node with
    fleet's `release not finished` reason (`finish_s`)."""
    return tries_s(RELEASE_COMMANDS, command_s, pause_s=pause_s) + SETTLE_READ_S + client_deadline(command_s)


def finish_s(command_s: float) -> float:
    """What a release whose bound ran out may still take: a read, a drain and a read back."""
    return 3 * client_deadline(command_s)


@dataclass(kw_only=True)
class _Node:
    """One host's node through the run."""

    name: str
    before: SlurmNode | None = None
    how: policy.Admission | None = None
    jobs: tuple[str, ...] = ()
    error: str | None = None  # why the host may not be reset (Slurm unreadable, unknown node, drain refused)
    waiting_since: float = 0.0
    record: SchedulerRecord | None = None  # what the report says of it (`fleet.engine.schedulers.Scheduler` returns it)
    released: bool = False  # its release began
    given_back: bool = False  # its release is over (done, failed or abandoned)

    def note(self, **changes: Any) -> SchedulerRecord | None:
        """The record, changed."""
        if self.record is not None:
            self.record = replace(self.record, **changes)
        return self.record


class SlurmLifecycle:
    """Drain, wait, resume around every host of a run; see the module docstring."""

    def __init__(self, slurm: Slurm, run_id: str, mode: Mode, *, drain_wait_s: float = DRAIN_WAIT_S,
                 poll_s: float = POLL_S, run_over: Callable[[str], bool] = lambda run_id: False,
                 interrupts: Interrupts | None = None) -> None:
        """`run_over(run_id)`: whether that earlier run is known to be over (its drain then is an orphan)."""
        self.slurm = slurm
        self.run_id = run_id
        self.mode = mode
        self.drain_wait_s = drain_wait_s
        self.poll_s = poll_s
        self.run_over = run_over
        self._nodes: dict[str, _Node] = {}  # host name -> its node
        self.waits = JobWaits(slurm, poll_s)
        self.release_s = release_s(slurm.timeout, poll_s)
        self._finishing = (interrupts or Interrupts()).finishing(
            self._still_held, self.release_s + finish_s(slurm.timeout), "them drained")

    def _still_held(self) -> str | None:
        """What an interrupted run still has to give back: "releasing 12 Slurm nodes", or None."""
        held = [n for n in self._nodes.values() if self._held(n) and not n.given_back]
        return f"releasing {len(held)} Slurm node{'s' if len(held) != 1 else ''}" if held else None

    def _held(self, node: _Node) -> bool:
        return self.mode is Mode.RESET and node.how in (policy.Admission.DRAIN, policy.Admission.ADOPT)

    # --- admit: read the wave, drain what fleet may drain ---------------------------------------

    async def admit(self, runs: Sequence[HostRun]) -> dict[str, SchedulerRecord]:
        """Each host's record, by host name (`fleet.engine.graph` records it on the host)."""
        nodes = {run.host.name: _Node(name=node_name(run.host)) for run in runs}
        self._nodes.update(nodes)
        names = sorted({n.name for n in nodes.values()})
        try:
            seen, jobs = await retry(lambda number: self.slurm.look(names), pause_s=self.poll_s)
        except SlurmError as exc:
            for node in nodes.values():
                node.error = f"slurm: cannot read the node: {exc}"
            return self._record(runs)
        now = anyio.current_time()
        for node in nodes.values():
            node.waiting_since = now  # --drain-wait counts from here, for every node of the wave
            node.before = seen.get(node.name)
            node.jobs = jobs.get(node.name, ())
            if node.before is None:
                node.error = f"slurm: Slurm has no node {node.name} (set slurm.node if its Slurm name differs)"
            else:
                earlier = policy.in_flight_run(node.before)
                node.how = policy.admission(node.before, earlier is not None and self.run_over(earlier))
        await self._drain([n for n in nodes.values() if self._held(n)])
        return self._record(runs)

    async def _drain(self, nodes: Sequence[_Node]) -> None:
        """Drain the nodes at once. An update that answered with an error may still have been applied: the next try
        reads Slurm first and drains only what it does not show drained for this run. A node still not drained
        after the tries fails, and is still released (its release reads it once more: a drain applied later is
        given back)."""
        if not nodes:
            return
        pending = list(nodes)

        async def attempt(number: int) -> None:
            nonlocal pending
            if number > 1:
                seen = await self.slurm.nodes([n.name for n in pending])
                pending = [n for n in pending if not policy.drained_for(seen.get(n.name), self.run_id)]
            if pending:
                await self.slurm.update([n.name for n in pending], "DRAIN", policy.own_reason(self.run_id))

        try:
            await retry(attempt, pause_s=self.poll_s)
        except SlurmError as exc:
            for node in pending:
                node.error = f"slurm: cannot drain the node: {exc}"

    def _record(self, runs: Sequence[HostRun]) -> dict[str, SchedulerRecord]:
        for run in runs:
            node = self._nodes[run.host.name]
            before = node.before
            node.record = SchedulerRecord(
                node=node.name,
                by=NAME,
                state_before=before.state if before else None,
                reason_before=before.reason if before else None,
                jobs=node.jobs,
                plan=policy.plan_line(before, node.jobs, self.drain_wait_s)
                if self.mode is Mode.PLAN and before else None,
                error=node.error,
                taken_over=self._taken_over(node),
            )
        return {name: record for name, record in ((r.host.name, self._nodes[r.host.name].record) for r in runs)
                if record is not None}

    def _taken_over(self, node: _Node) -> str | None:
        """The earlier run whose drain this run holds now (adopted, and the drain took), else None."""
        if node.how is not policy.Admission.ADOPT or not self._held(node) or node.error is not None:
            return None
        earlier = policy.fleet_run_of(node.before.reason if node.before else None)
        return earlier[0] if earlier else None

    # --- ready: wait until no job holds the node ------------------------------------------------

    async def ready(self, run: HostRun, log: HostLog) -> Ready:
        """The host may be reset now (no outcome), or the outcome it ends with, untouched; and its record."""
        node = self._nodes[run.host.name]
        outcome = await self._wait(node, log)
        return Ready(node.record, outcome)

    async def _wait(self, node: _Node, log: HostLog) -> tuple[HostStatus, str, Reason] | None:
        if node.error is not None:
            log.error("slurm_error", node=node.name, error=node.error)
            return HostStatus.FAILED, node.error, Reason.SLURM
        if node.before is None or self.mode is Mode.CHECK:
            return None
        if node.how is policy.Admission.LEAVE:
            log.warning("slurm_skipped", node=node.name, state=node.before.state, reason=node.before.reason)
            return HostStatus.SKIPPED, policy.skipped(node.before), Reason.SLURM
        if self.mode is not Mode.RESET:
            return None
        taken = self._taken_over(node)
        log.info("slurm_wait", node=node.name, state=node.before.state, jobs=list(node.jobs),
                 drain_wait_s=self.drain_wait_s, **({"taken_over": taken} if taken else {}))
        started = anyio.current_time()
        wait = Wait(name=node.name, drained=True, jobs=node.jobs)
        await self.waits.wait(wait, node.waiting_since + self.drain_wait_s)
        node.jobs = wait.jobs
        node.note(jobs=node.jobs, waited_s=round(anyio.current_time() - started, 3))
        error = wait.outcome(self.drain_wait_s)
        if wait.lost is not None:
            log.warning("slurm_lost", node=node.name, error=error)
            return HostStatus.SKIPPED, wait.lost, Reason.SLURM
        if error is not None:
            log.warning("slurm_jobs_running", node=node.name, jobs=list(node.jobs))
            return HostStatus.SKIPPED, error, Reason.JOBS_RUNNING
        log.info("slurm_drained", node=node.name, waited_s=round(anyio.current_time() - started, 3))
        return None

    async def serve(self) -> None:
        """The one poller of every node waiting for its jobs (`fleet.slurm.waiting`)."""
        await self.waits.serve()

    # --- release: resume, restore, keep drained or leave ----------------------------------------

    async def release(self, run: HostRun, report: HostReport, log: HostLog) -> SchedulerRecord | None:
        """The node's end of the run (shielded, bounded: it runs on Ctrl-C and past the deadline too; a third
        interrupt abandons it, and the report says the node was left drained); its record as it left it."""
        node = self._nodes.get(run.host.name)
        if node is None or node.released or node.before is None:
            return None
        node.released = True
        if not self._held(node):
            node.given_back = True
            return node.note(state_after=node.before.state, reason_after=node.before.reason)
        with self._finishing.shielded() as shield:
            with anyio.move_on_after(self.release_s) as bound:
                await self._release(run, node, report, log)
            if bound.cancelled_caught:
                await self._not_finished(node, log)
        node.given_back = True
        if shield.cancelled_caught:
            log.error("slurm_abandoned", node=node.name)
            return node.note(error=f"slurm: release abandoned at the third interrupt: {node.name} left drained"
                                   f" ({policy.own_reason(self.run_id)})", abandoned=True)
        return node.record

    async def _not_finished(self, node: _Node, log: HostLog) -> None:
        """The release's bound ran out: a node Slurm still shows drained with this run's bare reason (which says a
        run is in flight) gets fleet's `release not finished` reason instead, read back; the record says so."""
        why = f"{NOT_FINISHED} within {self.release_s:g} s"
        after: SlurmNode | None = None
        with anyio.move_on_after(finish_s(self.slurm.timeout)), suppress(SlurmError):
            now = (await self.slurm.nodes([node.name])).get(node.name)
            after = now
            if policy.drained_for(now, self.run_id):
                await self.slurm.update([node.name], "DRAIN", policy.failed_reason(self.run_id, why))
                after = (await self.slurm.nodes([node.name])).get(node.name)
        log.error("slurm_error", node=node.name, error=why)
        node.note(state_after=after.state if after else None, reason_after=after.reason if after else None,
                  error=f"slurm: releasing {node.name}: {why}"
                        + (f"; left {policy.describe(after)}" if after else "; Slurm did not answer"))

    async def _release(self, run: HostRun, node: _Node, report: HostReport, log: HostLog) -> None:
        """Read, decide, update; after an update that answered with an error, read and decide again: it may have
        been applied (slurmctld busy: `Socket timed out on send/recv operation`). Then read what it left."""
        assert node.before is not None and node.how is not None
        touched = policy.touched(report.status, started=run.started is not None)

        async def attempt(number: int) -> bool:
            now = (await self.slurm.nodes([node.name])).get(node.name)
            assert node.before is not None and node.how is not None
            action = policy.release(node.how, node.before, now, self.run_id, report.status, report.error,
                                    was_touched=touched)
            log.info("slurm_release", node=node.name, action=action.what.value, why=action.why, attempt=number)
            await self._apply(node.name, action)
            return action.what is policy.Release.RESUME

        def failed(number: int, exc: SlurmError) -> None:
            log.warning("slurm_error", node=node.name, error=str(exc), attempt=number)

        failure: SlurmError | None = None
        try:
            resumed = await retry(attempt, pause_s=self.poll_s, failed=failed)
        except SlurmError as exc:
            failure, resumed = exc, False
        try:
            after = await self._settled(node.name, resumed)
        except SlurmError as exc:
            failure = failure or exc
            after = None
        node.note(state_after=after.state if after else None, reason_after=after.reason if after else None,
                  error=f"slurm: {failure}" if failure else None)

    async def _apply(self, name: str, action: policy.Action) -> None:
        if action.what is policy.Release.RESUME:
            await self.slurm.update([name], "RESUME")
        elif action.what in (policy.Release.RESTORE, policy.Release.KEEP_DRAINED):
            await self.slurm.update([name], "DRAIN", action.reason)

    async def _settled(self, name: str, resumed: bool) -> SlurmNode | None:
        """The node as Slurm shows it now; after a resume, once its transient NOT_RESPONDING is gone (slurmctld
        pings a resumed node first), up to SETTLE_READ_S: then as it is, flag and all."""
        within = TimeBudget(window=SETTLE_READ_S if resumed else 0.0)

        async def look() -> SlurmNode | None:
            return (await self.slurm.nodes([name])).get(name)

        polled = await poll_until(look, _responding, itertools.repeat(SETTLE_POLL_S), within=within)
        return polled.last


def _responding(node: SlurmNode | None) -> bool:
    """Whether a node read after a resume shows how it is (gone, or answering slurmctld's pings)."""
    return node is None or "NOT_RESPONDING" not in node.flags
