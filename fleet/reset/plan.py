"""The dry run: what a reset would do on a host, read from the host without changing it.

Asks the node only read-only things: each unit's state (`fleet.reset.drain.unit_states`), the holder
scan (`fleet.reset.holders`), the GPU and compute-app queries. Decides (pure, below): which units a reset
would stop, which holders it would kill or keep (and why), what the GPUs hold now. Reports: the host's
`plan` object and one line per step; the host ends `planned`. Nothing is signalled, stopped or written.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from fleet.inventory.host import Host
from fleet.model.report import HostPlan, PlannedProcess, StepName, StepResult, StepStatus
from fleet.node.bounds import commands_s
from fleet.node.budget import Room
from fleet.node.node import Node
from fleet.node.probes import smi, units
from fleet.reset.drain import unit_states
from fleet.reset.holders import scan
from fleet.reset.protection import Holder
from fleet.reset.verify import VERIFY_COMMANDS

# The survey's nvidia-smi reads: the GPU query and the compute apps.
SURVEY_SMI = 2
# Where a unit in `services` is up: one more command, the holders' units (whose processes drain would end).
UNITS_READ = 1


def survey_room(host: Host) -> Room:
    """The survey's commands at their bounds: each unit's state, the holder scan and description (and the holders'
    units, where a unit is up), the two queries."""
    return Room(0.0, commands_s(host, smi=SURVEY_SMI, other=len(host.services) + VERIFY_COMMANDS + UNITS_READ))


async def survey(node: Node) -> HostPlan:
    """A dry run's look at the node: read-only commands only, nothing signalled, stopped or written."""
    host = node.host
    budget = survey_room(host).start()
    states = await unit_states(node, host.services, budget) if host.services else {}
    up = any(not state.is_down for state in states.values())
    holders = (await scan(node, StepName.KILL, budget, with_units=up)).holders
    rows = await node.ask(smi.gpu_query(host.nvidia_smi, smi.VERIFY_FIELDS), step=StepName.VERIFY, budget=budget)
    apps = await node.ask(smi.compute_apps(host.nvidia_smi), step=StepName.VERIFY, budget=budget)
    return build_plan(states, holders, apps, rows)


def build_plan(
    states: Mapping[str, units.UnitState],
    holders: Sequence[Holder],
    apps: Sequence[smi.ComputeApp],
    rows: Sequence[smi.GpuRow],
) -> HostPlan:
    """Join a read-only survey into what a reset would do: stop, kill, keep."""
    mib: dict[int, int] = defaultdict(int)
    for app in apps:
        mib[app.pid] += app.used_mib or 0

    def planned(h: Holder) -> PlannedProcess:
        return PlannedProcess(pid=h.pid, user=h.user, name=h.name, mib=mib.get(h.pid), kept_because=h.protected_by)

    stopping = {unit for unit, state in states.items() if not state.is_down}
    free = [h for h in holders if h.protected_by is None]
    return HostPlan(
        units=tuple((unit, state.label) for unit, state in states.items()),
        would_kill=tuple(planned(h) for h in free if h.unit not in stopping),
        kept=tuple(planned(h) for h in holders if h.protected_by is not None),
        gpu_memory_mib=tuple(r.memory_used_mib for r in rows),
        with_units=tuple(planned(h) for h in free if h.unit in stopping),
    )


def planned_steps(plan: HostPlan) -> list[StepResult]:
    """The report's steps for a planned host: none ran (`skipped`), each says what it would do."""
    lines = describe_plan(plan)
    return [StepResult(name=name, status=StepStatus.SKIPPED, duration_s=0.0, detail=lines[name]) for name in StepName]


def _process(p: PlannedProcess) -> str:
    memory = f", {p.mib} MiB" if p.mib is not None else ""
    return f"pid {p.pid} {p.name} ({p.user}{memory})"


def would_keep(plan: HostPlan) -> str:
    """The holders a reset would leave alive, and why (empty: none); the end of the kill's line."""
    return "would keep " + ", ".join(f"{_process(p)}: {p.kept_because}" for p in plan.kept) if plan.kept else ""


def describe_plan(plan: HostPlan) -> dict[StepName, str]:
    """The plan per step, one line each, for the report's step details and the terminal."""
    states = ", ".join(f"{u} ({s})" for u, s in plan.units)
    drain = f"would stop {', '.join(plan.would_stop)}; now {states}" if plan.would_stop else (
        f"nothing to stop; now {states}" if plan.units else "no services to stop")
    if plan.with_units:
        drain += "; their processes end with them: " + ", ".join(_process(p) for p in plan.with_units)
    kill = "would kill " + (", ".join(_process(p) for p in plan.would_kill) or "nothing")
    keep = would_keep(plan)
    if keep:
        kill += f"; {keep}"
    used = [m for m in plan.gpu_memory_mib if m is not None]
    unknown = len(plan.gpu_memory_mib) - len(used)
    settle = f"GPUs now hold {sum(used)} MiB in all (max {max(used, default=0)} MiB on one GPU)" + (
        f"; {unknown} GPUs report no number" if unknown else "")
    if plan.would_restore:
        settle += "; --restore-settings would run " + "; ".join(plan.would_restore)
    return {StepName.DRAIN: drain, StepName.KILL: kill, StepName.SETTLE: settle,
            StepName.VERIFY: f"{len(plan.gpu_memory_mib)} GPUs listed"}
