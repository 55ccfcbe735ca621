"""The history file's format: its tables, how times and lists are written in them, its schema version, and
opening it (creating the file and bringing its schema up to date).

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
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path

from fleet.model.codec import json_writer
from fleet.model.errors import UsageError
from fleet.version import __version__

HISTORY_FILE = "history.sqlite"
BUSY_TIMEOUT_S = 10.0

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
    (  # 2: each GPU's settings as verify read them (the rack compared, in the history too)
        "ALTER TABLE hosts ADD COLUMN settings TEXT",  # JSON [{model, driver, ...} or null per GPU]; null: no GPU
    ),
    (  # 3: the node's fabric manager as verify read it (compared by its version, in the history too)
        "ALTER TABLE hosts ADD COLUMN fabric_manager TEXT",  # JSON {state, version, why}; null: not read
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


_COMPACT = json_writer(",", ":")  # json.dumps', its encoder made once instead of each call


def json_text(value: object) -> str:
    """The one format every JSON column has (compact)."""
    return _COMPACT(value)


def open_database(path: Path, *, busy_timeout_s: float = BUSY_TIMEOUT_S,
                  migrations: Sequence[Sequence[str]] = MIGRATIONS) -> sqlite3.Connection:
    """A connection to the history at `path` (creating the file and its tables when missing), in WAL mode, its
    schema brought up to date; anything SQLite refuses is a HistoryError naming the file."""
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
    return conn


def migrate(conn: sqlite3.Connection, path: Path, migrations: Sequence[Sequence[str]] = MIGRATIONS) -> int:
    """Bring the schema up to `len(migrations)`, each migration in its own transaction (another process may
    migrate at the same time: the version is read again under the write lock). The version it ends at."""
    known = len(migrations)
    while True:
        version = _user_version(conn)
        _refuse_newer(version, known, path)
        if version == known:
            return version
        with transaction(conn):
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
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
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
