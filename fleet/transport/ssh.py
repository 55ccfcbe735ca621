"""The SSH Transport: one asyncssh connection per host, reused for every command.

asyncssh's errors are mapped once, here: while connecting to `ConnectError`,
`AuthError` or `HostKeyError`; while a command runs to `ConnectionLost`.
Host keys are always checked against known_hosts; there is no way to turn
that off. known_hosts is read as OpenSSH reads it: a line that cannot be parsed
is skipped (the transport's `notes` name those lines, for the host's log once)
and the rest is used; a file with no usable line is a HostKeyError.

A session that stops answering at the SSH level (TCP up, nothing answers: a
flaky switch, a wedged node) is noticed once, and marks the transport dead
with `SessionSilent`: a channel not confirmed within the open bound
(OPEN_TIMEOUT_S, at most connect_timeout), or a command still open at its
client deadline (the node's `timeout` would have ended it and sent its exit
status long before: a hung nvidia-smi still answers, CommandTimeout) or
interrupted, when the reap that ends it on the node gets no answer within
REAP_TIMEOUT_S either. From then on every command raises it at once without
touching the wire and `close()` aborts the connection. Every shielded wait here
(open, reap, release, close) is bounded by a few seconds, so an interrupt ends
a run within seconds whatever it is waiting on.
"""

from __future__ import annotations

import secrets
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, cast

import anyio
import asyncssh

from fleet.errors import AuthError, CommandTimeout, ConnectError, ConnectionLost, HostKeyError, SessionSilent
from fleet.inventory.host import DEFAULT_KNOWN_HOSTS, Host
from fleet.transport import reap
from fleet.transport.base import (
    RELEASE_TIMEOUT_S,
    CommandResult,
    Held,
    Note,
    bounded_argv,
    client_deadline,
    command_line,
    finish,
    make_result,
)

# No SSH keepalives: every command has a client deadline (fleet.transport.base.client_deadline) and connecting
# has connect_timeout, so a host that stalls is dropped by those. asyncssh re-arms its keepalive timer on
# every packet received: at 512 hosts that timer churn was a fifth of the controller's CPU (py-spy).

# Seconds allowed for a connection to close cleanly (then it is aborted).
CLOSE_TIMEOUT_S = 3.0
# Seconds a new channel may take to be confirmed and its command started (at most the host's
# connect_timeout); past that the session is silent. Not the command's deadline: the lock's is minutes.
OPEN_TIMEOUT_S = 5.0
# Seconds to find and end an interrupted or overdue command on the node; no answer by then: the session is silent.
REAP_TIMEOUT_S = 3.0
# Seconds each of the reap's two commands (find, kill) may take on the node: they answer within REAP_TIMEOUT_S.
REAP_COMMAND_S = 1.0
# Extra seconds past connect_timeout before the client itself gives up connecting.
CONNECT_GRACE_S = 2.0

# Ciphers in order of preference: AES-GCM first. asyncssh's default, chacha20-poly1305, is built from
# several cipher objects a packet in Python; AES-GCM is one OpenSSL call (AES-NI where the CPU has it):
# about 30% less client CPU for a connection and eight commands, measured on loopback (benchmarks/).
# Every one of these is in OpenSSH's default server list; the rest of asyncssh's defaults follow.
ENCRYPTION_ALGS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes256-ctr",
    "aes192-ctr",
    "aes128-ctr",
)

_Process = asyncssh.SSHClientProcess[str]
T = TypeVar("T")


def known_hosts_path(host: Host) -> Path:
    """The known_hosts file for host; HostKeyError when it does not exist."""
    path = Path(host.known_hosts or DEFAULT_KNOWN_HOSTS).expanduser()
    if not path.is_file():
        raise HostKeyError(
            f"known_hosts file {path} does not exist: host keys are always checked "
            f"(add the key of {host.address}, e.g. ssh-keyscan -p {host.port} {host.address})"
        )
    return path


@dataclass(frozen=True)
class KnownHosts:
    """A known_hosts file as OpenSSH reads it: the entries of the lines that parse, the numbers of those skipped."""

    path: str
    entries: asyncssh.SSHKnownHosts | None  # None: not one line could be read
    skipped: tuple[int, ...] = ()

    def notes(self) -> tuple[Note, ...]:
        """What the host's log says once about this file: the lines that were skipped, if any."""
        if not self.skipped:
            return ()
        return (Note("known_hosts_skipped", {"path": self.path, "lines": list(self.skipped)}),)


def read_known_hosts(path: str) -> KnownHosts:
    """Parse known_hosts line by line, keeping every line asyncssh can read and skipping the rest, as OpenSSH does
    (a bare `@cert-authority`, a broken hashed entry); lines are numbered from 1."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise HostKeyError(f"cannot read known_hosts file {path}: {exc.strerror or exc}") from exc
    good: list[str] = []
    skipped: list[int] = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if _parses(line):
            good.append(line)
        else:
            skipped.append(number)
    entries = asyncssh.import_known_hosts("\n".join(good)) if good else None
    return KnownHosts(path, entries, tuple(skipped))


def _parses(line: str) -> bool:
    try:
        asyncssh.import_known_hosts(line)
    except Exception:  # whatever asyncssh cannot read in a line, that line is skipped (OpenSSH skips it too)
        return False
    return True


# Parsed files, shared by every connection of the run: a fleet's known_hosts has a line a host, so parsing it
# again for each connection cost O(hosts^2) (3 ms a connection at 512 lines). One entry a (kind, path),
# stamped with mtime and size: a file that changes is read again and replaces its old entry.
_FILE_CACHE: dict[tuple[str, str], tuple[tuple[int, int], object]] = {}


def _cached(kind: str, path: Path, load: Callable[[str], T]) -> T:
    stat = path.stat()
    key, stamp = (kind, str(path)), (stat.st_mtime_ns, stat.st_size)
    entry = _FILE_CACHE.get(key)
    if entry is None or entry[0] != stamp:
        entry = _FILE_CACHE[key] = (stamp, load(str(path)))
    return cast(T, entry[1])


def known_hosts(host: Host) -> KnownHosts:
    """host's known_hosts, parsed once per version of the file; HostKeyError when it is missing or has no
    usable line (no key can be trusted then, as when the host's key is not in it)."""
    known = _cached("known_hosts", known_hosts_path(host), read_known_hosts)
    if known.entries is None:
        lines = f" (lines skipped: {', '.join(map(str, known.skipped))})" if known.skipped else ""
        raise HostKeyError(f"known_hosts file {known.path} has no line that can be read{lines}: "
                           f"no host key of {host.address} can be checked")
    return known


def connect_options(host: Host, known: KnownHosts | None = None) -> dict[str, object]:
    """asyncssh.connect keyword arguments for host (checked files, bounded waits)."""
    options: dict[str, object] = {
        "port": host.port,
        "known_hosts": (known or known_hosts(host)).entries,
        "connect_timeout": host.connect_timeout,
        "login_timeout": host.connect_timeout,
        "encryption_algs": list(ENCRYPTION_ALGS),
    }
    if host.user:
        options["username"] = host.user
    if host.identity_file:
        identity = Path(host.identity_file).expanduser()
        if not identity.is_file():
            raise AuthError(f"identity_file {identity} does not exist")
        options["client_keys"] = _cached("identity", identity, lambda path: asyncssh.load_keypairs([path]))
    return options


@contextmanager
def connect_errors(host: Host) -> Iterator[None]:
    """Map what connecting can raise to fleet's errors, each a one-line message."""
    target = f"{host.address}:{host.port}"
    try:
        yield
    except asyncssh.HostKeyNotVerifiable as exc:
        raise HostKeyError(f"host key of {target} not trusted ({exc.reason})") from exc
    except asyncssh.PermissionDenied as exc:
        raise AuthError(f"authentication failed for {host.user or 'default user'} at {target}") from exc
    except asyncssh.KeyImportError as exc:
        raise AuthError(f"cannot load identity_file {host.identity_file}: {exc}") from exc
    except TimeoutError as exc:  # before OSError: on 3.11 TimeoutError is an OSError
        raise ConnectError(f"connect timed out after {host.connect_timeout:g} s ({target})", timed_out=True) from exc
    except ConnectionRefusedError as exc:
        raise ConnectError(f"connection refused ({target})") from exc
    except socket.gaierror as exc:
        raise ConnectError(f"cannot resolve {host.address}: {exc.strerror}") from exc
    except asyncssh.DisconnectError as exc:
        raise ConnectError(f"disconnected while connecting ({target}): {exc.reason}") from exc
    except OSError as exc:
        raise ConnectError(f"cannot connect ({target}): {exc.strerror or exc}") from exc


@contextmanager
def session_errors(host: Host) -> Iterator[None]:
    """Map what a running command can raise to ConnectionLost."""
    try:
        yield
    except (asyncssh.Error, OSError) as exc:
        raise ConnectionLost(f"session to {host.name} dropped: {_reason(exc)}") from exc


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncssh.Error):
        return exc.reason
    return str(exc) or type(exc).__name__


async def open_ssh(host: Host) -> SshTransport:
    """Open the one SSH connection to host that all of its commands share."""
    with connect_errors(host):
        known = known_hosts(host)
        options = connect_options(host, known)
        with anyio.fail_after(host.connect_timeout + CONNECT_GRACE_S):
            conn = await asyncssh.connect(host.address, **options)
    return SshTransport(host, conn, known.notes())


class SshTransport:
    """The Transport over one asyncssh connection; see `fleet.transport.base`.

    `notes`: what the host's log should say once about connecting (known_hosts lines skipped).
    `silent`: whether the session went silent (see the module docstring); nothing is sent on it then.
    """

    def __init__(self, host: Host, conn: asyncssh.SSHClientConnection, notes: tuple[Note, ...] = ()) -> None:
        self._host = host
        self._conn = conn
        self._closed = False
        self._open_s = min(host.connect_timeout, OPEN_TIMEOUT_S)
        self.notes = notes
        self.silent = False

    async def __aenter__(self) -> SshTransport:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def run(self, argv: Sequence[str], *, timeout: float, privileged: bool = False) -> CommandResult:
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
        deadline = anyio.current_time() + client_deadline(timeout)
        with session_errors(self._host):
            process = await self._open(line, deadline)
            try:
                output, timed_out = await _communicate(process, deadline)
            except anyio.get_cancelled_exc_class():
                await self._reap(token, become)
                raise
            if timed_out:  # the node's bound did not end it, or nothing answers: the reap tells which
                await self._reap(token, become)
        result = _result(argv, process, output, started)
        if timed_out:
            self._check_alive()
            raise CommandTimeout(result, timeout)
        self._check_ended(result)
        return finish(result, self._host, timeout, become=become)

    async def hold(self, argv: Sequence[str], *, timeout: float, privileged: bool = False) -> Held:
        """Start argv with stdin open; return at its first stdout line or its end (see `Held`).

        With OpenSSH, closing the channel does not end the remote command; EOF on
        its stdin (release, or sshd closing the pipes when this client is gone) does.
        """
        self._check_alive()
        become = self._host.become and privileged
        line = command_line(bounded_argv(argv, timeout, become=become))
        started = time.monotonic()
        deadline = anyio.current_time() + client_deadline(timeout)
        with session_errors(self._host):
            process = await self._open(line, deadline, stdin=asyncssh.PIPE)
            first = await _first_line(process, deadline)
            if first is None:
                raise CommandTimeout(_result(argv, process, process.collect_output(), started), timeout)
            if first.endswith("\n"):
                return Held(first.rstrip("\n"), release=lambda: self._release(process, argv, first, started))
            (out, err), timed_out = await _communicate(process, deadline)  # no full line: it is ending
        result = _result(argv, process, (first + out, err), started)
        if timed_out:
            raise CommandTimeout(result, timeout)
        self._check_ended(result)
        return Held(first.strip(), finish(result, self._host, timeout, become=become))

    async def close(self) -> None:
        """Close the connection and wait for it: idempotent, shielded, bounded; a silent one is aborted at once."""
        if self._closed:
            return
        self._closed = True
        if self.silent:
            self._conn.abort()
            return
        with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True) as waited:
            self._conn.close()
            await self._conn.wait_closed()
        if waited.cancelled_caught:
            self._conn.abort()

    def _check_alive(self) -> None:
        """SessionSilent, without touching the wire, once the session has gone silent."""
        if self.silent:
            raise SessionSilent(self._host.name)

    def _check_ended(self, result: CommandResult) -> None:
        """ConnectionLost when the channel closed without an exit status or signal."""
        if result.exit_status is None and result.signal is None:
            raise ConnectionLost(f"session to {self._host.name} closed before the command ended")

    async def _open(self, line: str, deadline: float, stdin: int = asyncssh.DEVNULL) -> _Process:
        """Start line in a new channel; SessionSilent when it is not confirmed within the open bound.

        Shielded, but only that long (never until the command's deadline): a cancel waits
        for the channel so that the command it may have started can be ended, never orphaned.
        """
        with anyio.CancelScope(deadline=min(deadline, anyio.current_time() + self._open_s), shield=True):
            return await self._conn.create_process(line, stdin=stdin, encoding="utf-8", errors="replace")
        self.silent = True
        raise SessionSilent(self._host.name)

    async def _release(self, process: _Process, argv: Sequence[str], first: str,
                       started: float) -> CommandResult | None:
        """EOF on a held command's stdin, then wait for its end (bounded, shielded); None when it had to be ended.

        SessionSilent at once on a silent session (its holder's stdin ends with the connection).
        """
        self._check_alive()
        output: tuple[str, str] | None = None
        with anyio.move_on_after(RELEASE_TIMEOUT_S, shield=True):
            with suppress(OSError, asyncssh.Error):
                process.stdin.write_eof()
            with suppress(OSError, asyncssh.Error):
                output = await process.communicate()
        _abandon(process)
        if output is None:
            return None
        return _result(argv, process, (first + output[0], output[1]), started)

    async def _reap(self, token: str, become: bool) -> None:
        """End an interrupted or overdue command on the node (OpenSSH does not when its channel closes).

        Shielded, bounded by REAP_TIMEOUT_S; no answer by then: the session is silent. Nothing is
        tried on a session already silent (the node's own `timeout` still ends the command there).
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
        self.silent = waited.cancelled_caught


def _result(argv: Sequence[str], process: _Process, output: tuple[str, str], started: float) -> CommandResult:
    out, err = output
    signal_info = process.exit_signal  # when set, asyncssh reports exit_status -1
    if signal_info:
        return make_result(argv, None, signal_info[0], out, err, started)
    return make_result(argv, process.exit_status, None, out, err, started)


async def _communicate(process: _Process, deadline: float) -> tuple[tuple[str, str], bool]:
    """Both streams until the channel closes or the deadline: (output, timed_out).

    A channel that did not close by itself (a deadline, a cancel) is ended on the way out; one that did
    needs nothing more (no extra scope, timer or round trip: this runs for every command).
    """
    closed = False
    try:
        with anyio.CancelScope(deadline=deadline):
            output = await process.communicate()
            closed = True
            return output, False
    finally:
        if not closed:
            _abandon(process)
    return process.collect_output(), True  # what arrived before the deadline


async def _first_line(process: _Process, deadline: float) -> str | None:
    """Its first stdout line ('' or partial at EOF), or None past the deadline.

    The channel is ended on the deadline, and on a cancel before it propagates.
    """
    line: str | None = None
    try:
        with anyio.CancelScope(deadline=deadline):
            line = await process.stdout.readline()
    finally:
        if line is None:
            _abandon(process)
    return line


def _abandon(process: _Process) -> None:
    """End a channel whose command may still run: KILL it (where the server honours that) and close it.

    Not waited for: OpenSSH confirms the close only once the command's output ends, which an
    interrupted command's does when the reap has ended it (or its own `timeout` has).
    """
    if process.exit_status is None:
        with suppress(OSError, asyncssh.Error):
            process.send_signal("KILL")
    process.close()
