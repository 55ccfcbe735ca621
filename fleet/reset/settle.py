"""settle: wait, with backoff and no fixed sleep, until every GPU's memory is at or under what it may hold.

Asks the node: `nvidia-smi --query-gpu=index,uuid,memory.used,mig.mode.current` until every GPU is at or
under its allowance, within `settle_timeout` (a driver frees a dead process's memory some time after it
died); when the kill kept processes on purpose (protected, such as the MPS server), also the compute apps,
to know what those hold. When memory is still held, one complete look says whose it is (`fleet.reset.leaks`):
at the end of the window, and at once, after the first poll, when the kill kept a job's processes.
Decides (pure, `Allowance` and the verdicts below): a GPU's allowance is `memory_threshold_mib`
(`mig_memory_threshold_mib` when MIG is enabled: an idle MIG GPU reserves tens of MiB with no process),
plus what kept processes use on it; when each GPU first went (and stayed) under; and, for memory still held,
why: only a scheduler's job's processes hold it (`memory_held_by_job`, at once: fleet never kills them, waiting
cannot help), another process does (`memory_held`), or no process does (`memory_leaked`: a leaked context,
which `--gpu-reset` resets, `fleet.reset.remedy`). Reports: how long each GPU took (`gpus[].settle_s`), or
which GPU still holds what, and whose it is.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from fleet.inventory.host import Host
from fleet.model.report import Reason, StepName, StepOutcome, StepResult, StepStatus, Verdict
from fleet.node.bounds import commands_s
from fleet.node.budget import Room, TimeBudget
from fleet.node.node import Node
from fleet.node.poll import backoff, poll_until
from fleet.node.probes import smi
from fleet.reset import leaks, remedy

# The nvidia-smi reads of one poll (the GPU query, the compute apps when the kill kept processes): the room past
# the window for the poll that sees it end, each at nvidia-smi's bound.
POLL_SMI = 2


def wait_room(host: Host) -> Room:
    """One wait for the memory: `settle_timeout`, and the poll that sees it end."""
    return Room(host.settle_timeout, commands_s(host, smi=POLL_SMI))


def longest_s(host: Host, *, gpu_reset: bool = False) -> float:
    """The longest settle can take: its wait, and a look at held memory after the first poll (a job's processes
    kept) and after the wait; with `--gpu-reset`, the resets and a second wait."""
    waits = wait_room(host).seconds + 2 * leaks.look_room(host).seconds
    if gpu_reset:
        waits += remedy.reset_room(host).seconds + wait_room(host).seconds
    return waits


@dataclass(frozen=True)
class Allowance:
    """What each GPU may hold and still count as free: the threshold (the MIG one on a MIG-enabled GPU,
    when set), plus the MiB that processes fleet keeps on purpose use on it (by GPU uuid)."""

    threshold: int
    mig_threshold: int | None = None
    kept_mib: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, host: Host, kept_apps: Iterable[smi.ComputeApp] = ()) -> Allowance:
        return cls(host.memory_threshold_mib, host.mig_memory_threshold_mib, kept_usage(kept_apps))

    def limit(self, row: smi.GpuRow) -> int:
        """The MiB a GPU may hold with no process of its own: the threshold for its MIG mode."""
        if row.mig and self.mig_threshold is not None:
            return max(self.threshold, self.mig_threshold)
        return self.threshold

    def kept(self, row: smi.GpuRow) -> int:
        return self.kept_mib.get(row.uuid, 0) if row.uuid else 0

    def problem(self, row: smi.GpuRow) -> str | None:
        """What is wrong with one GPU's memory (settle's verdict, and verify's): None when it is free."""
        if row.memory_used_mib is None:
            return f"gpu {row.index} memory.used is not a number ([N/A])"
        kept = self.kept(row)
        if row.memory_used_mib - kept > self.limit(row):
            besides = f" ({kept} MiB of it by kept processes)" if kept else ""
            return f"gpu {row.index} holds {row.memory_used_mib} MiB{besides}"
        return None


def kept_usage(apps: Iterable[smi.ComputeApp]) -> dict[str, int]:
    """GPU uuid -> MiB the given compute apps use on it."""
    used: dict[str, int] = defaultdict(int)
    for app in apps:
        if app.gpu_uuid:
            used[app.gpu_uuid] += app.used_mib or 0
    return dict(used)


async def settle(node: Node, kept: Collection[int] = (), job_pids: Collection[int] = (), *,
                 gpu_reset: bool = False) -> StepOutcome:
    """Poll GPU memory with backoff until every GPU is under its allowance; no fixed sleep.

    `kept`: pids of GPU holders the kill left alive as part of the machine; what they use does not count.
    `job_pids`: pids of holders it left alive as a job's processes: when memory is held after the first poll,
    one look says whether only they hold it, and the step fails at once if so.
    `gpu_reset` (`--gpu-reset`): when the window passes with memory no process holds, reset those GPUs
    (`fleet.reset.remedy`) and wait once more; memory that survives a reset needs a reboot.
    """
    started, host = time.monotonic(), node.host
    budget = wait_room(host).start()
    waited = await _wait_free(node, kept, budget, polls=1 if job_pids else None)
    if job_pids and waited.rows and not waited.free:
        seen = await _look(node, kept)
        held = job_verdict(seen.unsettled, seen.found.titles)
        if held is not None:
            return _failed(started, waited, held, StepStatus.FAILED)
        waited = await _wait_free(node, kept, budget, settled=waited.settled)
    if waited.free:
        return _settled(started, waited, host.memory_threshold_mib)
    if not waited.rows:
        return _failed(started, waited, (Reason.MEMORY_HELD, "nvidia-smi listed no GPUs"))
    return await _whose(node, kept, waited, started, budget, gpu_reset=gpu_reset)


async def _whose(node: Node, kept: Collection[int], waited: Waited, started: float, budget: TimeBudget, *,
                 gpu_reset: bool) -> StepOutcome:
    """The window passed with memory held: look once, and say whose it is (or reset it, with `gpu_reset`)."""
    host = node.host
    seen = await _look(node, kept)
    if not seen.unsettled:  # it came back while the look was taken
        now = {r.index: round(budget.elapsed, 3) for r in waited.rows}
        return _settled(started, replace(waited, settled={**now, **waited.settled}), host.memory_threshold_mib)
    verdict = job_verdict(seen.unsettled, seen.found.titles)
    if verdict is not None:
        return _failed(started, waited, verdict, StepStatus.FAILED)
    if not all(u.leaked for u in seen.unsettled):
        return _failed(started, waited, held_verdict(seen.unsettled, seen.allowance, host.settle_timeout))
    chosen = remedy.choose_gpu_reset([u.index for u in seen.unsettled], seen.found.holders_by_gpu(),
                             seen.found.board.nvswitch if seen.found.board else None,
                             [r.index for r in seen.found.rows])
    context = leaked_line(seen.unsettled, host.settle_timeout)
    if not gpu_reset:
        return _failed(started, waited, (Reason.MEMORY_LEAKED, f"{context}; {reset_advice(chosen)}"))
    return await _after_reset(node, kept, waited, chosen, context, started)


async def _after_reset(node: Node, kept: Collection[int], before: Waited, chosen: remedy.GpuReset, context: str,
                       started: float) -> StepOutcome:
    """Reset the GPUs whose context leaked, then wait once more: a reboot is the next remedy, not fleet's."""
    host = node.host
    reset = await remedy.reset_gpus(node, chosen)
    if not reset.ran:
        return _failed(started, before, (Reason.MEMORY_LEAKED, f"{context}; {reset.line}"))
    after = await _wait_free(node, kept, wait_room(host).start())
    if after.free:
        detail = f"{reset.line}; {len(after.rows)} GPUs at or under {host.memory_threshold_mib} MiB after it"
        return StepOutcome(result=StepResult.since(StepName.SETTLE, started, detail), settle_s=before.settled)
    still = unsettled_error(after.rows, after.allowance, host.settle_timeout)
    line = f"needs_reboot: {still}, even after {reset.line}"
    return _failed(started, before, (Reason.NEEDS_REBOOT, line), StepStatus.FAILED)


def _settled(started: float, waited: Waited, threshold: int) -> StepOutcome:
    detail = f"{len(waited.rows)} GPUs at or under {threshold} MiB after {waited.elapsed:.1f} s"
    return StepOutcome(result=StepResult.since(StepName.SETTLE, started, detail), settle_s=waited.settled)


def _failed(started: float, waited: Waited, verdict: Verdict, status: StepStatus = StepStatus.TIMEOUT) -> StepOutcome:
    reason, line = verdict
    return StepOutcome(result=StepResult.since(StepName.SETTLE, started, line, status, line, reason),
                       settle_s=waited.settled)


@dataclass(frozen=True)
class Seen:
    """One look at whose the memory is: the look, the allowance it gives, and each GPU still over it."""

    found: leaks.Look
    allowance: Allowance
    unsettled: tuple[leaks.Unsettled, ...]


async def _look(node: Node, kept: Collection[int]) -> Seen:
    """Look once (`fleet.reset.leaks.look`) and say, for each GPU over its allowance, who holds it."""
    found = await leaks.look(node)
    machine = found.machine | frozenset(kept)
    allowance = Allowance.of(node.host, [a for a in found.apps if a.pid in machine])
    problems = {r.index: p for r in found.rows if (p := allowance.problem(r)) is not None}
    return Seen(found, allowance, leaks.explain(found, problems, kept))


@dataclass(frozen=True, kw_only=True)
class Waited:
    """One settle window: the last rows read, when each GPU went free, the allowance, and whether all are."""

    rows: tuple[smi.GpuRow, ...]
    settled: dict[int, float]
    allowance: Allowance
    elapsed: float

    @property
    def free(self) -> bool:
        return bool(self.rows) and len(self.settled) == len(self.rows)


async def _wait_free(node: Node, kept: Collection[int], budget: TimeBudget, *, polls: int | None = None,
                     settled: Mapping[int, float] | None = None) -> Waited:
    """Poll (backoff) until every GPU is under its allowance, the budget's window passes, or `polls` polls
    were made; `settled`: when each GPU went under in polls before these (the same budget)."""
    host = node.host
    noted: dict[int, float] = dict(settled or {})
    query = smi.gpu_query(host.nvidia_smi, smi.SETTLE_FIELDS)

    async def look() -> Waited:
        rows = await node.ask(query, step=StepName.SETTLE, budget=budget)
        allowance = Allowance.of(host)
        if kept:
            apps = await node.ask(smi.compute_apps(host.nvidia_smi), step=StepName.SETTLE, budget=budget)
            allowance = Allowance.of(host, [a for a in apps if a.pid in kept])
        note_settled(rows, allowance, budget.elapsed, noted)
        return Waited(rows=rows, settled=noted, allowance=allowance, elapsed=budget.elapsed)

    waits = backoff() if polls is None else itertools.islice(backoff(), polls - 1)
    return (await poll_until(look, lambda seen: seen.free, waits, within=budget)).last


def note_settled(rows: Iterable[smi.GpuRow], allowance: Allowance, elapsed: float,
                 settled: dict[int, float]) -> None:
    """Record when each GPU first went (and stayed) at or under its allowance."""
    for row in rows:
        if allowance.problem(row) is None:
            settled.setdefault(row.index, round(elapsed, 3))
        else:
            settled.pop(row.index, None)


def first_of(problems: Sequence[str]) -> str:
    """The first problem, and how many more there are."""
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return problems[0] + more


def unsettled_error(rows: Sequence[smi.GpuRow], allowance: Allowance, timeout: float) -> str:
    if not rows:
        return "nvidia-smi listed no GPUs"
    problems = [p for p in (allowance.problem(r) for r in rows) if p]
    return f"{first_of(problems)} after {timeout:g} s (threshold {allowance.threshold} MiB)"


# --- whose the memory is, in one line (pure) -----------------------------------

# A leaked GPU that processes fleet keeps as part of the machine (nvidia-persistenced, DCGM) hold open.
MACHINE_ONLY = "only the machine's own processes"



def job_verdict(unsettled: Sequence[leaks.Unsettled], titles: Mapping[int, str]) -> Verdict | None:
    """`memory_held_by_job` when a GPU's memory is held only by a job's processes (besides the machine's own):
    `gpu 0 holds 30000 MiB: memory held by Slurm job 4711 (slurmstepd pid 20); ...`, with what its scheduler says
    to do (`fleet.node.jobs.JobSide.hint`). None otherwise."""
    by_jobs = [u for u in unsettled if u.by_jobs]
    if not by_jobs:
        return None
    line = (f"{first_of([u.problem for u in by_jobs])}: memory held by {leaks.jobs_holding(by_jobs, titles)};"
            f" fleet never kills a job's processes: {leaks.job_hints(by_jobs)}")
    return Reason.MEMORY_HELD_BY_JOB, line


def held_verdict(unsettled: Sequence[leaks.Unsettled], allowance: Allowance, timeout: float) -> Verdict:
    """`memory_held`: a process that is no part of the machine still holds a GPU's memory; it is named."""
    held = [u for u in unsettled if not u.leaked]
    named = [u for u in held if u.holders or u.strays]
    who = f", held by {leaks.who(named[0].holders, named[0].strays)}" if named else ""
    line = f"{first_of([u.problem for u in held])} after {timeout:g} s (threshold {allowance.threshold} MiB){who}"
    return Reason.MEMORY_HELD, line


def leaked_line(unsettled: Sequence[leaks.Unsettled], timeout: float) -> str:
    """`gpu 3 holds 4096 MiB with no process holding it after 60 s: a leaked context`."""
    phrases = [f"{u.problem} with {MACHINE_ONLY if u.machine else 'no process'} holding it" for u in unsettled]
    return f"{first_of(phrases)} after {timeout:g} s: a leaked context"


def reset_advice(chosen: remedy.GpuReset) -> str:
    """What `--gpu-reset` would do: `--gpu-reset can reset it`, or why it would be refused."""
    return "--gpu-reset can reset it" if chosen.blocked is None else f"--gpu-reset would be refused: {chosen.blocked}"
