"""The local Transport (`connection: local`): fleet's bounded commands run on this machine.

For a node that resets itself (from a timer, say). The same argv as over
SSH (`timeout -k K T argv...`, or `timeout -k K T sudo -n timeout -k K T argv...`
for a privileged command on a `become` host; see `fleet.transport.base.bounded_argv`)
is executed directly, without a shell, in a new session; on the client deadline, or when the caller is
cancelled, every process of that session is SIGKILLed and reaped.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Sequence

import anyio

from fleet.inventory.host import Host
from fleet.model.errors import CommandTimeout, ConnectError
from fleet.transport.base import (
    OUTPUT_LIMIT,
    RELEASE_TIMEOUT_S,
    CommandResult,
    Kept,
    OpenCommand,
    bounded_argv,
    client_deadline,
    finish,
    make_result,
)
from fleet.transport.plugs import TransportPlug
from fleet.transport.sessions import REAP_TIMEOUT_S, signal_session

_READ_CHUNK = 64 * 1024
_KEPT_BYTES = 4 * OUTPUT_LIMIT  # UTF-8 has at most 4 bytes a character


class _Output:
    """Bytes read from one pipe so far (kept when the command is cut short): the first _KEPT_BYTES, enough for
    OUTPUT_LIMIT characters of UTF-8; the rest read and counted, never kept (`Kept`)."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._room = _KEPT_BYTES
        self._dropped = 0

    async def pump(self, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        while chunk := await stream.read(_READ_CHUNK):
            keep = chunk[: self._room]
            if keep:
                self._chunks.append(keep)
                self._room -= len(keep)
            self._dropped += len(chunk) - len(keep)

    def text(self) -> Kept:
        kept = Kept()
        kept.add(b"".join(self._chunks).decode("utf-8", errors="replace"))
        kept.dropped += self._dropped
        return kept


class LocalTransport:
    """The Transport for `connection: local`: the bounded argv as a local process."""

    def __init__(self, host: Host) -> None:
        self._host = host

    async def __aenter__(self) -> LocalTransport:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def run(self, argv: Sequence[str], *, timeout: float, privileged: bool = False,
                  stdin: str | None = None) -> CommandResult:
        """Run argv locally (`stdin`: its whole stdin); CommandTimeout (with partial output) past the deadline."""
        started = time.monotonic()
        become = self._host.become and privileged
        proc = await self._spawn(bounded_argv(argv, timeout, become=become),
                                 stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE)
        if stdin is not None and proc.stdin is not None:
            proc.stdin.write(stdin.encode())
            _close_stdin(proc)
        out, err = _Output(), _Output()
        ended = await _collect(proc, out, err, client_deadline(timeout))
        result = _local_result(argv, proc, out.text(), err.text(), started)
        if not ended:
            raise CommandTimeout(result, timeout)
        return finish(result, self._host, timeout, become=become)

    async def open_command(self, argv: Sequence[str], *, timeout: float, privileged: bool = False) -> OpenCommand:
        """Start argv locally with stdin open; return at its first stdout line or its end (see `OpenCommand`)."""
        started = time.monotonic()
        become = self._host.become and privileged
        proc = await self._spawn(bounded_argv(argv, timeout, become=become), stdin=asyncio.subprocess.PIPE)
        out, err = _Output(), _Output()
        first = await _first_line(proc, out, err, client_deadline(timeout))
        if first is None:
            raise CommandTimeout(_local_result(argv, proc, "", err.text(), started), timeout)
        if first.endswith(b"\n"):
            return OpenCommand(_decode(first).rstrip("\n"),
                               release=lambda: _release(proc, argv, first, out, err, started))
        ended = await _collect(proc, out, err, client_deadline(timeout))  # no full line: it is ending
        result = _local_result(argv, proc, _with_first(first, out), err.text(), started)
        if not ended:
            raise CommandTimeout(result, timeout)
        return OpenCommand(_decode(first).strip(), finish(result, self._host, timeout, become=become))

    async def close(self) -> None:
        """Nothing stays open between commands."""

    async def _spawn(self, argv: Sequence[str], stdin: int = asyncio.subprocess.DEVNULL) -> asyncio.subprocess.Process:
        """Start argv in a new session; shielded, so a cancel never orphans it."""
        try:
            with anyio.CancelScope(shield=True):
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=stdin,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    start_new_session=True,
                )
        except OSError as exc:
            raise ConnectError(f"cannot start {argv[0]} on {self._host.name}: {exc.strerror or exc}") from exc
        return proc


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _with_first(first: bytes, out: _Output) -> Kept:
    """The first line read before, then the rest of stdout, kept as one stream."""
    rest = out.text()
    kept = Kept()
    kept.add(_decode(first) + rest.text)
    kept.dropped += rest.dropped
    return kept


def _local_result(argv: Sequence[str], proc: asyncio.subprocess.Process, out: str | Kept, err: str | Kept,
                  started: float) -> CommandResult:
    """The CommandResult of a local process: a negative return code is a signal."""
    code = proc.returncode
    status, sig = (code, None) if code is None or code >= 0 else (None, signal.Signals(-code).name)
    return make_result(argv, status, sig, out, err, started)


async def _first_line(proc: asyncio.subprocess.Process, out: _Output, err: _Output, seconds: float) -> bytes | None:
    """The first stdout line (without newline at EOF: the process ended), or None past `seconds`.

    On the deadline or a cancel the process's session is killed and reaped before this returns.
    """
    line: bytes | None = None
    try:
        with anyio.move_on_after(seconds):
            line = await proc.stdout.readline() if proc.stdout is not None else b""
    finally:
        if line is None:
            await _reap(proc, out, err, kill=True)
    return line


async def _collect(proc: asyncio.subprocess.Process, out: _Output, err: _Output, seconds: float) -> bool:
    """Read both pipes to their end and reap, within `seconds`; past it (or on a cancel) kill first.

    Whether the process ended by itself.
    """
    ended = False
    try:
        with anyio.move_on_after(seconds):
            await _pump(proc, out, err)
            ended = True
    finally:
        await _reap(proc, out, err, kill=not ended)
    return ended


async def _release(proc: asyncio.subprocess.Process, argv: Sequence[str], first: bytes, out: _Output,
                   err: _Output, started: float) -> CommandResult | None:
    """Close a held process's stdin and wait for it (bounded, shielded); None when it had to be killed."""
    ended = False
    with anyio.move_on_after(RELEASE_TIMEOUT_S, shield=True):
        _close_stdin(proc)
        await _pump(proc, out, err)
        ended = True
    if not ended:
        await _reap(proc, out, err, kill=True)
        return None
    return _local_result(argv, proc, _with_first(first, out), err.text(), started)


async def _pump(proc: asyncio.subprocess.Process, out: _Output, err: _Output) -> None:
    """Read both pipes to their end, then wait for the process."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(out.pump, proc.stdout)
        tg.start_soon(err.pump, proc.stderr)
    await proc.wait()


async def _reap(proc: asyncio.subprocess.Process, out: _Output, err: _Output, *, kill: bool) -> None:
    """Kill the session unless it ended by itself, then drain and reap: shielded, bounded."""
    with anyio.move_on_after(REAP_TIMEOUT_S, shield=True):
        _close_stdin(proc)
        if kill:
            signal_session(proc.pid)
        await _pump(proc, out, err)


def _close_stdin(proc: asyncio.subprocess.Process) -> None:
    """End the process's stdin (EOF for it), when it has a pipe there."""
    if proc.stdin is not None and not proc.stdin.is_closing():
        proc.stdin.close()


async def _open(host: Host) -> LocalTransport:
    return LocalTransport(host)


TRANSPORT = TransportPlug(open=_open, where=lambda host: "local")
