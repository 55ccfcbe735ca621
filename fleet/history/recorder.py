"""`Recorder` is how a run writes its history: from a thread of its own, so that the run's event loop never waits
on the database, and so that a history that cannot be written (disk full, locked past the timeout, a newer
schema) is one warning line, never the run's failure.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.history.schema import BUSY_TIMEOUT_S, HistoryError, now_stamp
from fleet.history.store import History
from fleet.model.report import HostReport

# Seconds a run waits, at its end, for its last history writes (a lock held past the busy timeout included).
CLOSE_TIMEOUT_S = BUSY_TIMEOUT_S + 5.0
# Seconds the writer lets writes gather after the first one it is woken for, before it writes them all in one
# transaction: hosts that end together cost one commit, not one each (and the run's loop one wake-up of the
# thread, not one a host). A host is on record at most this much later than it ended. The run's start is written
# at once, never gathered: a run killed in its first moments is still on record (unfinished).
GATHER_S = 0.2

Op = Callable[[History], None]


@dataclass(frozen=True)
class _Ended:
    """A host that ended, and when: queued as it is, so that the writer records the hosts of a batch together."""

    report: HostReport
    ended_at: str


class Recorder:
    """Writes one run's history from a thread of its own (see the module docstring). Every method returns at
    once; `close` waits, bounded, for what is queued. A failure is reported once through `warn`."""

    def __init__(self, path: Path, run_id: str, warn: Callable[[str], None], gather_s: float = GATHER_S) -> None:
        self.path, self.run_id, self._warn, self._gather_s = path, run_id, warn, gather_s
        self._queue: queue.SimpleQueue[Op | _Ended | None] = queue.SimpleQueue()
        self._warned = False
        self._closed = False
        self._ended: dict[str, HostReport] = {}  # each host's report as `host_ended` queued it
        self._gathering = False  # the first write (the run's start) is not gathered
        self._thread = threading.Thread(target=self._serve, name="fleet-history", daemon=True)
        self._thread.start()

    def start_run(self, command: str, hosts: Sequence[str], options: Mapping[str, Any], started_at: str,
                  fleet_version: str, log_dir: Path) -> None:
        self._put(lambda h: h.start_run(self.run_id, command, hosts, options, started_at, fleet_version, log_dir))

    def host_ended(self, report: HostReport) -> None:
        """The hook a run calls as each host finishes (from the event loop: it only queues)."""
        self._ended[report.name] = report
        self._put(_Ended(report, now_stamp()))

    def finish_run(self, reports: Sequence[HostReport], exit_code: int) -> None:
        """Every host's final report (those that never started included), and the run's end. A host whose
        report is the one `host_ended` queued is not written again: the same values, and its first `ended_at`
        is kept either way (reports are frozen, all the way down). The host's start in the run (`start_s`), which
        only the final report has, is not in its row: a report that differs only in it is the same row."""
        ended_at = now_stamp()
        changed = [report for report in reports if not self._written(report)]

        def finish(history: History) -> None:
            history.record_hosts(self.run_id, [(report, ended_at) for report in changed])
            history.finish_run(self.run_id, ended_at, exit_code)

        self._put(finish)

    def _written(self, report: HostReport) -> bool:
        """Whether `host_ended` queued this host's row as `report` would write it: every field the same but the
        start (`ended == replace(report, start_s=ended.start_s)`, without building that report)."""
        ended = self._ended.get(report.name)
        return ended is report or (ended is not None and but_start(ended) == but_start(report))

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Wait up to `timeout_s` for the queued writes, then let the thread go (it is a daemon)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._warn_once(f"history of run {self.run_id} incomplete: {self.path} still busy after {timeout_s:g} s")

    def _put(self, op: Op | _Ended) -> None:
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
            carried: list[Op | _Ended] = []
            done = False
            while not done:
                ops, done = self._next_batch()
                ops = carried + ops
                carried = []
                try:
                    self._write(history, ops)
                except sqlite3.OperationalError as exc:  # locked past the timeout, disk full: tried again next time
                    self._warn_once(f"run history not fully recorded in {self.path}: {exc}")
                    carried = ops
                except Exception as exc:  # a bug here must not reach the run: it is only its history
                    self._warn_once(f"run history not fully recorded in {self.path}: {type(exc).__name__}: {exc}")

    def _write(self, history: History, ops: list[Op | _Ended]) -> None:
        """The ops in order, in one transaction; hosts that ended one after another in one `record_hosts` (a
        statement for a few dozen of them)."""
        ended: list[tuple[HostReport, str]] = []
        with history.batch():
            for op in ops:
                if isinstance(op, _Ended):
                    ended.append((op.report, op.ended_at))
                    continue
                if ended:
                    history.record_hosts(self.run_id, ended)
                    ended = []
                op(history)
            if ended:
                history.record_hosts(self.run_id, ended)

    def _next_batch(self) -> tuple[list[Op | _Ended], bool]:
        """Everything queued within `gather_s` of the first item (at least one item): written in one transaction;
        True once close was asked (a close asked during the pause waits for its end, at most `gather_s`)."""
        ops: list[Op | _Ended] = []
        item = self._queue.get()
        if item is not None and not self._closed and self._gathering:
            self._pause()
        self._gathering = True
        while True:
            if item is None:
                return ops, True
            ops.append(item)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return ops, False

    def _pause(self) -> None:
        time.sleep(self._gather_s)

    def _warn_once(self, line: str) -> None:
        if not self._warned:
            self._warned = True
            self._warn(" ".join(line.split()))


def but_start(report: HostReport) -> dict[str, Any]:
    """The report's fields (a frozen dataclass's attributes) but its start in the run (`start_s`)."""
    return {name: value for name, value in vars(report).items() if name != "start_s"}
