"""Run history: every run and every host's outcome in one SQLite file, `<log-dir>/history.sqlite` (stdlib only).

    schema.py     the file's format: its tables, times and JSON columns, `MIGRATIONS` and `PRAGMA user_version`,
                  opening it (WAL, the busy timeout; a file from a newer fleet refused, never rewritten)
    rows.py       what it holds, as Python: `RunRow`, `HostRow`, `RunRecord`, `RunKind`; a host's report as
                  its row and back (pure)
    store.py      `History`: the writes a run makes, the queries `fleet runs`/`fleet show`/`--rerun-failed` make
    recorder.py   `Recorder`: a run's writes from a thread of its own, never the run's failure
    retention.py  `--keep-days`: old records and run folders removed, only when asked
    archive.py    the runs on disk: what `fleet runs` and `fleet show` print, a past run's page
    rerun.py      `--rerun-failed`: the hosts a past run left failed
    view.py       the lines `fleet runs` and `fleet show` print from the records (pure)

The names other modules use are importable from here.
"""

from fleet.history.recorder import CLOSE_TIMEOUT_S, Recorder
from fleet.history.retention import (
    RUN_ID,
    newest_folders,
    prune_runs,
    remove_folders,
    run_id_time,
    stale_folders,
)
from fleet.history.rows import (
    DEMO,
    HostRow,
    Liveness,
    RunKind,
    RunRecord,
    RunRow,
    host_from_row,
    host_values,
    liveness,
    not_clean,
    run_kind,
)
from fleet.history.schema import (
    BUSY_TIMEOUT_S,
    HISTORY_FILE,
    MIGRATIONS,
    HistoryError,
    history_path,
    migrate,
    now_stamp,
    parse_stamp,
    stamp,
)
from fleet.history.store import RERUN_STATUSES, UNFINISHED, History

__all__ = [
    "BUSY_TIMEOUT_S",
    "CLOSE_TIMEOUT_S",
    "DEMO",
    "HISTORY_FILE",
    "MIGRATIONS",
    "RERUN_STATUSES",
    "RUN_ID",
    "UNFINISHED",
    "History",
    "HistoryError",
    "HostRow",
    "Liveness",
    "Recorder",
    "RunKind",
    "RunRecord",
    "RunRow",
    "history_path",
    "host_from_row",
    "host_values",
    "liveness",
    "migrate",
    "newest_folders",
    "not_clean",
    "now_stamp",
    "parse_stamp",
    "prune_runs",
    "remove_folders",
    "run_id_time",
    "run_kind",
    "stale_folders",
    "stamp",
]
