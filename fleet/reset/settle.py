"""settle: wait, with backoff and no fixed sleep, until every GPU's memory is at or under what it may hold.

Asks the node: `nvidia-smi --query-gpu=index,uuid,memory.used,mig.mode.current` until every GPU is at or
under its allowance, within `settle_timeout` (a driver frees a dead process's memory some time after it
died); when the kill kept processes on purpose (protected, such as the MPS server), also the compute apps,
to know what those hold. Decides (pure, `Allowance`): a GPU's allowance is `memory_threshold_mib`
(`mig_memory_threshold_mib` when MIG is enabled: an idle MIG GPU reserves tens of MiB with no process),
plus what kept processes use on it; when each GPU first went (and stayed) under. Reports: how long each GPU
took (`gpus[].settle_s`), or which GPU still holds what when the time is up (status `timeout`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import anyio

from fleet.inventory.host import Host
from fleet.node.budget import Budget
from fleet.node.node import Node
from fleet.node.probes import smi
from fleet.report.models import Reason, StepName, StepOutcome, StepResult, StepStatus
from fleet.reset import remedy
from fleet.reset.poll import POLL_MARGIN_S, backoff


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


async def settle(node: Node, kept: Collection[int] = (), *, gpu_reset: bool = False) -> StepOutcome:
    """Poll GPU memory with backoff until every GPU is under its allowance; no fixed sleep.

    `kept`: pids of GPU holders the kill left alive on purpose; what they use does not count.
    `gpu_reset` (`--gpu-reset`): when the window passes with memory still held, reset those GPUs
    (`fleet.reset.remedy`) and wait once more; memory that survives a reset needs a reboot.
    """
    started, host = time.monotonic(), node.host
    waited = await _wait_free(node, kept)
    if waited.free:
        detail = f"{len(waited.rows)} GPUs at or under {host.memory_threshold_mib} MiB after {waited.elapsed:.1f} s"
        return StepOutcome(StepResult.since(StepName.SETTLE, started, detail), settle_s=waited.settled)
    msg = unsettled_error(waited.rows, waited.allowance, host.settle_timeout)
    if not gpu_reset or not waited.rows:
        return StepOutcome(StepResult.since(StepName.SETTLE, started, msg, StepStatus.TIMEOUT, msg,
                                            Reason.MEMORY_HELD), settle_s=waited.settled)
    return await _after_reset(node, kept, waited, msg, started)


async def _after_reset(node: Node, kept: Collection[int], before: Waited, msg: str, started: float) -> StepOutcome:
    """Reset the GPUs still holding memory, then wait once more: a reboot is the next remedy, not fleet's."""
    host = node.host
    leaked = [r.index for r in before.rows if before.allowance.problem(r) is not None]
    reset = await remedy.reset_gpus(node, leaked, [r.index for r in before.rows])
    if not reset.ran:
        line = f"{msg}; {reset.line}"
        return StepOutcome(StepResult.since(StepName.SETTLE, started, line, StepStatus.TIMEOUT, line,
                                            Reason.MEMORY_HELD), settle_s=before.settled)
    after = await _wait_free(node, kept)
    if after.free:
        detail = f"{reset.line}; {len(after.rows)} GPUs at or under {host.memory_threshold_mib} MiB after it"
        return StepOutcome(StepResult.since(StepName.SETTLE, started, detail), settle_s=before.settled)
    still = unsettled_error(after.rows, after.allowance, host.settle_timeout)
    line = f"needs_reboot: {still}, even after {reset.line}"
    return StepOutcome(StepResult.since(StepName.SETTLE, started, line, StepStatus.FAILED, line,
                                        Reason.NEEDS_REBOOT), settle_s=before.settled)


@dataclass(frozen=True)
class Waited:
    """One settle window: the last rows read, when each GPU went free, the allowance, and whether all are."""

    rows: tuple[smi.GpuRow, ...]
    settled: dict[int, float]
    allowance: Allowance
    elapsed: float

    @property
    def free(self) -> bool:
        return bool(self.rows) and len(self.settled) == len(self.rows)


async def _wait_free(node: Node, kept: Collection[int]) -> Waited:
    """Poll (backoff) until every GPU is under its allowance or `settle_timeout` passes."""
    host = node.host
    budget = Budget(host.settle_timeout, slack=2 * host.command_timeout)
    settled: dict[int, float] = {}
    rows: tuple[smi.GpuRow, ...] = ()
    allowance = Allowance.of(host)
    query = smi.gpu_query(host.nvidia_smi, smi.SETTLE_FIELDS)
    for wait in backoff():
        rows = await node.ask(query, step=StepName.SETTLE, budget=budget)
        if kept:
            apps = await node.ask(smi.compute_apps(host.nvidia_smi), step=StepName.SETTLE, budget=budget)
            allowance = Allowance.of(host, [a for a in apps if a.pid in kept])
        note_settled(rows, allowance, budget.elapsed, settled)
        if (rows and len(settled) == len(rows)) or budget.window_left <= POLL_MARGIN_S:
            break
        await anyio.sleep(min(wait, budget.window_left))
    return Waited(rows, settled, allowance, budget.elapsed)


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
