"""Retention: nothing goes unless asked. `fleet reset --keep-days N` and `fleet runs --keep-days N` delete the
records of runs that started more than N days ago (`prune_runs`, behind `History.prune`) and their log folders,
and any older run folder not on record (from before the history, or whose record is gone). Only folders named
as run ids, directly in the log folder, are ever removed."""

from __future__ import annotations

import re
import shutil
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fleet.history.schema import stamp, transaction

# What a run id looks like (`fleet.runlog.folder.new_run_id`): only such folders are ever removed by prune.
RUN_ID = re.compile(r"^(\d{8}T\d{6}Z)-[0-9a-f]{6}$")


def run_id_time(run_id: str) -> datetime | None:
    """When a run started, read from its id (`20261202T110501Z-3f9c2a`); None for a name that is no run id."""
    match = RUN_ID.match(run_id)
    if match is None:
        return None
    return datetime.strptime(match.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)


def prune_runs(conn: sqlite3.Connection, keep_days: float, now: datetime) -> list[str]:
    """Delete the runs (and their hosts) that started more than `keep_days` ago; their ids, oldest first,
    for the caller to remove their log folders."""
    cutoff = stamp(now - timedelta(days=keep_days))
    with transaction(conn):
        ids = [r[0] for r in conn.execute(
            "SELECT run_id FROM runs WHERE started_at < ? ORDER BY started_at, run_id", (cutoff,))]
        conn.execute("DELETE FROM hosts WHERE run_id IN (SELECT run_id FROM runs WHERE started_at < ?)", (cutoff,))
        conn.execute("DELETE FROM runs WHERE started_at < ?", (cutoff,))
    return ids


def stale_folders(log_dir: Path, keep_days: float, now: datetime) -> list[str]:
    """Run folders in `log_dir` whose id says they started more than `keep_days` ago (recorded or not: runs
    from before the history, or whose record is gone)."""
    cutoff = now - timedelta(days=keep_days)
    if not log_dir.is_dir():
        return []
    return sorted(p.name for p in log_dir.iterdir()
                  if p.is_dir() and not p.is_symlink() and (t := run_id_time(p.name)) is not None and t < cutoff)


def newest_folders(log_dir: Path, count: int) -> list[str]:
    """The `count` newest run folders in `log_dir` by their ids (runs from before the history included)."""
    if not log_dir.is_dir():
        return []
    return sorted((p.name for p in log_dir.iterdir() if p.is_dir() and RUN_ID.match(p.name)), reverse=True)[:count]


def remove_folders(log_dir: Path, run_ids: Sequence[str]) -> list[str]:
    """Remove the log folders of these runs (only names that are run ids, only folders directly in `log_dir`);
    the ids whose folder was removed."""
    removed = []
    for run_id in run_ids:
        folder = log_dir / run_id
        if RUN_ID.match(run_id) and folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(run_id)
    return removed
