"""settle: wait, with backoff and no fixed sleep, until every GPU's memory is at or under the threshold.

Asks the node: `nvidia-smi --query-gpu=index,memory.used` until every GPU is at or under
`memory_threshold_mib`, within `settle_timeout` (a driver frees a dead process's memory some time after
it died). Decides: when each GPU first went (and stayed) under. Reports: how long each GPU took
(`gpus[].settle_s`), or which GPU still holds what when the time is up (status `timeout`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import anyio

from fleet.node.budget import Budget
from fleet.node.node import Node
from fleet.node.probes import smi
from fleet.report.models import StepName, StepOutcome, StepResult, StepStatus
from fleet.reset.poll import POLL_MARGIN_S, backoff


async def settle(node: Node) -> StepOutcome:
    """Poll GPU memory with backoff until every GPU is under the threshold; no fixed sleep."""
    started, host = time.monotonic(), node.host
    budget = Budget(host.settle_timeout, slack=host.command_timeout)
    settled: dict[int, float] = {}
    rows: tuple[smi.GpuRow, ...] = ()
    query = smi.gpu_query(host.nvidia_smi, smi.SETTLE_FIELDS)
    for wait in backoff():
        rows = await node.ask(query, step=StepName.SETTLE, budget=budget)
        note_settled(rows, host.memory_threshold_mib, budget.elapsed, settled)
        if rows and len(settled) == len(rows):
            detail = f"{len(rows)} GPUs at or under {host.memory_threshold_mib} MiB after {budget.elapsed:.1f} s"
            return StepOutcome(StepResult.since(StepName.SETTLE, started, detail), settle_s=settled)
        if budget.window_left <= POLL_MARGIN_S:
            break
        await anyio.sleep(min(wait, budget.window_left))
    msg = unsettled_error(rows, host.memory_threshold_mib, host.settle_timeout)
    return StepOutcome(StepResult.since(StepName.SETTLE, started, msg, StepStatus.TIMEOUT, msg), settle_s=settled)


def note_settled(rows: Iterable[smi.GpuRow], threshold: int, elapsed: float, settled: dict[int, float]) -> None:
    """Record when each GPU first went (and stayed) at or under the threshold."""
    for row in rows:
        if row.memory_used_mib is not None and row.memory_used_mib <= threshold:
            settled.setdefault(row.index, round(elapsed, 3))
        else:
            settled.pop(row.index, None)


def memory_problem(row: smi.GpuRow, threshold: int) -> str | None:
    """What is wrong with one GPU's memory (settle's verdict, and verify's): None when it is under the threshold."""
    if row.memory_used_mib is None:
        return f"gpu {row.index} memory.used is not a number ([N/A])"
    if row.memory_used_mib > threshold:
        return f"gpu {row.index} holds {row.memory_used_mib} MiB"
    return None


def first_of(problems: Sequence[str]) -> str:
    """The first problem, and how many more there are."""
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return problems[0] + more


def unsettled_error(rows: Sequence[smi.GpuRow], threshold: int, timeout: float) -> str:
    if not rows:
        return "nvidia-smi listed no GPUs"
    problems = [p for p in (memory_problem(r, threshold) for r in rows) if p]
    return f"{first_of(problems)} after {timeout:g} s (threshold {threshold} MiB)"
