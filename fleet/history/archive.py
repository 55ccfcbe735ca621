"""The runs on disk, as the commands name them: a run id (or `last`) resolved against a log folder, the folder's
history opened for reading (never created by a read), and retention (`--keep-days`). Used by `fleet runs`,
`fleet show` and `reset --keep-days`; the CLI only declares those commands."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleet.history import (
    History,
    Liveness,
    RunRecord,
    RunRow,
    history_path,
    liveness,
    newest_folders,
    remove_folders,
    stale_folders,
)
from fleet.history.view import (
    host_lines,
    log_lines,
    parse_since,
    prune_line,
    record_page,
    run_lines,
    tally,
    tally_line,
    terminal_columns,
    unfinished_lines,
)
from fleet.model.codec import Fields, run_from_document
from fleet.model.errors import UsageError
from fleet.report import render
from fleet.report.html_report import REPORT_HTML, RunPage, write_page
from fleet.runlog.folder import SUMMARY, run_liveness
from fleet.terminal import say


@contextmanager
def reading(folder: Path) -> Iterator[History | None]:
    """The folder's history, or None when it has none (a read never creates one)."""
    path = history_path(folder)
    if not path.is_file():
        yield None
        return
    with History.open(path) as history:
        yield history


def plain_name(value: str, what: str) -> str:
    """A run id or host name that names a file in a folder, never a path."""
    if not value or value in (".", "..") or "/" in value or "\0" in value:
        raise UsageError(f"{what}: {value!r} is no run id or host name")
    return value


def resolve_run_id(folder: Path, given: str) -> str:
    """`last` (the newest run, on record or with a log folder), or a run id that exists in `folder`."""
    with reading(folder) as history:
        if given == "last":
            candidates = [history.last_run_id() if history else None, *newest_folders(folder, 1)]
            found = max((c for c in candidates if c), default=None)
            if found is None:
                raise UsageError(f"no run on record in {folder}")
            return found
        plain_name(given, "run id")
        if (folder / given).is_dir() or (history is not None and history.get(given) is not None):
            return given
    raise UsageError(f"no run {given} in {folder}")


def prune(folder: Path, keep_days: int, now: datetime) -> dict[str, list[str]]:
    """`--keep-days`: the old records, then the old log folders (recorded or not); says what went."""
    with reading(folder) as history:
        records = history.prune(keep_days, now) if history else []
    folders = remove_folders(folder, sorted(set(records) | set(stale_folders(folder, keep_days, now))))
    say(prune_line(records, folders, keep_days))
    return {"records": records, "folders": folders}


def looked_at(folder: Path, run: RunRow) -> RunRow:
    """The run with its `liveness`, from its log folder in `folder`: a run with no end on record is still running
    (its fleet holds running.lock), killed (the lock is free and there is no summary) or unknown."""
    if run.finished:
        return replace(run, liveness=Liveness.OVER.value)
    seen = liveness(run_liveness(folder, run.run_id), (folder / run.run_id / SUMMARY).is_file())
    return replace(run, liveness=seen.value)


def listing(folder: Path, *, host: str | None, group_hosts: list[str] | None, status: str | None,
            since: str | None, limit: int, keep_days: int | None) -> tuple[dict[str, Any], list[str]]:
    """`fleet runs`: the JSON document and the lines for humans (after `--keep-days`' pruning, when asked)."""
    now = datetime.now(UTC)
    cutoff = parse_since(since, now) if since else None
    pruned = prune(folder, keep_days, now) if keep_days is not None else None
    with reading(folder) as history:
        if host is not None:
            if history is None or not history.knows_host(host):
                raise UsageError(f"no run on record targeted {host} ({history_path(folder)})")
            rows = history.host_history(host, since=cutoff, status=status)
            summary = tally(host, rows)
            document: dict[str, Any] = {"history": str(history_path(folder)), "tally": summary,
                                        "runs": [r.document() for r in rows[:limit]]}
            lines = [*(host_lines(rows[:limit], terminal_columns()) if rows else []), tally_line(summary)]
        else:
            found = history.runs(limit, group_hosts=group_hosts, status=status, since=cutoff) if history else []
            found = [looked_at(folder, r) for r in found]
            document = {"history": str(history_path(folder)), "runs": [r.document() for r in found]}
            lines = run_lines(found, terminal_columns()) if found else [f"no run on record in {history_path(folder)}"]
    if pruned is not None:
        document["pruned"] = pruned
    return document, lines


def log_events(text: str) -> list[dict[str, Any]]:
    """A host's JSONL log as one JSON list of its events, in order. A line that is no JSON object (the last one
    of a run killed mid-write) is kept, as `{"event": "unreadable_line", "line": N, "text": ...}`."""
    events: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        events.append(event if isinstance(event, dict) else {"event": "unreadable_line", "line": number, "text": line})
    return events


def show_run(folder: Path, given: str, *, host: str | None, as_json: bool) -> tuple[str, int]:
    """`fleet show`: what it prints on stdout, and its exit status. A run's summary.json (as it is, or for humans,
    as the run said it: the plan, the outcome folded, a line per host for a screenful of them), with the run's own
    exit status; one host's log (a readable line per event, or one JSON list of its events), 0; for a run with no
    summary (killed, or still going), what the history has of it, with the exit status on record (1 when none: not
    proven clean)."""
    run_id = resolve_run_id(folder, given)
    run_folder = folder / run_id
    if host is not None:
        log = run_folder / f"{plain_name(host, '--host')}.jsonl"
        if not log.is_file():
            raise UsageError(f"run {run_id} has no log of host {host} ({log} does not exist)")
        text = log.read_text(encoding="utf-8", errors="replace")
        if as_json:
            return json.dumps(log_events(text), indent=1) + "\n", 0
        return "".join(f"{line}\n" for line in log_lines(text)), 0
    summary = run_folder / "summary.json"
    if summary.is_file():
        report = read_summary(summary).report
        code = render.exit_code(report)
        if as_json:
            return summary.read_text(encoding="utf-8"), code
        per_host = render.done_lines(report) if render.per_host_wanted(report, None) else []
        lines = [*render.plan_lines(report), *render.human_lines(report), *per_host, f"logs: {run_folder}"]
        return "\n".join(lines) + "\n", code
    with reading(folder) as history:
        record = history.get(run_id) if history else None
    if record is None:
        raise UsageError(f"run {run_id} has no summary.json and no record in {history_path(folder)}")
    record = RunRecord(looked_at(folder, record.run), record.hosts)
    code = record.run.exit_code if record.run.exit_code is not None else render.FAILED
    if as_json:
        doc = {"run": record.run.document(), "hosts": {h.host: h.document() for h in record.hosts}}
        return json.dumps(doc, indent=1) + "\n", code
    return "\n".join([*unfinished_lines(record), f"logs: {run_folder}"]) + "\n", code


def read_summary(path: Path) -> RunPage:
    """A run's summary.json, read back (`fleet.model.codec`): its report and the fleet version that wrote it. One
    that is no JSON, or a document fleet cannot read, is a UsageError naming the file (and the key)."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        return RunPage(report=run_from_document(document), fleet_version=Fields(document).text("fleet_version"))
    except ValueError as exc:  # no JSON, or a DocumentError
        raise UsageError(f"{path}: {exc}") from None


def show_run_html(folder: Path, given: str) -> str:
    """`fleet show --html`: the path of the run's report.html, written first when it is not there: from the run's
    summary.json (a run of an older fleet), else from what the history has of it (a run killed before its end)."""
    run_id = resolve_run_id(folder, given)
    run_folder = folder / run_id
    path = run_folder / REPORT_HTML
    if path.is_file():
        return f"{path}\n"
    summary = run_folder / "summary.json"
    if summary.is_file():
        page = read_summary(summary)
    else:
        with reading(folder) as history:
            record = history.get(run_id) if history else None
        if record is None:
            raise UsageError(f"run {run_id} has no summary.json and no record in {history_path(folder)}")
        page = record_page(record)
    try:
        run_folder.mkdir(exist_ok=True)
        return f"{write_page(run_folder, page)}\n"
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from exc
