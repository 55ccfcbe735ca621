"""One run from targets to exit status: logs folder, task graph, summary.json, report on stdout/stderr."""

from __future__ import annotations

import resource
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, fields, is_dataclass, replace
from enum import Enum
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from fleet import __version__
from fleet.engine import schedulers
from fleet.engine.collector import heap_frozen, paced_collection
from fleet.engine.graph import Connector, run_hosts
from fleet.engine.interrupts import Interrupts
from fleet.engine.options import RunOptions, RunState
from fleet.engine.run_folder import RunLogs, default_log_dir, new_run_id
from fleet.engine.walk import Mode
from fleet.engine.waves import Amount
from fleet.history import Recorder, history_path, now_stamp
from fleet.inventory.host import Host
from fleet.inventory.nodesets import fold
from fleet.model.errors import UsageError
from fleet.model.report import RunReport
from fleet.report import render as reporting
from fleet.report import uniform
from fleet.report.html_report import RunPage, write_page
from fleet.report.uniform import fail_odd
from fleet.terminal import say, write

# File descriptors a host holds during a run: its connection's socket and its log file.
FDS_PER_HOST = 2
FDS_RESERVE = 64


def fd_limit_wanted(soft: int, hard: int, hosts: int) -> int | None:
    """The soft RLIMIT_NOFILE a run of `hosts` needs, within the hard limit; None when soft already suffices.

    Many systems start processes at a soft limit of 1024, which 500 hosts (a socket and a log file each) pass.
    """
    need = FDS_PER_HOST * hosts + FDS_RESERVE
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    return need if hard == resource.RLIM_INFINITY else min(need, hard)


def raise_fd_limit(hosts: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = fd_limit_wanted(soft, hard, hosts)
    if wanted is not None and wanted > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def options_document(options: RunOptions) -> dict[str, Any]:
    """The run's options as the history keeps them (JSON): modes and amounts as the command line spells them."""
    document: dict[str, Any] = {}
    for item in fields(options):
        value = getattr(options, item.name)
        if item.name == "handle_signals":
            continue
        if isinstance(value, Amount | Enum):
            value = str(value)
        elif is_dataclass(value) and not isinstance(value, type):
            value = asdict(value)
        document[item.name] = value
    return document


def start_history(logs: RunLogs, targets: Sequence[Host], options: RunOptions,
                  command: str | None = None) -> Recorder:
    """The run's history writer (`<log-dir>/history.sqlite`), the run on record as started (as `command`, else the
    mode's: the demo's runs are recorded as `demo`). It never fails the run: what it cannot write is one warning
    line on stderr."""
    history = Recorder(history_path(logs.path.parent), logs.run_id,
                       warn=lambda line: say(f"fleet: warning: {line}"))
    history.start_run(command or options.mode.command, [h.name for h in targets], options_document(options),
                      now_stamp(), __version__, logs.path.parent)
    return history


def compared(report: RunReport, targets: Sequence[Host], *, uniform: bool) -> RunReport:
    """The report with the run's inventory groups (the rack compared per group too) and, with `--uniform`, the
    odd hosts out failed (`not_uniform`)."""
    groups: dict[str, list[str]] = {}
    for host in targets:
        for group in host.groups:
            groups.setdefault(group, []).append(host.name)
    report = replace(report, groups={g: tuple(names) for g, names in groups.items()})
    return fail_odd(report) if uniform else report


def write_report_page(logs: RunLogs, report: RunReport, rack: uniform.Rack | None = None) -> None:
    """report.html beside summary.json (`fleet.report.html_report`); a page it cannot write is one warning line
    and never changes the run's outcome."""
    try:
        write_page(logs.path, RunPage(report, __version__, rack=rack))
    except OSError as exc:
        say(f"fleet: warning: report.html not written in {logs.path}: {exc.strerror or exc}")


async def run_and_report(
    targets: Sequence[Host],
    options: RunOptions,
    *,
    as_json: bool,
    log_dir: Path | None,
    per_host: bool | None = None,
    connector: Connector | None = None,
    recorded_as: str | None = None,
) -> tuple[int, RunReport]:
    """Run, write summary.json (even when interrupted), print the report; the exit status, and the report
    (the demo checks what it showed). `per_host`: a line per host saying what was done, after the summary (None:
    for a reset of up to a screenful of hosts, `fleet.report.render.per_host_wanted`). With
    `options.handle_signals`, SIGINT and SIGTERM are handled from the start to the last line of the report
    (`fleet.engine.interrupts`)."""
    if not options.handle_signals:
        return await _run_and_report(targets, options, None, as_json, log_dir, per_host, connector, recorded_as)
    interrupts = Interrupts()
    async with anyio.create_task_group() as signals:
        await signals.start(interrupts.watch)
        try:
            outcome = await _run_and_report(targets, options, interrupts, as_json, log_dir, per_host, connector,
                                            recorded_as)
        finally:
            signals.cancel_scope.cancel()
    return outcome


async def _hosts(targets: Sequence[Host], options: RunOptions, logs: RunLogs, history: Recorder,
                 interrupts: Interrupts | None, connector: Connector | None) -> tuple[RunReport, RunState]:
    """The hosts' part of the run: run here, or (a scheduler's fan-out) by the scheduler."""
    chosen = schedulers.plug(options.scheduler.name) if options.scheduler is not None else None
    if chosen is not None and options.scheduler is not None and options.scheduler.fan_out:
        if chosen.run_via is None:
            raise UsageError(f"scheduler {options.scheduler.name} cannot run the reset itself (--via)")
        return await chosen.run_via(targets, options, logs, on_host_end=history.host_ended, interrupts=interrupts)
    extra: dict[str, Any] = {"connector": connector} if connector else {}
    if chosen is not None:
        extra["scheduler"] = chosen.lifecycle(options, logs, interrupts)
    return await run_hosts(targets, options, logs, on_host_end=history.host_ended, interrupts=interrupts, **extra)


async def _run_and_report(targets: Sequence[Host], options: RunOptions, interrupts: Interrupts | None,
                          as_json: bool, log_dir: Path | None, per_host: bool | None,
                          connector: Connector | None, recorded_as: str | None = None) -> tuple[int, RunReport]:
    raise_fd_limit(len(targets))
    logs = RunLogs(log_dir or default_log_dir(), new_run_id())
    logs.create()
    history = start_history(logs, targets, options, recorded_as)
    try:
        with paced_collection():
            run_report, state = await _hosts(targets, options, logs, history, interrupts, connector)
    except BaseException:
        history.close()
        raise
    finally:
        logs.close()
    with heap_frozen():
        run_report = compared(run_report, targets, uniform=options.uniform)
        rack = uniform.rack(run_report.hosts)  # the rack compared once, for the three parts that show it
        document = reporting.to_document(run_report, rack)
        text = reporting.render(document)
        logs.write_summary(text)
        write_report_page(logs, run_report, rack)
        code = reporting.exit_code(run_report, interrupted=state.interrupted,
                                   hung_up=interrupts is not None and interrupts.by is signal.SIGHUP)
        history.finish_run(list(run_report.hosts.values()), code)
        if as_json:
            write(sys.stdout, text)
        for line in reporting.plan_lines(run_report):
            say(line)
        for line in reporting.human_lines(run_report, rack):
            say(line)
        if reporting.per_host_wanted(run_report, per_host):
            for line in reporting.done_lines(run_report):
                say(line)
        say(f"logs: {logs.path}")
        if state.interrupted:
            say("fleet: interrupted; in-flight commands were ended, the report above is complete")
            abandoned = [h.scheduler.node for h in run_report.hosts.values() if h.scheduler and h.scheduler.abandoned]
            if abandoned:
                say(f"fleet: left drained at the third interrupt (reason 'fleet: run {logs.run_id}'):"
                    f" {fold(abandoned)}")
        elif state.deadline.hit:
            say(f"fleet: {state.cut_short()}; in-flight commands were ended, the report above is complete")
        elif state.stopped:
            say(f"fleet: stopped starting hosts: {state.stopped}")
    await anyio.to_thread.run_sync(history.close)
    return code, run_report


def execute(targets: list[Host], options: RunOptions, *, as_json: bool, log_dir: Path | None,
            metrics_file: Path | None = None, per_host: bool | None = None) -> int:
    """Run; then the metrics file (not for a dry run: it would replace the last real run's with `planned`)."""
    code, report = anyio.run(partial(run_and_report, targets, options, as_json=as_json, log_dir=log_dir,
                                     per_host=per_host))
    if metrics_file is not None and options.mode is not Mode.PLAN:
        from fleet.report.metrics import render_metrics, write_metrics

        try:
            write_metrics(metrics_file, render_metrics(report, exit_code=code, finished_at=time.time()))
        except OSError as exc:  # a metrics file never changes the run's outcome
            say(f"fleet: warning: metrics not written to {metrics_file}: {exc.strerror or exc}")
    return code
