"""Who holds the GPUs on a node: one scan, its probes joined and each holder judged.

`scan` runs the holder scan (find over /proc/PID/fd), then for the holders
found: ps (user, command line), the exe links, the lineage walk (comm,
ancestors, fleet's own process chain) and, when asked, their systemd units.
The judging itself is pure (`fleet.protection`, through `policy.describe_holders`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleet.errors import StepFailed
from fleet.node import probes
from fleet.node.node import Budget, Remote
from fleet.report.models import StepName
from fleet.reset import policy


@dataclass(frozen=True)
class Scan:
    """One look at the GPU holders, each judged; and the units fleet's own session runs in."""

    holders: tuple[policy.Holder, ...] = ()
    own_units: frozenset[str] = frozenset()

    @property
    def targets(self) -> list[policy.Holder]:
        return [h for h in self.holders if h.protected_by is None]

    @property
    def kept(self) -> tuple[policy.Holder, ...]:
        return tuple(h for h in self.holders if h.protected_by is not None)


async def scan(
    remote: Remote, step: StepName, budget: Budget, *, units: bool = False, known: Scan | None = None
) -> Scan:
    """Every process holding a device file, described (user, name, exe, lineage; with `units`,
    its systemd unit) and judged protected or not.

    With `known` (an earlier scan of this step), holders it already judged are not described
    again: a rescan that finds only them costs one command, not five.
    """
    res = await remote.run(probes.holders_scan_argv(remote.host.devices), step=step, budget=budget)
    if res.exit_status not in (0, 1):
        raise StepFailed(f"holder scan exited {res.exit_status}: {policy.first_line(res.stderr)}")
    found = probes.parse_holders(res.stdout)
    if not found:
        return Scan()
    if known is not None:
        judged = {h.pid: h for h in known.holders}
        if all(h.pid in judged for h in found):
            return Scan(tuple(judged[h.pid] for h in found), known.own_units)
    pids = [h.pid for h in found]
    ps = await remote.run(probes.ps_argv(pids), step=step, budget=budget)
    exe = await remote.run(probes.exe_argv(pids), step=step, budget=budget)
    lineage = await _lineage(remote, pids, step, budget)
    unit_of = await _units(remote, sorted({*pids, *lineage.own}), lineage.simulated, step, budget) if units else {}
    facts = policy.ProcessFacts(probes.parse_ps(ps.stdout), probes.parse_exe(exe.stdout), lineage, unit_of)
    holders = policy.describe_holders(found, facts, policy.Rules.of(remote.host))
    return Scan(holders, frozenset(unit_of[p] for p in lineage.own if p in unit_of))


async def scan_holders(remote: Remote, step: StepName, budget: Budget) -> tuple[policy.Holder, ...]:
    """The holders of one `scan`, without their units."""
    return (await scan(remote, step, budget)).holders


async def _lineage(remote: Remote, pids: Sequence[int], step: StepName, budget: Budget) -> probes.Lineage:
    """The holders' ancestors and fleet's own process chain; without them nothing is judged."""
    res = await remote.run(probes.lineage_argv(pids), step=step, budget=budget)
    if not res.ok:
        raise StepFailed(f"process lineage (awk) exited {res.exit_status}: {policy.first_line(res.stderr)}")
    try:
        return probes.parse_lineage(res.stdout)
    except probes.ProbeParseError as exc:
        raise StepFailed(f"unreadable process lineage: {exc}") from exc


async def _units(remote: Remote, pids: Sequence[int], simulated: bool, step: StepName,
                 budget: Budget) -> dict[int, str]:
    """pid -> systemd unit, from /proc/PID/cgroup (on a simulated node: from its stand-in)."""
    argv = probes.sim_units_argv(pids) if simulated else probes.cgroup_argv(pids)
    res = await remote.run(argv, step=step, budget=budget)
    try:
        return probes.parse_sim_units(res.stdout) if simulated else probes.parse_cgroups(res.stdout)
    except probes.ProbeParseError as exc:
        raise StepFailed(f"unreadable cgroup listing: {exc}") from exc


async def restart_settings(remote: Remote, units: set[str], step: StepName, budget: Budget) -> dict[str, str]:
    """unit -> its Restart= setting, for the units whose processes came back (unreadable: left out)."""
    settings = {}
    for unit in sorted(units):
        res = await remote.run(probes.unit_restart_argv(unit), step=step, budget=budget)
        setting = probes.parse_unit_restart(res.stdout) if res.ok else None
        if setting is not None:
            settings[unit] = setting
    return settings
