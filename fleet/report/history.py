"""Run history: every run and every host's outcome in one SQLite file, `<log-dir>/history.sqlite` (stdlib only).

    runs    one row a run: what it targeted, how, when it started and ended, its exit status
            (ended_at and exit_code stay null while it runs, and for good when it was killed)
    hosts   one row a host of a run, written as the host finishes (so a run killed mid-way leaves
            its finished hosts on record) and again, whole, when the run ends; its `health` column holds
            every health finding, a GPU's with its index (`gpu`), the host's (on no listed GPU: an Xid
            on another PCI address, a kernel log not read) with `gpu` null and its `pci` address (null too
            for the kernel log): one JSON list, so no column was added for them

WAL mode and a busy timeout let several fleet processes write at once (each write is one short
transaction); the schema's version is `PRAGMA user_version`, brought up to date by `MIGRATIONS`, in
order, each in its own transaction; a file from a newer fleet is refused, never rewritten.

`Recorder` is how a run writes: from a thread of its own, so that the run's event loop never waits on
the database, and so that a history that cannot be written (disk full, locked past the timeout, a
newer schema) is one warning line, never the run's failure.
"""

from __future__ import annotations

import json
import queue
import re
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any

from fleet import __version__
from fleet.errors import UsageError
from fleet.report.models import HostReport, HostStatus

HISTORY_FILE = "history.sqlite"
BUSY_TIMEOUT_S = 10.0
# Seconds a run waits, at its end, for its last history writes (a lock held past the busy timeout included).
CLOSE_TIMEOUT_S = BUSY_TIMEOUT_S + 5.0
# What a run id looks like (`fleet.report.logs.new_run_id`): only such folders are ever removed by prune.
RUN_ID = re.compile(r"^(\d{8}T\d{6}Z)-[0-9a-f]{6}$")
# The host statuses `last_failed` returns by default: the hosts a rerun should try again.
RERUN_STATUSES = (HostStatus.FAILED, HostStatus.UNREACHABLE)
UNFINISHED = "unfinished"  # a run with no end on record (running, or killed), as `runs(status=...)` takes it

# Migration N (from 1) takes a database from user_version N-1 to N: a list of statements, run in one transaction.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE runs (
            run_id        TEXT PRIMARY KEY,
            command       TEXT NOT NULL,
            targets       TEXT NOT NULL,   -- JSON list of host names
            options       TEXT NOT NULL,   -- JSON object
            started_at    TEXT NOT NULL,   -- ISO 8601, UTC, milliseconds
            ended_at      TEXT,            -- null while running (and for good if killed)
            exit_code     INTEGER,         -- null while running (and for good if killed)
            fleet_version TEXT NOT NULL,
            log_dir       TEXT NOT NULL    -- the folder holding the run's log folder
        )""",
        """CREATE TABLE hosts (
            run_id      TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            host        TEXT NOT NULL,
            status      TEXT NOT NULL,
            reason      TEXT,
            error       TEXT,
            duration_s  REAL NOT NULL,
            steps       TEXT NOT NULL,     -- JSON [{name, status, duration_s}]
            killed_count INTEGER NOT NULL,
            killed      TEXT NOT NULL,     -- JSON [{pid, name, user, signal}]
            memory_before_mib TEXT,        -- JSON [MiB per GPU] when known (a dry run's survey), else null
            memory_after_mib  TEXT,        -- JSON [MiB per GPU] as verify read it, null without GPUs read
            settle_s    TEXT,              -- JSON [seconds per GPU] (null entries: not settled / not asked)
            health      TEXT NOT NULL,     -- JSON [{gpu, check, level, detail}]
            slurm       TEXT,              -- JSON {node, state_before, ...} with --slurm
            ended_at    TEXT,              -- when the host finished (ISO 8601, UTC)
            PRIMARY KEY (run_id, host)
        ) WITHOUT ROWID""",
        "CREATE INDEX hosts_by_host ON hosts (host, run_id)",
        "CREATE INDEX runs_by_started ON runs (started_at)",
    ),
)


class HistoryError(UsageError):
    """The history database cannot be used: one line naming the file (exit 2 from `fleet runs`/`fleet show`)."""


def history_path(log_dir: Path) -> Path:
    return log_dir / HISTORY_FILE


def stamp(when: datetime) -> str:
    """The one format every time in the database has (so that text order is time order)."""
    return when.astimezone(UTC).isoformat(timespec="milliseconds")


def now_stamp() -> str:
    return stamp(datetime.now(UTC))


def parse_stamp(text: str) -> datetime:
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def run_id_time(run_id: str) -> datetime | None:
    """When a run started, read from its id (`20261202T110501Z-3f9c2a`); None for a name that is no run id."""
    match = RUN_ID.match(run_id)
    if match is None:
        return None
    return datetime.strptime(match.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)


# --- rows ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunRow:
    """One run as the history has it; `counts` are its hosts on record by status."""

    run_id: str
    command: str
    targets: tuple[str, ...]
    options: dict[str, Any]
    started_at: str
    ended_at: str | None
    exit_code: int | None
    fleet_version: str
    log_dir: str
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.ended_at is not None

    @property
    def duration_s(self) -> float | None:
        if self.ended_at is None:
            return None
        return round((parse_stamp(self.ended_at) - parse_stamp(self.started_at)).total_seconds(), 3)

    @property
    def recorded(self) -> int:
        return sum(self.counts.values())

    def document(self) -> dict[str, Any]:
        return {**asdict(self), "targets": list(self.targets), "duration_s": self.duration_s}


@dataclass(frozen=True)
class HostRow:
    """One host's outcome in one run; `started_at` and `command` are its run's."""

    run_id: str
    host: str
    status: str
    reason: str | None
    error: str | None
    duration_s: float
    steps: list[dict[str, Any]]
    killed_count: int
    killed: list[dict[str, Any]]
    memory_before_mib: list[int | None] | None
    memory_after_mib: list[int | None] | None
    settle_s: list[float | None] | None
    health: list[dict[str, Any]]
    slurm: dict[str, Any] | None
    ended_at: str | None
    started_at: str = ""
    command: str = ""

    def document(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunRecord:
    """A run and its hosts on record (a killed run: those that finished before it died)."""

    run: RunRow
    hosts: list[HostRow]


class RunKind(StrEnum):
    """What a run on record was: only a reset changed anything on its hosts (`--rerun-failed` takes no other)."""

    RESET = "reset"
    DRY_RUN = "dry run"  # `fleet reset --dry-run`: command reset, mode plan
    CHECK = "check"  # `fleet check`


# How the runs table tells them apart; `run_kind` and `History.last_reset_id` read the same two columns.
_DRY_RUN_MODE = "plan"
_IS_RESET_SQL = (f"command = '{RunKind.RESET.value}'"
                 f" AND coalesce(json_extract(options, '$.mode'), '') <> '{_DRY_RUN_MODE}'")


def run_kind(run: RunRow) -> RunKind:
    """A reset, a dry run or a check, from the run's command and its options' mode."""
    if run.command != RunKind.RESET.value:
        return RunKind.CHECK
    return RunKind.DRY_RUN if run.options.get("mode") == _DRY_RUN_MODE else RunKind.RESET


def not_clean(record: RunRecord) -> list[str]:
    """The run's targets that did not end clean: failed, unreachable or skipped on record, and those a killed
    run never recorded (`--rerun-failed`, which refuses dry runs and checks before it asks)."""
    ended = {h.host: h.status for h in record.hosts}
    return [name for name in record.run.targets if ended.get(name) != HostStatus.CLEAN.value]


def host_values(report: HostReport) -> dict[str, Any]:
    """A host's report as the `hosts` table's columns (but run_id and ended_at): pure."""
    gpus = report.gpus
    return {
        "host": report.name,
        "status": report.status.value,
        "reason": report.reason.value if report.reason is not None else None,
        "error": report.error,
        "duration_s": report.duration_s,
        "steps": _json([{"name": s.name.value, "status": s.status.value, "duration_s": s.duration_s}
                        for s in report.steps]),
        "killed_count": len(report.killed),
        "killed": _json([asdict(k) for k in report.killed]),
        "memory_before_mib": _memory_before(report),
        "memory_after_mib": _json([g.memory_used_mib for g in gpus]) if gpus else None,
        "settle_s": _json([g.settle_s for g in gpus]) if gpus else None,
        "health": _json([{"gpu": g.index, **asdict(f)} for g in gpus for f in g.health]
                        + [{"gpu": None, **asdict(f)} for f in report.health]),
        "slurm": _json(asdict(report.slurm)) if report.slurm is not None else None,
    }


def _memory_before(report: HostReport) -> str | None:
    """Each GPU's memory.used as the reset began (a dry run: as its survey read it); None when not read."""
    if report.memory_before_mib is not None:
        return _json(list(report.memory_before_mib))
    return _json(list(report.plan.gpu_memory_mib)) if report.plan is not None else None


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


# --- schema ----------------------------------------------------------------------------------------------------


def migrate(conn: sqlite3.Connection, path: Path, migrations: Sequence[Sequence[str]] = MIGRATIONS) -> int:
    """Bring the schema up to `len(migrations)`, each migration in its own transaction (another process may
    migrate at the same time: the version is read again under the write lock). The version it ends at."""
    known = len(migrations)
    while True:
        version = _user_version(conn)
        _refuse_newer(version, known, path)
        if version == known:
            return version
        with _transaction(conn):
            version = _user_version(conn)
            _refuse_newer(version, known, path)
            if version < known:
                for statement in migrations[version]:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {version + 1}")


def _until_unlocked(step: Callable[[], object], timeout_s: float) -> None:
    """step, tried again while SQLite says the database is locked, up to timeout_s.

    Switching a new file to WAL takes an exclusive lock without calling the busy handler: two processes
    creating one history at the same moment would otherwise fail one of them at once (seen in tests).
    """
    give_up, pause = time.monotonic() + timeout_s, 0.005
    while True:
        try:
            step()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= give_up:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def _user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _refuse_newer(version: int, known: int, path: Path) -> None:
    if version > known:
        raise HistoryError(f"{path}: written by a newer fleet (history schema {version}, fleet {__version__} knows"
                           f" up to {known}): upgrade fleet, or use another --log-dir")


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction, taken at once (BEGIN IMMEDIATE: waits for the lock up to the busy timeout
    instead of failing when a read would have to become a write)."""
    if conn.in_transaction:  # nested in a batch: the outer one commits
        yield
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # a failed COMMIT (disk full) leaves it open: never let a later write nest in it
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


# --- the store -------------------------------------------------------------------------------------------------

_HOST_COLUMNS = ("run_id", "host", "status", "reason", "error", "duration_s", "steps", "killed_count", "killed",
                 "memory_before_mib", "memory_after_mib", "settle_s", "health", "slurm", "ended_at")
_UPSERT_HOST = (
    f"INSERT INTO hosts ({', '.join(_HOST_COLUMNS)}) VALUES ({', '.join('?' for _ in _HOST_COLUMNS)})"
    " ON CONFLICT (run_id, host) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _HOST_COLUMNS if c not in ("run_id", "host", "ended_at"))
    + ", ended_at = coalesce(hosts.ended_at, excluded.ended_at)"
)
_RUN_COLUMNS = "run_id, command, targets, options, started_at, ended_at, exit_code, fleet_version, log_dir"
_HOST_SELECT = ", ".join(f"h.{c}" for c in _HOST_COLUMNS) + ", r.started_at, r.command"


class History:
    """The history database of one log folder; see the module docstring. A context manager."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.conn, self.path = conn, path

    @classmethod
    def open(cls, path: Path, *, busy_timeout_s: float = BUSY_TIMEOUT_S,
             migrations: Sequence[Sequence[str]] = MIGRATIONS) -> History:
        """Open (creating the file and its tables when missing) and bring the schema up to date."""
        try:
            conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise HistoryError(f"{path}: cannot open the history database: {exc}") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            _until_unlocked(lambda: conn.execute("PRAGMA journal_mode = WAL"), busy_timeout_s)
            conn.execute("PRAGMA synchronous = NORMAL")  # WAL: a commit survives the process, power cuts aside
            conn.execute("PRAGMA foreign_keys = ON")
            migrate(conn, path, migrations)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise HistoryError(f"{path}: cannot use the history database: {exc}") from None
        except BaseException:
            conn.close()
            raise
        return cls(conn, path)

    def __enter__(self) -> History:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self.conn.close()

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Several writes in one transaction (one wait for the lock, one commit)."""
        with _transaction(self.conn):
            yield

    # --- writes ---

    def start_run(self, run_id: str, command: str, hosts: Sequence[str], options: Mapping[str, Any],
                  started_at: str, fleet_version: str, log_dir: Path | str) -> None:
        with _transaction(self.conn):
            self.conn.execute(
                f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES (?, ?, ?, ?, ?, NULL, NULL, ?, ?)",
                (run_id, command, _json(list(hosts)), _json(dict(options)), started_at, fleet_version, str(log_dir)),
            )

    def record_host(self, run_id: str, report: HostReport, ended_at: str | None = None) -> None:
        """Insert or update one host's outcome; the first `ended_at` on record is kept."""
        values = {**host_values(report), "run_id": run_id, "ended_at": ended_at or now_stamp()}
        with _transaction(self.conn):
            self.conn.execute(_UPSERT_HOST, tuple(values[c] for c in _HOST_COLUMNS))

    def finish_run(self, run_id: str, ended_at: str, exit_code: int) -> None:
        with _transaction(self.conn):
            self.conn.execute("UPDATE runs SET ended_at = ?, exit_code = ? WHERE run_id = ?",
                              (ended_at, exit_code, run_id))

    def prune(self, keep_days: float, now: datetime) -> list[str]:
        """Delete the runs (and their hosts) that started more than `keep_days` ago; their ids, oldest first,
        for the caller to remove their log folders."""
        cutoff = stamp(now - timedelta(days=keep_days))
        with _transaction(self.conn):
            ids = [r[0] for r in self.conn.execute(
                "SELECT run_id FROM runs WHERE started_at < ? ORDER BY started_at, run_id", (cutoff,))]
            self.conn.execute("DELETE FROM hosts WHERE run_id IN (SELECT run_id FROM runs WHERE started_at < ?)",
                              (cutoff,))
            self.conn.execute("DELETE FROM runs WHERE started_at < ?", (cutoff,))
        return ids

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
            args.append(_json(names))
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
                " GROUP BY run_id, status", (_json(list(run_ids)),)):
            counts.setdefault(run_id, {})[status] = n
        return counts


def _run_row(row: Sequence[Any], counts: dict[str, int]) -> RunRow:
    run_id, command, targets, options, started, ended, code, version, log_dir = row
    return RunRow(run_id, command, tuple(json.loads(targets)), json.loads(options), started, ended, code, version,
                  log_dir, counts)


def _host_row(row: Sequence[Any]) -> HostRow:
    values = dict(zip((*_HOST_COLUMNS, "started_at", "command"), row, strict=True))
    for key in ("steps", "killed", "memory_before_mib", "memory_after_mib", "settle_s", "health", "slurm"):
        values[key] = _loads(values[key])
    return HostRow(**values)


# --- log folders -----------------------------------------------------------------------------------------------


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


# --- the run's writer ------------------------------------------------------------------------------------------

Op = Callable[[History], None]


class Recorder:
    """Writes one run's history from a thread of its own (see the module docstring). Every method returns at
    once; `close` waits, bounded, for what is queued. A failure is reported once through `warn`."""

    def __init__(self, path: Path, run_id: str, warn: Callable[[str], None]) -> None:
        self.path, self.run_id, self._warn = path, run_id, warn
        self._queue: queue.SimpleQueue[Op | None] = queue.SimpleQueue()
        self._warned = False
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="fleet-history", daemon=True)
        self._thread.start()

    def start_run(self, command: str, hosts: Sequence[str], options: Mapping[str, Any], started_at: str,
                  fleet_version: str, log_dir: Path) -> None:
        self._put(lambda h: h.start_run(self.run_id, command, hosts, options, started_at, fleet_version, log_dir))

    def host_ended(self, report: HostReport) -> None:
        """The hook a run calls as each host finishes (from the event loop: it only queues)."""
        ended_at = now_stamp()
        self._put(lambda h: h.record_host(self.run_id, report, ended_at))

    def finish_run(self, reports: Sequence[HostReport], exit_code: int) -> None:
        """Every host's final report (those that never started included), and the run's end."""
        ended_at = now_stamp()

        def finish(history: History) -> None:
            for report in reports:
                history.record_host(self.run_id, report, ended_at)
            history.finish_run(self.run_id, ended_at, exit_code)

        self._put(finish)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Wait up to `timeout_s` for the queued writes, then let the thread go (it is a daemon)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._warn_once(f"history of run {self.run_id} incomplete: {self.path} still busy after {timeout_s:g} s")

    def _put(self, op: Op) -> None:
        if not self._closed:
            self._queue.put(op)

    def _serve(self) -> None:
        try:
            history = History.open(self.path)
        except (HistoryError, OSError, sqlite3.Error) as exc:
            self._warn_once(f"run history not recorded: {exc}")
            while self._queue.get() is not None:  # drain until close
                pass
            return
        with history:
            carried: list[Op] = []
            done = False
            while not done:
                ops, done = self._next_batch()
                ops = carried + ops
                carried = []
                try:
                    with history.batch():
                        for op in ops:
                            op(history)
                except sqlite3.OperationalError as exc:  # locked past the timeout, disk full: tried again next time
                    self._warn_once(f"run history not fully recorded in {self.path}: {exc}")
                    carried = ops
                except Exception as exc:  # a bug here must not reach the run: it is only its history
                    self._warn_once(f"run history not fully recorded in {self.path}: {type(exc).__name__}: {exc}")

    def _next_batch(self) -> tuple[list[Op], bool]:
        """Everything queued now (at least one item): written in one transaction; True once close was asked."""
        ops: list[Op] = []
        item = self._queue.get()
        while True:
            if item is None:
                return ops, True
            ops.append(item)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return ops, False

    def _warn_once(self, line: str) -> None:
        if not self._warned:
            self._warned = True
            self._warn(" ".join(line.split()))
