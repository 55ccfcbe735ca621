"""A run of the command line: the core run (`fleet.engine.run.run`) with its application around it.

Before: the process's file limit raised for the hosts' sockets and logs, the run on record in the history, the
signals that cut a run short handled (`fleet.engine.interrupts`), the progress line started. During: the garbage
collector paced (`fleet.app.collector`). After: summary.json and report.html beside the hosts' logs, the history's
end of the run, the report on stdout (`--json`) and stderr, and the exit status; then (`execute`) the metrics file.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, fields, is_dataclass
from enum import Enum
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from fleet.app.collector import heap_frozen, paced_collection
from fleet.engine.graph import Connector
from fleet.engine.interrupts import Interrupts
from fleet.engine.options import RunOptions
from fleet.engine.run import run
from fleet.engine.walk import Mode
from fleet.engine.waves import Amount
from fleet.history import Recorder, history_path, now_stamp
from fleet.inventory.host import Host
from fleet.inventory.nodesets import fold
from fleet.model import uniformity
from fleet.model.report import RunReport
from fleet.report import progress
from fleet.report import render as reporting
from fleet.report.html_report import RunPage, write_page
from fleet.runlog.folder import RunLogs, default_log_dir, new_run_id
from fleet.terminal import say, write
from fleet.version import __version__

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
    history = Recorder(history_path(logs.path.parent), logs.run_id, warn=lambda line: say(f"fleet: warning: {line}"))
    history.start_run(command or options.mode.command, [h.name for h in targets], options_document(options),
                      now_stamp(), __version__, logs.path.parent)
    return history


def write_report_page(logs: RunLogs, report: RunReport, rack: uniformity.Rack | None = None) -> None:
    """report.html beside summary.json (`fleet.report.html_report`); a page it cannot write is one warning line
    and never changes the run's outcome."""
    try:
        write_page(logs.path, RunPage(report=report, fleet_version=__version__, rack=rack))
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
    handle_signals: bool = False,
    progress_view: bool = False,
) -> tuple[int, RunReport]:
    """Run, write summary.json and report.html (even when interrupted), print the report; the exit status, and the
    report (the demo checks what it showed). `per_host`: a line per host saying what was done, after the summary
    (None: for a reset of up to a screenful of hosts, `fleet.report.render.per_host_wanted`). With
    `handle_signals`, SIGINT, SIGTERM and SIGHUP are handled from the start to the last line of the report
    (`fleet.engine.interrupts`); with `progress_view`, the run is shown as it goes on stderr."""
    if not handle_signals:
        return await _run_and_report(targets, options, None, as_json, log_dir, per_host, connector, recorded_as,
                                     progress_view)
    interrupts = Interrupts()
    async with anyio.create_task_group() as signals:
        await signals.start(interrupts.watch)
        try:
            outcome = await _run_and_report(targets, options, interrupts, as_json, log_dir, per_host, connector,
                                            recorded_as, progress_view)
        finally:
            signals.cancel_scope.cancel()
    return outcome


async def _run_and_report(targets: Sequence[Host], options: RunOptions, interrupts: Interrupts | None,
                          as_json: bool, log_dir: Path | None, per_host: bool | None, connector: Connector | None,
                          recorded_as: str | None, progress_view: bool) -> tuple[int, RunReport]:
    raise_fd_limit(len(targets))
    logs = RunLogs(log_dir or default_log_dir(), new_run_id())
    logs.create()
    history = start_history(logs, targets, options, recorded_as)
    try:
        with paced_collection():
            report = await run(targets, options, logs=logs, on_host_end=history.host_ended,
                               watch=progress.watch if progress_view else None, interrupts=interrupts, tell=say,
                               connector=connector)
    except BaseException:
        history.close()
        raise
    finally:
        logs.close()
    with heap_frozen():
        rack = uniformity.rack(report.hosts)  # the rack compared once, for the three parts that show it
        text = reporting.render(reporting.to_document(report, rack))
        logs.write_summary(text)
        write_report_page(logs, report, rack)
        code = reporting.exit_code(report)
        history.finish_run(list(report.hosts.values()), code)
        if as_json:
            write(sys.stdout, text)
        for line in _said(report, rack, per_host, logs.path):
            say(line)
    await anyio.to_thread.run_sync(history.close)
    return code, report


def _said(report: RunReport, rack: uniformity.Rack, per_host: bool | None, folder: Path) -> list[str]:
    """What stderr shows of the run: the dry run's plan, the outcome folded, a line per host, where the logs are,
    and what cut the run short."""
    lines = [*reporting.plan_lines(report), *reporting.human_lines(report, rack)]
    if reporting.per_host_wanted(report, per_host):
        lines += reporting.done_lines(report)
    lines.append(f"logs: {folder}")
    if report.interrupted_by is not None:
        lines.append("fleet: interrupted; in-flight commands were ended, the report above is complete")
        abandoned = [h.scheduler.node for h in report.hosts.values() if h.scheduler and h.scheduler.abandoned]
        if abandoned:
            lines.append(f"fleet: left drained at the third interrupt (reason 'fleet: run {report.run_id}'):"
                         f" {fold(abandoned)}")
    elif report.cut_short is not None:
        lines.append(f"fleet: {report.cut_short}; in-flight commands were ended, the report above is complete")
    elif report.stopped:
        lines.append(f"fleet: stopped starting hosts: {report.stopped}")
    return lines


def execute(targets: list[Host], options: RunOptions, *, as_json: bool, log_dir: Path | None,
            metrics_file: Path | None = None, per_host: bool | None = None) -> int:
    """A run of the command line, signals handled and progress shown; then the metrics file (not for a dry run: it
    would replace the last real run's with `planned`)."""
    code, report = anyio.run(partial(run_and_report, targets, options, as_json=as_json, log_dir=log_dir,
                                     per_host=per_host, handle_signals=True, progress_view=True))
    if metrics_file is not None and options.mode is not Mode.PLAN:
        from fleet.report.metrics import render_metrics, write_metrics

        try:
            write_metrics(metrics_file, render_metrics(report, exit_code=code, finished_at=time.time()))
        except OSError as exc:  # a metrics file never changes the run's outcome
            say(f"fleet: warning: metrics not written to {metrics_file}: {exc.strerror or exc}")
    return code

