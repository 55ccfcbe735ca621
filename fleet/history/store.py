"""The store: `History`, one log folder's history database, as a run writes it (a run, each host as it ends,
the run's end, in short transactions) and as `fleet runs`, `fleet show` and `--rerun-failed` read it (runs
filtered by host, group, status and age; one host across runs; a run with its hosts)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from types import TracebackType
from typing import Any

from fleet.history.retention import prune_runs
from fleet.history.rows import DRY_RUN_MODE, HostRow, RunKind, RunRecord, RunRow, host_values
from fleet.history.schema import (
    BUSY_TIMEOUT_S,
    MIGRATIONS,
    json_text,
    now_stamp,
    open_database,
    stamp,
    transaction,
)
from fleet.model.report import HostReport, HostStatus
from fleet.text import printable

# The host statuses `last_failed` returns by default: the hosts a rerun should try again.
RERUN_STATUSES = (HostStatus.FAILED, HostStatus.UNREACHABLE)
UNFINISHED = "unfinished"  # a run with no end on record (running, or killed), as `runs(status=...)` takes it

_HOST_COLUMNS = ("run_id", "host", "status", "reason", "error", "duration_s", "steps", "killed_count", "killed",
                 "memory_before_mib", "memory_after_mib", "settle_s", "health", "slurm", "ended_at", "settings",
                 "fabric_manager")
# Hosts a statement: one `INSERT ... VALUES (...), (...)` for the hosts that ended together, not one each (one
# step, where the writer thread gave the run's event loop the GIL and waited to take it back, once a host). 17
# columns each: 850 values, under the 999 of SQLite before 3.32.
_HOSTS_A_STATEMENT = 50
_ROW = f"({', '.join('?' for _ in _HOST_COLUMNS)})"


@lru_cache(maxsize=_HOSTS_A_STATEMENT)
def _upsert_hosts(count: int) -> str:
    """Insert `count` hosts, or update each one already on record (its first `ended_at` kept)."""
    return (f"INSERT INTO hosts ({', '.join(_HOST_COLUMNS)}) VALUES {', '.join([_ROW] * count)}"
            " ON CONFLICT (run_id, host) DO UPDATE SET "
            + ", ".join(f"{c} = excluded.{c}" for c in _HOST_COLUMNS if c not in ("run_id", "host", "ended_at"))
            + ", ended_at = coalesce(hosts.ended_at, excluded.ended_at)")


_RUN_COLUMNS = "run_id, command, targets, options, started_at, ended_at, exit_code, fleet_version, log_dir"
_HOST_SELECT = ", ".join(f"h.{c}" for c in _HOST_COLUMNS) + ", r.started_at, r.command"

_IS_RESET_SQL = (f"command = '{RunKind.RESET.value}'"
                 f" AND coalesce(json_extract(options, '$.mode'), '') <> '{DRY_RUN_MODE}'")


class History:
    """The history database of one log folder; see `fleet.history.schema` for its tables. A context
    manager."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.conn, self.path = conn, path

    @classmethod
    def open(cls, path: Path, *, busy_timeout_s: float = BUSY_TIMEOUT_S,
             migrations: Sequence[Sequence[str]] = MIGRATIONS) -> History:
        """Open (creating the file and its tables when missing) and bring the schema up to date."""
        return cls(open_database(path, busy_timeout_s=busy_timeout_s, migrations=migrations), path)

    def __enter__(self) -> History:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self.conn.close()

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Several writes in one transaction (one wait for the lock, one commit)."""
        with transaction(self.conn):
            yield

    # --- writes ---

    def start_run(self, run_id: str, command: str, hosts: Sequence[str], options: Mapping[str, Any],
                  started_at: str, fleet_version: str, log_dir: Path | str) -> None:
        with transaction(self.conn):
            self.conn.execute(
                f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES (?, ?, ?, ?, ?, NULL, NULL, ?, ?)",
                (run_id, command, json_text(list(hosts)), json_text(dict(options)), started_at, fleet_version,
                 printable(log_dir)),
            )

    def record_host(self, run_id: str, report: HostReport, ended_at: str | None = None) -> None:
        """Insert or update one host's outcome; the first `ended_at` on record is kept."""
        self.record_hosts(run_id, [(report, ended_at or now_stamp())])

    def record_hosts(self, run_id: str, ended: Sequence[tuple[HostReport, str]]) -> None:
        """`record_host` for each (report, ended_at), in one transaction and a statement a few dozen hosts."""
        rows = []
        for report, ended_at in ended:
            values = {**host_values(report), "run_id": run_id, "ended_at": ended_at}
            rows.append([values[c] for c in _HOST_COLUMNS])
        with transaction(self.conn):
            for start in range(0, len(rows), _HOSTS_A_STATEMENT):
                chunk = rows[start:start + _HOSTS_A_STATEMENT]
                self.conn.execute(_upsert_hosts(len(chunk)), [value for row in chunk for value in row])

    def finish_run(self, run_id: str, ended_at: str, exit_code: int) -> None:
        with transaction(self.conn):
            self.conn.execute("UPDATE runs SET ended_at = ?, exit_code = ? WHERE run_id = ?",
                              (ended_at, exit_code, run_id))

    def prune(self, keep_days: float, now: datetime) -> list[str]:
        """Delete the runs (and their hosts) that started more than `keep_days` ago; their ids, oldest first,
        for the caller to remove their log folders."""
        return prune_runs(self.conn, keep_days, now)

    # --- queries ---

    def runs(self, limit: int | None = 20, *, host: str | None = None, group_hosts: Sequence[str] | None = None,
             status: str | None = None, since: datetime | None = None) -> list[RunRow]:
        """Runs, newest first: those that targeted `host` / any of `group_hosts`, in which some host ended
        `status` (`unfinished`: runs with no end on record), started at or after `since`."""
        where, args = [], []
        if since is not None:
            where.append("r.started_at >= ?")
            args.append(stamp(since))
        names = [*([host] if host is not None else []), *(group_hosts or [])]
        if host is not None or group_hosts is not None:
            where.append("EXISTS (SELECT 1 FROM json_each(r.targets) t WHERE t.value IN"
                         " (SELECT value FROM json_each(?)))")
            args.append(json_text(names))
        if status == UNFINISHED:
            where.append("r.ended_at IS NULL")
        elif status is not None:
            where.append("EXISTS (SELECT 1 FROM hosts s WHERE s.run_id = r.run_id AND s.status = ?"
                         + (" AND s.host = ?" if host is not None else "") + ")")
            args += [status, *([host] if host is not None else [])]
        sql = (f"SELECT {', '.join('r.' + c.strip() for c in _RUN_COLUMNS.split(','))} FROM runs r"
               + (" WHERE " + " AND ".join(where) if where else "")
               + " ORDER BY r.started_at DESC, r.run_id DESC" + (" LIMIT ?" if limit is not None else ""))
        rows = self.conn.execute(sql, (*args, *([limit] if limit is not None else []))).fetchall()
        counts = self._counts([r[0] for r in rows])
        return [_run_row(r, counts.get(r[0], {})) for r in rows]

    def host_history(self, host: str, since: datetime | None = None, status: str | None = None) -> list[HostRow]:
        """One host's outcomes across runs, newest first (how often has this node failed, and why)."""
        sql = f"SELECT {_HOST_SELECT} FROM hosts h JOIN runs r ON r.run_id = h.run_id WHERE h.host = ?"
        args: list[Any] = [host]
        if since is not None:
            sql += " AND r.started_at >= ?"
            args.append(stamp(since))
        if status is not None:
            sql += " AND h.status = ?"
            args.append(status)
        sql += " ORDER BY r.started_at DESC, r.run_id DESC"
        return [_host_row(r) for r in self.conn.execute(sql, args)]

    def knows_host(self, host: str) -> bool:
        """Whether any run on record targeted `host`."""
        row = self.conn.execute(
            "SELECT EXISTS (SELECT 1 FROM hosts WHERE host = ?) OR EXISTS (SELECT 1 FROM runs r, json_each(r.targets) t"
            " WHERE t.value = ?)", (host, host)).fetchone()
        return bool(row[0])

    def last_run_id(self) -> str | None:
        """The newest run of any kind (`fleet show last`)."""
        row = self.conn.execute("SELECT run_id FROM runs ORDER BY started_at DESC, run_id DESC LIMIT 1").fetchone()
        return None if row is None else str(row[0])

    def last_reset_id(self) -> str | None:
        """The newest reset that was not a dry run (`--rerun-failed last`): dry runs and checks reset nothing."""
        row = self.conn.execute(f"SELECT run_id FROM runs WHERE {_IS_RESET_SQL}"
                                " ORDER BY started_at DESC, run_id DESC LIMIT 1").fetchone()
        return None if row is None else str(row[0])

    def get(self, run_id: str) -> RunRecord | None:
        row = self.conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            return None
        hosts = [_host_row(r) for r in self.conn.execute(
            f"SELECT {_HOST_SELECT} FROM hosts h JOIN runs r ON r.run_id = h.run_id WHERE h.run_id = ?"
            " ORDER BY h.host", (run_id,))]
        return RunRecord(_run_row(row, self._counts([run_id]).get(run_id, {})), hosts)

    def last_failed(self, run_id: str, statuses: Sequence[str] = RERUN_STATUSES) -> list[str]:
        """The hosts of a run that ended in one of `statuses` (failed, unreachable): what a rerun retries."""
        marks = ", ".join("?" for _ in statuses)
        return [r[0] for r in self.conn.execute(
            f"SELECT host FROM hosts WHERE run_id = ? AND status IN ({marks}) ORDER BY host",
            (run_id, *[str(s) for s in statuses]))]

    def _counts(self, run_ids: Sequence[str]) -> dict[str, dict[str, int]]:
        counts: dict[str, dict[str, int]] = {}
        if not run_ids:
            return counts
        for run_id, status, n in self.conn.execute(
                "SELECT run_id, status, count(*) FROM hosts WHERE run_id IN (SELECT value FROM json_each(?))"
                " GROUP BY run_id, status", (json_text(list(run_ids)),)):
            counts.setdefault(run_id, {})[status] = n
        return counts


def _run_row(row: Sequence[Any], counts: dict[str, int]) -> RunRow:
    run_id, command, targets, options, started, ended, code, version, log_dir = row
    return RunRow(run_id=run_id, command=command, targets=tuple(json.loads(targets)), options=json.loads(options),
                  started_at=started, ended_at=ended, exit_code=code, fleet_version=version,
                  log_dir=log_dir, counts=counts)


def _host_row(row: Sequence[Any]) -> HostRow:
    values = dict(zip((*_HOST_COLUMNS, "started_at", "command"), row, strict=True))
    for key in ("steps", "killed", "memory_before_mib", "memory_after_mib", "settle_s", "health", "slurm", "settings",
                "fabric_manager"):
        values[key] = _loads(values[key])
    return HostRow(**values)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)
