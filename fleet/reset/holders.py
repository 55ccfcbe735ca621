"""Who holds the GPUs on a node: one scan, its probes joined and each holder judged.

`scan` runs the holder scan (find over every thread's fd table and every mapping), then for the holders
found, in one command: ps (user, command line), the exe links, the lineage walk
(comm, ancestors, fleet's own process chain) and their cgroups (the scheduler's job
each one's names); and, when asked, their systemd units.
The judging itself is pure (`describe_holders`, with `fleet.reset.protection`).
kill, verify and the dry run all look through this one scan.

A scan that could not see every process (another user's fd table it may not
read, /proc/1 hidden by hidepid, a sudo that refused to run it, a ps that
cannot see pid 1) fails the step with one line saying why and what to do:
"nothing found" is never read as "nothing there".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from fleet.inventory.host import Host
from fleet.model.errors import StepFailed
from fleet.model.report import Reason, StepName
from fleet.node.budget import TimeBudget
from fleet.node.node import Node
from fleet.node.probe import first_line
from fleet.node.probes import jobs, lineage, procs, units
from fleet.reset.protection import Holder, ProcessFacts, Rules, full_name, protected_by
from fleet.transport.base import CommandResult


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


async def scan(node: Node, step: StepName, budget: TimeBudget, *, with_units: bool = False,
               known: Scan | None = None, looked: CommandResult | None = None) -> Scan:
    """Every process holding a device file, described (user, name, exe, lineage; with `with_units`,
    its systemd unit) and judged protected or not.

    With `known` (an earlier scan of this step), holders it already judged are not described
    again: a rescan that finds only them costs one command, not two. `looked`: the result of the
    holder scan (`procs.holder_scan`) when a step's batch already ran it. The holders found are
    described in one command (ps, their exe links, their lineage and their cgroups, in a batch).
    """
    probe = procs.holder_scan(node.host.devices)
    result = looked if looked is not None else await node.run(probe, step=step, budget=budget)
    seen = await _still_unreadable(node, probe.read(result), step, budget)
    if seen.unreadable:
        node.log.info("scan_unreadable", pids=list(seen.unreadable), looking="again")
        result = await node.run(probe, step=step, budget=budget)
        seen = await _still_unreadable(node, probe.read(result), step, budget)
    _check_sight(node.host, scan_blindness(seen, result.exit_status, result.stderr))
    found = seen.rows
    if not found:
        return Scan()
    if known is not None:
        judged = {h.pid: h for h in known.holders}
        if all(h.pid in judged for h in found):
            return Scan(tuple(judged[h.pid] for h in found), known.own_units)
    pids = [h.pid for h in found]
    ps_probe, exe_probe, walk_probe, job_probe = (procs.ps(pids), procs.exe(pids), lineage.lineage(pids),
                                                  jobs.job_cgroups(pids))
    answers = await node.batch([ps_probe, exe_probe, walk_probe, job_probe], step=step, budget=budget)
    ps_result = answers.result(ps_probe)
    ps = ps_probe.read(ps_result)
    _check_sight(node.host, ps_blindness(ps, ps_result.exit_status, ps_result.stderr))
    exe, walk, job_of = answers.read(exe_probe), answers.read(walk_probe), answers.read(job_probe)
    unit_of = await _units(node, sorted({*pids, *walk.own}), step, budget) if with_units else {}
    facts = ProcessFacts(ps=ps, exe=exe, lineage=walk, units=unit_of, jobs=job_of)
    holders = describe_holders(found, facts, Rules.of(node.host))
    return Scan(holders, frozenset(unit_of[p] for p in walk.own if p in unit_of))


async def _still_unreadable(node: Node, seen: procs.HolderScan, step: StepName, budget: TimeBudget) -> procs.HolderScan:
    """Keep only the unreadable fd tables of processes that still exist: find's `-readable` is also false
    for a process that exited between listing /proc and looking at it, which hides nothing.

    A table can also read as unreadable while its thread is exiting and its process still exists (a killed
    process's last threads tearing down, its leader already a zombie): `scan` looks once more, whole, when any is
    left, and judges by that second look alone. A table kept from this user (another user's process, a scan that is
    not root) is unreadable both times and the scan is blind; one that reads whole the second time is looked into.

    A ps that does not list pid 1 (it failed, or hidepid hides processes from it) cannot say who is gone: every
    table stays unreadable."""
    if not seen.unreadable:
        return seen
    alive = await node.ask(procs.ps(seen.unreadable), step=step, budget=budget)
    if 1 not in alive:
        return seen
    return replace(seen, unreadable=tuple(pid for pid in seen.unreadable if pid in alive))


async def scan_holders(node: Node, step: StepName, budget: TimeBudget,
                       looked: CommandResult | None = None) -> tuple[Holder, ...]:
    """The holders of one `scan`, without their units."""
    return (await scan(node, step, budget, looked=looked)).holders


async def _units(node: Node, pids: Sequence[int], step: StepName, budget: TimeBudget) -> dict[int, str]:
    return await node.ask(units.units_of(pids, simulated=node.host.simulated), step=step, budget=budget)


# --- seeing everything: an incomplete look never supports "clean" --------------------------------


def scan_blindness(seen: procs.HolderScan, exit_status: int | None, stderr: str) -> str | None:
    """Why the holder scan did not see every process (None: it did), from what it printed and its status."""
    if seen.unreadable:
        count = len(seen.unreadable)
        return f"permission denied on /proc/*/fd of {count} process{'es' if count > 1 else ''}"
    if not seen.init_seen:
        if not seen.rows and exit_status != 0:
            return f"the holder scan did not run: exit {exit_status}: {first_line(stderr)}"
        return "/proc/1 is hidden from it (hidepid)"
    return None


def ps_blindness(rows: Mapping[int, procs.PsRow], exit_status: int | None, stderr: str) -> str | None:
    """Why ps cannot vouch for the holders (it must list pid 1, which it is always asked about)."""
    if 1 in rows:
        return None
    if exit_status not in (0, 1) or not rows:
        return f"ps did not run: exit {exit_status}: {first_line(stderr)}"
    return "ps cannot see pid 1 (hidepid)"


def blind_error(host: Host, why: str) -> str:
    """`cannot see every process on gpu-b02 as fleetops (permission denied ...): run as root or set become`."""
    who = f"{host.user or 'the login user'}{' through sudo' if host.become else ''}"
    advice = "allow fleet's commands in sudoers (NOPASSWD) or run as root" if host.become else \
        "run as root or set become"
    return f"cannot see every process on {host.name} as {who} ({why}): {advice}"


def _check_sight(host: Host, why: str | None) -> None:
    if why is not None:
        raise StepFailed(blind_error(host, why), reason=Reason.BLIND_SCAN)


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
        start=stat.start if stat is not None else None, owner=found.user,
    )
