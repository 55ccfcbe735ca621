"""The SSH Transport: one asyncssh connection per host, reused for every command.

asyncssh's errors are mapped once, here: while connecting to `ConnectError`,
`AuthError` or `HostKeyError`; while a command runs to `ConnectionLost`.

It connects as the user's own `ssh` would. What the inventory leaves unset
(`port`, `user`) comes from ssh_config (`~/.ssh/config`, which asyncssh reads),
else from ssh's defaults. Host keys are always checked; there is no way to turn
that off. known_hosts is read as OpenSSH reads it: the file `known_hosts` names,
else every default file that exists (the user's and the system's); a line that
cannot be parsed is skipped (the transport's `notes` name those lines, for the
host's log once) and the rest is used; no usable line at all is a HostKeyError.
An `identity_file` with a passphrase is left to ssh-agent's keys, or, with no
agent, fails the host at once. Hosts that ssh_config puts behind one jump host
(a single-hop `ProxyJump`) share one connection to it (`SharedJump`).

A session that stops answering at the SSH level (TCP up, nothing answers: a
flaky switch, a wedged node) is noticed once, and marks the transport dead
with `SessionSilent`. Silence is decided from the session, never from one
wait's length (`fleet.transport.liveness`): a wait that lasts a couple of
seconds asks the server with SSH keepalive requests, and only a request left
unanswered for `silence_s` of the controller's attention is silence (a command's client
deadline is on the same clock, `fleet.transport.attention`: the seconds the controller's event loop was held
are never the node's). A slow
session that answers is waited for: its channel opens when its server gets to
it, its command ends when the node's `timeout` ends it (a CommandTimeout then
says the node is slow, not gone). From then on every command raises it at
once without touching the wire and `close()` aborts the connection. On a
cancel (Ctrl-C, `--deadline`) every shielded wait here (the open, the reap,
the release, the close) is bounded by a few seconds, so an interrupt ends a
run within seconds whatever it is waiting on.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from typing import TypeVar

import anyio

from fleet.inventory.host import Host
from fleet.model.errors import (
    CommandTimeout,
    ConnectionLost,
    SessionSilent,
)
from fleet.transport import attention, liveness, reap
from fleet.transport.base import (
    RELEASE_TIMEOUT_S,
    CommandResult,
    Kept,
    Note,
    OpenCommand,
    bounded_argv,
    client_deadline,
    command_line,
    finish,
    make_result,
)
from fleet.transport.ssh.asyncssh_quiet import asyncssh
from fleet.transport.ssh.dial import admission_notes, dial
from fleet.transport.ssh.jumps import SharedJump, close_connection, lease
from fleet.transport.ssh.known_hosts import known_hosts
from fleet.transport.ssh.options import connect_errors, connect_options, session_errors
from fleet.transport.ssh.routing import route

# Seconds to find and end an interrupted or overdue command on the node (and, on a cancel, for a channel being
# opened to be confirmed so that its command can be ended); an interrupted one with no answer by then is silent.
REAP_TIMEOUT_S = 3.0
# Seconds each of the reap's two commands (find, kill) may take on the node: they answer within REAP_TIMEOUT_S.
REAP_COMMAND_S = 1.0
# Characters read from a stream at a time (asyncssh keeps at most its window, 2 MiB, unread on the channel).
READ_CHUNK = 64 * 1024

_Process = asyncssh.SSHClientProcess[str]
T = TypeVar("T")

async def open_ssh(host: Host) -> SshTransport:
    """Open the one SSH connection to host that all of its commands share (through its jump host's shared
    connection when ssh_config gives it a single-hop ProxyJump). Its handshake waits for admission (`admission`)
    and has connect_timeout of the controller's attention (`dial`)."""
    with connect_errors(host):
        known = known_hosts(host)
        options = connect_options(host, known)
        where = route(host)
    agent = bool(host.identity_file) and "client_keys" not in options
    hint = f" (identity_file {host.identity_file} is encrypted: the ssh-agent's keys were offered; ssh-add it)" \
        if agent else ""
    jump = where.jump
    if jump is None:
        with connect_errors(host, where, hint=hint):
            conn, admitted = await dial(host, where, options)
        return SshTransport(host, conn, known.notes() + admission_notes(admitted))
    shared = await lease(host, jump, known, where)
    try:
        with connect_errors(host, where, hint=hint):
            async with shared.handshakes:
                conn, admitted = await dial(host, where, options, tunnel=shared.conn)
    except BaseException:
        await shared.release()
        raise
    return SshTransport(host, conn, known.notes() + admission_notes(admitted), jump=shared)


class SshTransport:
    """The Transport over one asyncssh connection; see `fleet.transport.base`.

    `notes`: what the host's log should say once about connecting (known_hosts lines skipped).
    `silent`: whether the session went silent (see the module docstring); nothing is sent on it then.
    `jump`: the shared jump host connection it tunnels through, released on close.
    """

    def __init__(self, host: Host, conn: asyncssh.SSHClientConnection, notes: tuple[Note, ...] = (),
                 jump: SharedJump | None = None) -> None:
        self._host = host
        self._conn = conn
        self._jump = jump
        self._closed = False
        self._silence_s = liveness.silence_s(host.connect_timeout)
        self.notes = notes
        self.silent = False

    async def __aenter__(self) -> SshTransport:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def run(self, argv: Sequence[str], *, timeout: float, privileged: bool = False,
                  stdin: str | None = None) -> CommandResult:
        """Run argv on the host; CommandTimeout (with partial output) past its bounds.

        Cancelled (Ctrl-C, run deadline) while the command runs: the command is found
        by its marker and SIGKILLed on the node before the cancel propagates.
        SessionSilent when the session stops answering (see the module docstring).
        """
        self._check_alive()
        become = self._host.become and privileged
        token = secrets.token_hex(8)
        line = command_line(bounded_argv(argv, timeout, become=become, mark=reap.marker(token)))
        started = time.monotonic()
        deadline = attention.loop_clock().now() + client_deadline(timeout)
        with session_errors(self._host):
            process = await self._open(line, deadline, (token, become),
                                       stdin=asyncssh.DEVNULL if stdin is None else asyncssh.PIPE)
            if process is None:  # the session answers, but opened no channel by the deadline: a slow node
                raise CommandTimeout(make_result(argv, None, None, "", "", started), timeout)
            if stdin is not None:
                _feed(process, stdin)
            try:
                output, timed_out = await self._communicate(process, deadline)
            except anyio.get_cancelled_exc_class():
                await self._reap(token, become, cancelled=True)
                raise
            if timed_out:  # the session answers, but the node's bound did not end it in time: end it there
                await self._reap(token, become)
        result = _result(argv, process, output, started)
        if timed_out:
            self._check_alive()
            raise CommandTimeout(result, timeout)
        self._check_ended(result)
        return finish(result, self._host, timeout, become=become)

    async def open_command(self, argv: Sequence[str], *, timeout: float, privileged: bool = False) -> OpenCommand:
        """Start argv with stdin open; return at its first stdout line or its end (see `OpenCommand`).

        With OpenSSH, closing the channel does not end the remote command; EOF on
        its stdin (release, or sshd closing the pipes when this client is gone) does.
        """
        self._check_alive()
        become = self._host.become and privileged
        line = command_line(bounded_argv(argv, timeout, become=become))
        started = time.monotonic()
        deadline = attention.loop_clock().now() + client_deadline(timeout)
        with session_errors(self._host):
            process = await self._open(line, deadline, None, stdin=asyncssh.PIPE)
            first = None if process is None else await self._first_line(process, deadline)
            if process is None or first is None:
                output = ("", "") if process is None else process.collect_output()
                raise CommandTimeout(make_result(argv, None, None, *output, started), timeout)
            if first.endswith("\n"):
                return OpenCommand(first.rstrip("\n"), release=lambda: self._release(process, argv, first, started))
            ending, timed_out = await self._communicate(process, deadline, first)  # no full line: it is ending
        result = _result(argv, process, ending, started)
        if timed_out:
            raise CommandTimeout(result, timeout)
        self._check_ended(result)
        return OpenCommand(first.strip(), finish(result, self._host, timeout, become=become))

    async def close(self) -> None:
        """Close the connection and wait for it: idempotent, shielded, bounded; a silent one is aborted at once.

        Then its jump host's connection is released: the last host behind it closes it (aborts it, when silent).
        """
        if self._closed:
            return
        self._closed = True
        try:
            await close_connection(self._conn, abort=self.silent)
        finally:
            if self._jump is not None:
                await self._jump.release(abort=self.silent)

    def _check_alive(self) -> None:
        """SessionSilent, without touching the wire, once the session has gone silent."""
        if self.silent:
            raise SessionSilent(self._host.name)

    def _check_ended(self, result: CommandResult) -> None:
        """ConnectionLost when the channel closed without an exit status or signal."""
        if result.exit_status is None and result.signal is None:
            raise ConnectionLost(f"session to {self._host.name} closed before the command ended")

    async def _answer(self, wait: Callable[[], Awaitable[T]], deadline: float) -> T | None:
        """wait()'s result, or None once deadline has passed while the session still answers (then, while it
        keeps answering, up to silence_s more: slow is not silent); SessionSilent once it stops answering.

        wait is called again after each look at the session: it must be safe to cancel and call again.
        """
        clock = attention.loop_clock()
        with attention.move_on_at(min(deadline, clock.now() + liveness.PROBE_AFTER_S)):
            return await wait()  # the common case: no request, no timer beyond this one
        end = deadline + self._silence_s
        with liveness.Pinger(self._conn, self._silence_s) as pinger:
            while (now := clock.now()) < end or not pinger.answered:
                look = now + liveness.PROBE_EVERY_S
                with attention.move_on_at(min(look, end) if now < end else look):
                    return await wait()
                if pinger.silent():
                    self.silent = True
                    raise SessionSilent(self._host.name)
        return None

    async def _open(self, line: str, deadline: float, reap_as: tuple[str, bool] | None,
                    stdin: int = asyncssh.DEVNULL) -> _Process | None:
        """Start line in a new channel; None when the session answers but confirms no channel by the deadline.

        Cancelled while the channel is being opened: it is still waited for (shielded, REAP_TIMEOUT_S at most)
        so that the command it started is ended by `reap_as` (token, become) and never orphaned.
        """
        opening = asyncio.ensure_future(
            self._conn.create_process(line, stdin=stdin, encoding="utf-8", errors="replace"))
        try:
            process = await self._answer(lambda: asyncio.shield(opening), deadline)
        except BaseException as exc:
            await self._abandon_opening(opening, reap_as, cancelled=isinstance(exc, anyio.get_cancelled_exc_class()))
            raise
        if process is None:
            await self._abandon_opening(opening, reap_as, cancelled=False)
        return process

    async def _abandon_opening(self, opening: asyncio.Future[_Process], reap_as: tuple[str, bool] | None, *,
                               cancelled: bool) -> None:
        """End a channel open that was given up: wait for it a little, then end its command (or the open).
        `cancelled`: given up for a cancel (then a reap with no answer marks the session silent)."""
        if not self.silent:
            with anyio.move_on_after(REAP_TIMEOUT_S, shield=True), suppress(asyncssh.Error, OSError):
                await asyncio.shield(opening)
        if not opening.done():
            opening.cancel()
            return
        if opening.cancelled() or opening.exception() is not None:
            return
        _abandon(opening.result())
        if reap_as is not None:
            await self._reap(*reap_as, cancelled=cancelled)

    async def _communicate(self, process: _Process, deadline: float,
                           first: str = "") -> tuple[tuple[Kept, Kept], bool]:
        """Both streams until the channel closes, or what arrived by the deadline: (output, timed_out). Each is read
        as it arrives and kept up to OUTPUT_LIMIT (`Kept`): past it, what the node prints is read and dropped.

        A channel that did not close by itself (a deadline, a cancel, silence) is ended on the way out. `first`: what
        was read of stdout already.
        """
        output = (Kept(), Kept())
        output[0].add(first)
        reading = asyncio.ensure_future(_read(process, *output))
        closed = False
        try:
            closed = await self._answer(lambda: asyncio.shield(reading), deadline) is not None
        finally:
            if not closed:
                reading.cancel()
                _abandon(process)
        return output, not closed

    async def _first_line(self, process: _Process, deadline: float) -> str | None:
        """Its first stdout line ('' or partial at EOF), or None past the deadline; ended unless it answered."""
        reading = asyncio.ensure_future(process.stdout.readline())
        line: str | None = None
        try:
            line = await self._answer(lambda: asyncio.shield(reading), deadline)
        finally:
            if line is None:
                reading.cancel()
                _abandon(process)
        return line

    async def _release(self, process: _Process, argv: Sequence[str], first: str,
                       started: float) -> CommandResult | None:
        """EOF on a held command's stdin, then wait for its end (bounded, shielded); None when it had to be ended.

        SessionSilent at once on a silent session (its holder's stdin ends with the connection).
        """
        self._check_alive()
        output = (Kept(), Kept())
        output[0].add(first)
        ended = False
        with anyio.move_on_after(RELEASE_TIMEOUT_S, shield=True):
            with suppress(OSError, asyncssh.Error):
                process.stdin.write_eof()
            with suppress(OSError, asyncssh.Error):
                ended = await _read(process, *output)
        _abandon(process)
        if not ended:
            return None
        return _result(argv, process, output, started)

    async def _reap(self, token: str, become: bool, *, cancelled: bool = False) -> None:
        """End an interrupted or overdue command on the node (OpenSSH does not when its channel closes).

        Shielded, bounded by REAP_TIMEOUT_S. Interrupted with no answer by then: the session counts as silent
        (its close aborts at once). Overdue on a session that answered: slow, not silent; the node's own
        `timeout` ends the command there. Nothing is tried on a session already silent.
        """
        if self.silent:
            return
        with anyio.move_on_after(REAP_TIMEOUT_S, shield=True) as waited, suppress(asyncssh.Error, OSError):
            found = await self._conn.run(
                command_line(bounded_argv(reap.find_marked_argv(token), REAP_COMMAND_S, become=become)), check=False
            )
            pids = reap.parse_marked(str(found.stdout or ""))
            if pids:
                kill = ["kill", "-s", "KILL", "--", *map(str, pids)]
                await self._conn.run(command_line(bounded_argv(kill, REAP_COMMAND_S, become=become)), check=False)
        self.silent = cancelled and waited.cancelled_caught


async def _read(process: _Process, out: Kept, err: Kept) -> bool:
    """Read both streams as they arrive into `out` and `err`, then wait for the channel's close: True."""
    async def pump(stream: asyncssh.SSHReader[str], into: Kept) -> None:
        while chunk := await stream.read(READ_CHUNK):
            into.add(chunk)

    await asyncio.gather(pump(process.stdout, out), pump(process.stderr, err))
    await process.wait_closed()
    return True


def _result(argv: Sequence[str], process: _Process, output: tuple[str | Kept, str | Kept],
            started: float) -> CommandResult:
    out, err = output
    signal_info = process.exit_signal  # when set, asyncssh reports exit_status -1
    if signal_info:
        return make_result(argv, None, signal_info[0], out, err, started)
    return make_result(argv, process.exit_status, None, out, err, started)


def _feed(process: _Process, data: str) -> None:
    """Write a command's whole stdin and its EOF (buffered by the channel: never waits)."""
    with suppress(OSError, asyncssh.Error):
        process.stdin.write(data)
        process.stdin.write_eof()


def _abandon(process: _Process) -> None:
    """End a channel whose command may still run: KILL it (where the server honours that) and close it.

    Not waited for: OpenSSH confirms the close only once the command's output ends, which an
    interrupted command's does when the reap has ended it (or its own `timeout` has).
    """
    if process.exit_status is None:
        with suppress(OSError, asyncssh.Error):
            process.send_signal("KILL")
    process.close()

