"""What a reset would do on a host, as data.

`describe_plan` says per step what a read-only survey of the node (`steps.survey`,
joined by the pure `policy.build_plan`) found a reset would do.
"""

from __future__ import annotations

from fleet.report.models import HostPlan, PlannedProcess, StepName


def _process(p: PlannedProcess) -> str:
    memory = f", {p.mib} MiB" if p.mib is not None else ""
    return f"pid {p.pid} {p.name} ({p.user}{memory})"


def describe_plan(plan: HostPlan) -> dict[StepName, str]:
    """The plan per step, one line each, for the report's step details and the terminal."""
    states = ", ".join(f"{u} ({s})" for u, s in plan.units)
    drain = f"would stop {', '.join(plan.would_stop)}; now {states}" if plan.would_stop else (
        f"nothing to stop; now {states}" if plan.units else "no services to stop")
    kill = "would kill " + (", ".join(_process(p) for p in plan.would_kill) or "nothing")
    if plan.kept:
        kill += "; would keep " + ", ".join(f"{_process(p)}: {p.kept_because}" for p in plan.kept)
    used = [m for m in plan.gpu_memory_mib if m is not None]
    unknown = len(plan.gpu_memory_mib) - len(used)
    settle = f"GPUs now hold {sum(used)} MiB in all (max {max(used, default=0)} MiB on one GPU)" + (
        f"; {unknown} GPUs report no number" if unknown else "")
    return {StepName.DRAIN: drain, StepName.KILL: kill, StepName.SETTLE: settle,
            StepName.VERIFY: f"{len(plan.gpu_memory_mib)} GPUs listed"}
