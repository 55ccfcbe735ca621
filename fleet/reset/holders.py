"""Who holds the GPUs on a node: one scan, its probes joined and each holder judged.

`scan` runs the holder scan (find over /proc/PID/fd), then for the holders
found: ps (user, command line), the exe links, the lineage walk (comm,
ancestors, fleet's own process chain) and, when asked, their systemd units.
The judging itself is pure (`describe_holders`, with `fleet.reset.protection`).
kill, verify and the dry run all look through this one scan.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from fleet.node.budget import Budget
from fleet.node.node import Node
from fleet.node.probes import lineage, procs, units
from fleet.report.models import StepName
from fleet.reset.protection import Holder, ProcessFacts, Rules, full_name, protected_by


@dataclass(frozen=True)
class Scan:
    """One look at the GPU holders, each judged; and the units fleet's own session runs in."""

    holders: tuple[Holder, ...] = ()
    own_units: frozenset[str] = frozenset()

    @property
    def targets(self) -> list[Holder]:
        return [h for h in self.holders if h.protected_by is None]

    @property
    def kept(self) -> tuple[Holder, ...]:
        return tuple(h for h in self.holders if h.protected_by is not None)


async def scan(node: Node, step: StepName, budget: Budget, *, with_units: bool = False,
               known: Scan | None = None) -> Scan:
    """Every process holding a device file, described (user, name, exe, lineage; with `with_units`,
    its systemd unit) and judged protected or not.

    With `known` (an earlier scan of this step), holders it already judged are not described
    again: a rescan that finds only them costs one command, not five.
    """
    found = await node.ask(procs.holder_scan(node.host.devices), step=step, budget=budget)
    if not found:
        return Scan()
    if known is not None:
        judged = {h.pid: h for h in known.holders}
        if all(h.pid in judged for h in found):
            return Scan(tuple(judged[h.pid] for h in found), known.own_units)
    pids = [h.pid for h in found]
    ps = await node.ask(procs.ps(pids), step=step, budget=budget)
    exe = await node.ask(procs.exe(pids), step=step, budget=budget)
    walk = await node.ask(lineage.lineage(pids), step=step, budget=budget)
    unit_of = await _units(node, sorted({*pids, *walk.own}), step, budget) if with_units else {}
    holders = describe_holders(found, ProcessFacts(ps, exe, walk, unit_of), Rules.of(node.host))
    return Scan(holders, frozenset(unit_of[p] for p in walk.own if p in unit_of))


async def scan_holders(node: Node, step: StepName, budget: Budget) -> tuple[Holder, ...]:
    """The holders of one `scan`, without their units."""
    return (await scan(node, step, budget)).holders


async def _units(node: Node, pids: Sequence[int], step: StepName, budget: Budget) -> dict[int, str]:
    return await node.ask(units.units_of(pids, simulated=node.host.simulated), step=step, budget=budget)


def describe_holders(found: Iterable[procs.HolderRow], facts: ProcessFacts, rules: Rules) -> tuple[Holder, ...]:
    """Join the scan with what the probes told, and judge each holder; a pid ps no longer
    knows has exited and is dropped."""
    out = []
    for row in found:
        holder = _describe(row, facts)
        if holder is not None:
            out.append(replace(holder, protected_by=protected_by(holder, facts, rules)))
    return tuple(out)


def _describe(found: procs.HolderRow, facts: ProcessFacts) -> Holder | None:
    row = facts.ps.get(found.pid)
    if row is None:
        return None
    stat = facts.lineage.procs.get(found.pid)
    comm = stat.comm if stat is not None else row.argv0 or "?"
    exe = facts.exe.get(found.pid)
    name = full_name(comm, row.argv0, exe)
    return Holder(
        pid=found.pid, user=row.user or found.user, name=name, exe=exe, devices=found.devices,
        unit=facts.units.get(found.pid), comm=comm if comm != name else None,
    )
