"""What `fleet runs` and `fleet show` print: pure functions over history rows, report documents and log records."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import textwrap
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from fleet.history import UNFINISHED, HostRow, Liveness, RunRecord, RunRow, host_from_row, parse_stamp
from fleet.inventory.nodesets import fold
from fleet.model.errors import UsageError
from fleet.model.report import HostStatus, RunReport
from fleet.report.html_report import RunPage
from fleet.report.render import human_lines
from fleet.text import terminal_safe

_SINCE = re.compile(r"^(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
# Keys every log line has, shown in their own columns (or not at all).
_LOG_FRAME = ("timestamp", "level", "event", "step", "host", "run_id")
# A field's value in a readable log line is cut to this many characters (the raw JSONL has it whole).
FIELD_WIDTH = 160
PRUNE_NAMED = 20  # `--keep-days` names the runs it removed up to this many
STATUS_ORDER = [s.value for s in HostStatus]


def parse_since(text: str, now: datetime) -> datetime:
    """`7d`, `24h`, `90m`, `1w2d`, `30s` (that long before `now`), or a date / time (`2026-12-01`,
    `2026-12-01T10:00`, UTC unless it says otherwise) -> the moment from which on runs count."""
    cleaned = text.strip()
    match = _SINCE.match(cleaned)
    if cleaned and match and any(match.groups()):
        weeks, days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
        return now - timedelta(weeks=weeks, days=days, hours=hours, minutes=minutes, seconds=seconds)
    try:
        when = datetime.fromisoformat(cleaned)
    except ValueError:
        raise UsageError(f"--since takes a duration (7d, 24h, 90m) or a date (2026-12-01), not {text!r}") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def short_time(stamp: str) -> str:
    """`2026-12-02T11:05:01.348+00:00` -> `2026-12-02 11:05:01` (UTC)."""
    return parse_stamp(stamp).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def took(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


# The narrowest room the last (free-text) column is wrapped into, whatever the terminal.
LAST_COLUMN_MIN = 24


def terminal_columns() -> int | None:
    """The width to fit a table into: $COLUMNS when set, else the terminal's; None when stdout is no terminal
    (a pipe, a file: nothing wraps there, so lines stay whole for grep and awk)."""
    given = os.environ.get("COLUMNS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    if sys.stdout.isatty():
        return os.get_terminal_size(sys.stdout.fileno()).columns
    return None


def table(header: Sequence[str], rows: Sequence[Sequence[str]], width: int | None = None,
          droppable: Sequence[int] = ()) -> list[str]:
    """Columns left-aligned, two spaces apart; the last one free text, not padded. Within `width` (a terminal's
    columns), the `droppable` columns go first (in that order) while the table is too wide, then the last column
    wraps within its own column, its continuation lines indented under it: never under another column."""
    cells = [list(header), *[list(r) for r in rows]]
    for index in droppable:
        if width is None or _width(cells) <= width:
            break
        cells = [row[:index] + row[index + 1:] for row in cells]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]) - 1)]
    indent = sum(widths) + 2 * len(widths)
    room = max(LAST_COLUMN_MIN, width - indent) if width is not None else None
    lines = []
    for row in cells:
        lead = "".join(cell.ljust(w) + "  " for cell, w in zip(row[:-1], widths, strict=True))
        parts = textwrap.wrap(row[-1], room, break_on_hyphens=False) if room and len(row[-1]) > room else [row[-1]]
        lines.append((lead + (parts[0] if parts else "")).rstrip())
        lines.extend(" " * indent + part for part in parts[1:])
    return lines


def _width(cells: Sequence[Sequence[str]]) -> int:
    return sum(max(len(row[i]) for row in cells) for i in range(len(cells[0]))) + 2 * (len(cells[0]) - 1)


def command_label(run: RunRow) -> str:
    return f"{run.command} --dry-run" if run.options.get("mode") == "plan" else run.command


def counts_text(counts: Mapping[str, int]) -> str:
    """`15 clean, 1 failed`, in the report's status order."""
    order = sorted(counts, key=lambda s: (STATUS_ORDER.index(s) if s in STATUS_ORDER else len(STATUS_ORDER), s))
    return ", ".join(f"{counts[s]} {s}" for s in order if counts[s])


def outcome(run: RunRow) -> str:
    """The run's hosts by status; a run with no end on record says how many of its hosts are, and whether its
    process still runs or was killed, where that is known (`unfinished (killed): 2 of 4 on record (2 clean)`)."""
    done = counts_text(run.counts)
    if run.finished:
        return done
    return f"{UNFINISHED}{_going(run)}: {run.recorded} of {len(run.targets)} on record" + (f" ({done})" if done else "")


def _going(run: RunRow) -> str:
    return f" ({run.liveness})" if run.liveness in (Liveness.RUNNING, Liveness.KILLED) else ""


def run_lines(runs: Sequence[RunRow], width: int | None = None) -> list[str]:
    """`fleet runs`: newest first, a run a line (within `width`: STARTED goes first, the run id says it too)."""
    rows = [[r.run_id, short_time(r.started_at), took(r.duration_s), command_label(r), str(len(r.targets)),
             "-" if r.exit_code is None else str(r.exit_code), outcome(r)] for r in runs]
    return table(["RUN", "STARTED (UTC)", "TOOK", "COMMAND", "HOSTS", "EXIT", "OUTCOME"], rows, width, droppable=(1,))


def host_lines(rows: Sequence[HostRow], width: int | None = None) -> list[str]:
    """`fleet runs --host H`: that host's outcome in each run, newest first (within `width`, as `run_lines`)."""
    lines = [[r.run_id, short_time(r.started_at), r.command, r.status, r.reason or "-", took(r.duration_s),
              one_line(r.error or "")] for r in rows]
    return table(["RUN", "STARTED (UTC)", "COMMAND", "STATUS", "REASON", "TOOK", "ERROR"], lines, width,
                 droppable=(1,))


def tally(host: str, rows: Sequence[HostRow]) -> dict[str, Any]:
    """How often a host ended each way, and why it did not end clean."""
    statuses = Counter(r.status for r in rows)
    reasons: dict[str, Counter[str]] = {}
    for r in rows:
        if r.status not in (HostStatus.CLEAN.value, HostStatus.PLANNED.value):
            reasons.setdefault(r.status, Counter())[r.reason or "unknown"] += 1
    return {"host": host, "runs": len(rows), "statuses": dict(statuses),
            "reasons": {s: dict(c.most_common()) for s, c in reasons.items()}}


def tally_line(summary: Mapping[str, Any]) -> str:
    """`gpu-b07: 14 runs, 11 clean, 3 failed: memory_held 2, health 1`."""
    runs = summary["runs"]
    parts = [f"{summary['host']}: {runs} run{'' if runs == 1 else 's'}"]
    statuses: dict[str, int] = summary["statuses"]
    for status in sorted(statuses, key=lambda s: STATUS_ORDER.index(s) if s in STATUS_ORDER else len(STATUS_ORDER)):
        why = summary["reasons"].get(status)
        detail = f": {', '.join(f'{reason} {n}' for reason, n in why.items())}" if why else ""
        parts.append(f"{statuses[status]} {status}{detail}")
    return ", ".join(parts)


def one_line(text: str, width: int = FIELD_WIDTH) -> str:
    """A field of a line: its whitespace made single spaces, nothing in it acting on a terminal (`terminal_safe`),
    cut to `width`."""
    flat = terminal_safe(" ".join(text.split()))
    return flat if len(flat) <= width else flat[: width - 3] + "..."


# --- fleet show -------------------------------------------------------------------------------------------------


_NO_END: dict[str | None, str] = {
    Liveness.RUNNING: "still running: its fleet holds running.lock",
    Liveness.KILLED: "killed: its fleet process is gone, running.lock is free",
    Liveness.OVER: "its summary.json is written",
}


def record_page(record: RunRecord) -> RunPage:
    """The report page of a run with no summary.json (killed, or still going), from what the history has of it:
    each host on record, and the targets not on record as `not on record`."""
    run = record.run
    hosts = {row.host: host_from_row(row) for row in record.hosts}
    state = "ended without a summary" if run.finished else "has no end on record (still running, or killed)"
    return RunPage(report=RunReport(run_id=run.run_id, command=run.command, started_at=run.started_at,
                                    duration_s=run.duration_s or 0.0, hosts=hosts), fleet_version=run.fleet_version,
                   ended=run.finished, not_on_record=tuple(n for n in run.targets if n not in hosts),
                   note=f"this run {state}: built from its history, {len(record.hosts)} of {len(run.targets)} hosts"
                        " on record")


def unfinished_lines(record: RunRecord) -> list[str]:
    """`fleet show` of a run with no summary.json (running, or killed): what the history has of it."""
    run = record.run
    hosts = {h.host: host_from_row(h) for h in record.hosts}
    report = RunReport(run_id=run.run_id, command=run.command, started_at=run.started_at, duration_s=0.0, hosts=hosts)
    missing = [name for name in run.targets if name not in hosts]
    lines = human_lines(report)[:-1] if hosts else []
    why = _NO_END.get(run.liveness, "still running, or killed")
    state = "ended without a summary" if run.finished else f"has no end on record ({why})"
    lines.append(f"{command_label(run)} {run.run_id} {state}: {len(hosts)} of {len(run.targets)} hosts on record"
                 + (f"; not on record: {fold(missing)}" if missing else ""))
    return lines


def log_line(record: Mapping[str, Any]) -> str:
    """One host log event, readable: time, level, step, event and its fields (a command as its argv, exit
    status and time, or what cut it short and when; its output only in the raw JSONL)."""
    stamp = str(record.get("timestamp", ""))
    clock = stamp[11:23] if len(stamp) >= 23 and stamp[10] == "T" else stamp
    head = f"{clock:<12} {record.get('level', ''):<7} {record.get('step') or '-':<6} {record.get('event', ''):<13}"
    cut = record.get("ended")
    if record.get("event") == "batch" and cut and isinstance(record.get("asked"), list):  # cut short while it ran
        asked = one_line("; ".join(map(str, record["asked"])))
        return f"{head}  $ {asked}  -> cut short after {record.get('duration_s')} s: {one_line(str(cut))}"
    if record.get("event") == "batch" and isinstance(record.get("sections"), int):  # its commands follow, each a line
        status = "timed out" if record.get("timed_out") else f"exit {record.get('exit_status')}"
        return (f"{head}  $ {record['sections']} commands in one (batch {record.get('batch')}: each below)  -> {status}"
                f" in {record.get('duration_s')} s")
    if record.get("event") == "command" and isinstance(record.get("argv"), list):
        if cut:
            status = f"cut short after {record.get('duration_s')} s: {one_line(str(cut))}"
        else:
            exited = record.get("exit_status")
            status = ("timed out" if record.get("timed_out") else "no exit status" if exited is None
                      else f"exit {exited}")
            if record.get("signal"):
                status += f", signal {record['signal']}"
            if record.get("timed_out") and record.get("bound"):  # the bound that ended it, named
                status += f" after {record.get('timeout_s')} s ({one_line(str(record['bound']))})"
            else:
                status += f" in {record.get('duration_s')} s"
        if record.get("note"):
            status += f" ({one_line(str(record['note']))})"
        argv = one_line(shlex.join(map(str, record["argv"])))
        return f"{head}  $ {argv}  -> {status}"
    fields = [f"{k}={_field(v)}" for k, v in record.items() if k not in _LOG_FRAME and v is not None]
    return f"{head}  {' '.join(fields)}".rstrip()


def _field(value: object) -> str:
    text = value if isinstance(value, str) and value and " " not in value and "=" not in value else None
    return one_line(text if text is not None else json.dumps(value, separators=(",", ":")))


def log_lines(text: str) -> list[str]:
    """A host's JSONL log, a readable line per event (a line that is no JSON object as it is)."""
    lines = []
    for raw in text.splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        lines.append(log_line(record) if isinstance(record, dict) else raw)
    return lines


def prune_line(removed: Sequence[str], folders: Sequence[str], keep_days: float) -> str:
    """What `--keep-days` removed."""
    if not removed and not folders:
        return f"pruned nothing: no run older than {keep_days:g} days"
    runs = sorted(set(removed) | set(folders))
    return (f"pruned runs older than {keep_days:g} days: {len(removed)} record{'' if len(removed) == 1 else 's'},"
            f" {len(folders)} log folder{'' if len(folders) == 1 else 's'}"
            + (f" ({', '.join(runs)})" if len(runs) <= PRUNE_NAMED else ""))
