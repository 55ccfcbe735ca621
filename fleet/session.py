"""One run from targets to exit status: logs folder, task graph, summary.json, report on stdout/stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from fleet import report as reporting
from fleet.logs import RunLogs, default_log_dir, new_run_id
from fleet.models import Host
from fleet.runner import Connector, RunOptions, run_hosts
from fleet.tables import report_table


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def run_and_report(
    command: str,
    targets: Sequence[Host],
    *,
    as_json: bool,
    concurrency: int | None,
    log_dir: Path | None,
    dry_run: bool = False,
    handle_signals: bool = True,
    table: bool = False,
    connector: Connector | None = None,
) -> int:
    """Run, write summary.json (even when interrupted), print the report; return the exit status."""
    logs = RunLogs(log_dir or default_log_dir(), new_run_id())
    logs.create()
    options = RunOptions(command=command, concurrency=concurrency, dry_run=dry_run, handle_signals=handle_signals)
    try:
        extra = {"connector": connector} if connector else {}
        run_report, state = await run_hosts(targets, options, logs, **extra)
    finally:
        logs.close()
    document = reporting.to_document(run_report)
    logs.write_summary(document)
    if as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        sys.stdout.flush()
    if table:
        report_table(run_report)
    for line in reporting.human_lines(run_report):
        say(line)
    say(f"logs: {logs.path}")
    if state.interrupted:
        say("fleet: interrupted; in-flight commands were ended, the report above is complete")
    return reporting.exit_code(run_report, interrupted=state.interrupted)
