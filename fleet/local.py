"""Run fleet's bounded commands on this machine (`connection: local`).

For a node that resets itself (from a timer, say). The same argv as over
SSH (`[sudo -n] timeout -k K T argv...`) is executed directly, without a
shell, in a new session; on the client deadline, or when the caller is
cancelled, every process of that session is SIGKILLed and reaped.

The helpers that end a whole session and turn a finished command into a
`CommandResult` (or an exception) are shared with `fleet.ssh` and the
simulated SSH server.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

import anyio

from fleet.errors import AuthError, CommandTimeout, ConnectError
from fleet.models import Host
from fleet.transport import TIMEOUT_EXIT_STATUSES, CommandResult, bounded_argv, client_deadline, clip

# Seconds allowed for a killed process to be reaped and its pipes drained.
REAP_TIMEOUT_S = 5.0
_READ_CHUNK = 64 * 1024
_SUDO_NEEDS_PASSWORD = "a password is required"


def session_members(sid: int) -> list[int]:
    """Pids of the live (non-zombie) processes in session `sid` (Linux /proc)."""
    with os.scandir("/proc") as entries:
        return [int(e.name) for e in entries if e.name.isdigit() and _session_of(e.path) == sid]


def _session_of(proc_dir: str) -> int | None:
    """The session id of the process at /proc/PID; None for a zombie or a vanished pid."""
    try:
        fields = Path(proc_dir, "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[3])


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


def signal_label(name: str | None) -> str | None:
    """`KILL` or `SIGKILL` -> `SIGKILL`; None stays None."""
    if not name:
        return None
    return name if name.startswith("SIG") else f"SIG{name}"


def finish(result: CommandResult, host: Host, timeout: float) -> CommandResult:
    """Raise for what the node's bounds say was no answer; else the result as data."""
    if result.exit_status in TIMEOUT_EXIT_STATUSES:
        raise CommandTimeout(result, timeout)
    if host.become and result.exit_status != 0 and _SUDO_NEEDS_PASSWORD in result.stderr:
        raise AuthError(f"sudo -n needs a password on {host.name}")
    return result


def make_result(
    argv: Sequence[str], status: int | None, signal_name: str | None, out: str, err: str, started: float
) -> CommandResult:
    """A CommandResult with both streams clipped and the duration measured."""
    return CommandResult(
        argv=tuple(argv),
        exit_status=status,
        stdout=clip(out),
        stderr=clip(err),
        duration_s=round(time.monotonic() - started, 3),
        signal=signal_label(signal_name),
    )


class _Output:
    """Bytes read from one pipe so far; kept when the command is cut short."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []

    async def pump(self, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        while chunk := await stream.read(_READ_CHUNK):
            self._chunks.append(chunk)

    def text(self) -> str:
        return b"".join(self._chunks).decode("utf-8", errors="replace")


class LocalTransport:
    """The Transport for `connection: local`: the bounded argv as a local process."""

    def __init__(self, host: Host) -> None:
        self._host = host

    async def __aenter__(self) -> LocalTransport:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        """Run argv locally; CommandTimeout (with partial output) past the deadline."""
        started = time.monotonic()
        proc = await self._spawn(bounded_argv(argv, timeout, become=self._host.become))
        out, err = _Output(), _Output()
        ended = False
        try:
            with anyio.move_on_after(client_deadline(timeout)) as deadline:
                await _pump(proc, out, err)
                ended = True
        finally:
            await _reap(proc, out, err, kill=not ended)
        code = proc.returncode
        status, sig = (code, None) if code is None or code >= 0 else (None, signal.Signals(-code).name)
        result = make_result(argv, status, sig, out.text(), err.text(), started)
        if deadline.cancelled_caught:
            raise CommandTimeout(result, timeout)
        return finish(result, self._host, timeout)

    async def close(self) -> None:
        """Nothing stays open between commands."""

    async def _spawn(self, argv: Sequence[str]) -> asyncio.subprocess.Process:
        """Start argv in a new session; shielded, so a cancel never orphans it."""
        try:
            with anyio.CancelScope(shield=True):
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    start_new_session=True,
                )
        except OSError as exc:
            raise ConnectError(f"cannot start {argv[0]} on {self._host.name}: {exc.strerror or exc}") from exc
        return proc


async def _pump(proc: asyncio.subprocess.Process, out: _Output, err: _Output) -> None:
    """Read both pipes to their end, then wait for the process."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(out.pump, proc.stdout)
        tg.start_soon(err.pump, proc.stderr)
    await proc.wait()


async def _reap(proc: asyncio.subprocess.Process, out: _Output, err: _Output, *, kill: bool) -> None:
    """Kill the session unless it ended by itself, then drain and reap: shielded, bounded."""
    with anyio.move_on_after(REAP_TIMEOUT_S, shield=True):
        if kill:
            signal_session(proc.pid)
        await _pump(proc, out, err)
