"""Per-node structured logs: `<log-dir>/<run_id>/<host>.jsonl`, one JSON object a line.

The run's folder also holds `running.lock`, which the run's fleet process keeps locked (flock) from the
folder's creation to its last log line: the kernel drops the lock when the process ends, however it
ends, so `run_liveness` tells a run in flight from one that is over (finished, or killed) on this machine.

No global logging configuration: every host gets its own logger (`fleet.runlog.jsonl.HostLogger`, the lines
structlog's chain would write) appending to that host's file. Each line carries `timestamp`, `level`, `event`,
`host`, `run_id` and, where there is one, `step`.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import secrets
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from fleet.model.errors import UsageError
from fleet.runlog.jsonl import HostLogger, Lines, write_line


def new_run_id(now: datetime | None = None) -> str:
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(3)}"


def default_log_dir(env: dict[str, str] | None = None) -> Path:
    """--log-dir, else $FLEET_LOG_DIR, else $XDG_STATE_HOME/fleet/runs."""
    env = dict(os.environ) if env is None else env
    if env.get("FLEET_LOG_DIR"):
        return Path(env["FLEET_LOG_DIR"])
    return _state(env) / "runs"


def demo_log_dir(env: dict[str, str] | None = None) -> Path:
    """`fleet demo`'s own folder, $XDG_STATE_HOME/fleet/demo ($FLEET_LOG_DIR not read): its simulated runs never
    enter the operator's history (`fleet runs`, `fleet show last`, `--rerun-failed`) or its log folders."""
    return _state(dict(os.environ) if env is None else env) / "demo"


def _state(env: dict[str, str]) -> Path:
    return Path(env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")) / "fleet"


RUNNING_LOCK = "running.lock"
SUMMARY = "summary.json"


class RunLiveness(StrEnum):
    """What this machine can tell of a run from its log folder (`run_liveness`)."""

    RUNNING = "running"  # its fleet process still holds running.lock
    OVER = "over"  # finished (summary.json), or its process is gone (the lock is free)
    UNKNOWN = "unknown"  # no such folder here (another controller, another --log-dir), or no lock file in it


def run_liveness(log_dir: Path, run_id: str) -> RunLiveness:
    """Whether the run `run_id`, logged under `log_dir`, is still running here; never guesses "over"."""
    folder = log_dir / run_id
    if (folder / SUMMARY).exists():
        return RunLiveness.OVER
    try:
        fd = os.open(folder / RUNNING_LOCK, os.O_RDONLY)
    except OSError:
        return RunLiveness.UNKNOWN
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return RunLiveness.RUNNING
    except OSError:
        return RunLiveness.UNKNOWN
    finally:
        os.close(fd)
    return RunLiveness.OVER


class RunLogs:
    """The log folder of one run; hands out one logger per host."""

    def __init__(self, log_dir: Path, run_id: str) -> None:
        self.run_id = run_id
        self.path = log_dir / run_id
        self._files: dict[str, io.FileIO] = {}
        self._running: int | None = None
        self._common = Lines()  # what its hosts' log lines have in common, made once for the run

    def create(self) -> None:
        """The run's folder, and its `running.lock` held (exclusive) until `close`."""
        try:
            self.path.mkdir(parents=True, exist_ok=False)
            self._running = os.open(self.path / RUNNING_LOCK, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            fcntl.flock(self._running, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            raise UsageError(f"cannot create log folder {self.path}: {exc.strerror}") from exc

    def host_logger(self, host: str) -> HostLogger:
        return HostLogger(self._file(host), host, self.run_id, self._common)

    def relay(self, host: str, record: dict[str, Any]) -> None:
        """Append an event a node logged itself (`--via srun`) to that host's log, as it was logged there."""
        write_line(self._file(host), json.dumps(record))

    def _file(self, host: str) -> io.FileIO:
        """The host's log, opened once (append, unbuffered: each line is on disk as soon as it is logged, even if
        the run dies)."""
        out = self._files.get(host)
        if out is None:
            out = self._files[host] = io.FileIO(self.path / f"{host}.jsonl", "a")
        return out

    def write_summary(self, text: str) -> Path:
        """summary.json (the report's JSON text), written whole or not at all (temp file + rename)."""
        target = self.path / SUMMARY
        tmp = target.with_suffix(".json.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(target)
        return target

    def close(self) -> None:
        for out in self._files.values():
            out.close()
        self._files.clear()
        if self._running is not None:
            os.close(self._running)  # the lock goes with it
            self._running = None
