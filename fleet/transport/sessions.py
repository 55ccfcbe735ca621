"""Ending a whole local process session (Linux /proc): every process in it, not just its group.

Used by `fleet.transport.local` and by the simulated node's SSH server (`fleet.sim.server`),
which both start each command in a session of its own.
"""

from __future__ import annotations

import os
import signal
from contextlib import suppress
from pathlib import Path

# Seconds allowed for a killed process to be reaped and its pipes drained.
REAP_TIMEOUT_S = 5.0


def session_members(sid: int) -> list[int]:
    """Pids of the live (non-zombie) processes in session `sid` (Linux /proc)."""
    with os.scandir("/proc") as entries:
        return [int(e.name) for e in entries if e.name.isdigit() and _session_of(e.path) == sid]


def _session_of(proc_dir: str) -> int | None:
    """The session id of the process at /proc/PID; None for a zombie or a vanished pid. Read as bytes: the
    process's name (its comm, before the last `)`) is any bytes another user chose."""
    try:
        fields = Path(proc_dir, "stat").read_bytes().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == b"Z" else int(fields[3])


def signal_session(sid: int, signum: int = signal.SIGKILL) -> None:
    """Send `signum` to every process of session `sid`, its process group first.

    A session, not just a group: coreutils' `timeout` moves itself into a
    group of its own when it is not the session leader.
    """
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, signum)
    for _ in range(2):  # twice: catch children forked while the first pass ran
        for pid in session_members(sid):
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
