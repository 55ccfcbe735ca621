"""One run, the core: hosts in, a `RunReport` out.

    report = await run(hosts, RunOptions(), log_dir=folder)

It writes the run's log folder (`fleet.runlog`: a JSONL log per host, every remote command in it) and nothing
else: no terminal, no history, no summary.json or report.html, no file limit, garbage collector pace or signal
handler of the process is touched. The application shell (`fleet.app.run`) adds those around it for the
command line. The report is final: the inventory's groups in it, and with `--uniform` the odd hosts out failed
(`fleet.model.uniformity.fail_odd`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from os import PathLike
from pathlib import Path
from typing import Any

from fleet.engine import schedulers
from fleet.engine.graph import Connector, run_hosts
from fleet.engine.interrupts import Interrupts
from fleet.engine.options import RunOptions, RunState
from fleet.engine.walk import HostEnded, Watch
from fleet.inventory.host import Host
from fleet.model.errors import UsageError
from fleet.model.report import RunReport
from fleet.model.uniformity import fail_odd
from fleet.runlog.folder import RunLogs, default_log_dir, new_run_id


async def run(targets: Sequence[Host], options: RunOptions | None = None, *, log_dir: str | PathLike[str] | None = None,
              logs: RunLogs | None = None, on_host_end: HostEnded | None = None, watch: Watch | None = None,
              interrupts: Interrupts | None = None, tell: Callable[[str], None] | None = None,
              connector: Connector | None = None) -> RunReport:
    """Run `options.mode` on every target; the run's report, every target in it (those it cut short too).

    `log_dir`: the folder the run's log folder goes in (else `$FLEET_LOG_DIR`, else `$XDG_STATE_HOME/fleet/runs`),
    a new one made and closed here; or `logs`, a run's log folder the caller made (`RunLogs.create`) and closes.
    What the caller hears as the run goes, each optional: `on_host_end` each host's report as it ends, `watch` the
    hosts' progress (a task cancelled as the run ends), `interrupts` the signals that cut it short (the caller
    installs their handlers: `Interrupts.watch`), `tell` a line for the operator (a Slurm reservation kept);
    `connector` how a host is reached (else SSH)."""
    options = options or RunOptions()
    own = logs is None
    folder = logs if logs is not None else RunLogs(Path(log_dir) if log_dir else default_log_dir(), new_run_id())
    if own:
        folder.create()
    try:
        report, _ = await hosts_run(targets, options, folder, on_host_end=on_host_end, watch=watch,
                                    interrupts=interrupts, tell=tell, connector=connector)
    finally:
        if own:
            folder.close()
    return compared(report, targets, uniform=options.uniform)


async def hosts_run(targets: Sequence[Host], options: RunOptions, logs: RunLogs, *, on_host_end: HostEnded | None,
                    watch: Watch | None, interrupts: Interrupts | None, tell: Callable[[str], None] | None,
                    connector: Connector | None) -> tuple[RunReport, RunState]:
    """The hosts' part of the run: walked here, or (a scheduler's fan-out: `--via srun`) by the scheduler."""
    chosen = schedulers.plug(options.scheduler.name) if options.scheduler is not None else None
    said = tell or _quiet
    if chosen is not None and options.scheduler is not None and options.scheduler.fan_out:
        if chosen.run_via is None:
            raise UsageError(f"scheduler {options.scheduler.name} cannot run the reset itself (--via)")
        return await chosen.run_via(targets, options, logs, on_host_end=on_host_end, interrupts=interrupts,
                                    watch=watch, tell=said)
    extra: dict[str, Any] = {"connector": connector} if connector else {}
    if chosen is not None:
        extra["scheduler"] = chosen.lifecycle(options, logs, interrupts)
    return await run_hosts(targets, options, logs, on_host_end=on_host_end, interrupts=interrupts, watch=watch,
                           **extra)


def compared(report: RunReport, targets: Sequence[Host], *, uniform: bool) -> RunReport:
    """The report with the run's inventory groups (the rack compared per group too) and, with `--uniform`, the
    odd hosts out failed (`not_uniform`)."""
    groups: dict[str, list[str]] = {}
    for host in targets:
        for group in host.groups:
            groups.setdefault(group, []).append(host.name)
    report = replace(report, groups={g: tuple(names) for g, names in groups.items()})
    return fail_odd(report) if uniform else report


def _quiet(line: str) -> None:
    """A notice for an operator no one asked to hear (the library's default): the hosts' logs keep their part."""
