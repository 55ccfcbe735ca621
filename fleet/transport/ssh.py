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
unanswered for `silence_s` of the controller's attention is silence. A slow
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
import getpass
import os
import secrets
import socket
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar, cast

import anyio
import asyncssh

from fleet.errors import (
    AuthError,
    CommandTimeout,
    ConnectError,
    ConnectionLost,
    HostKeyError,
    SessionSilent,
    TransportError,
)
from fleet.inventory.host import Host, default_known_hosts
from fleet.report.models import Reason
from fleet.transport import liveness, reap
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
# Seconds to find and end an interrupted or overdue command on the node (and, on a cancel, for a channel being
# opened to be confirmed so that its command can be ended); an interrupted one with no answer by then is silent.
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

# Handshakes in flight through one jump host at a time: each is a channel on the one shared connection, and 500
# hosts behind one bastion must not open 500 at once (its CPU, its sshd's window of unanswered opens).
JUMP_HANDSHAKES = 16


# ---------------------------------------------------------------- known_hosts


def known_hosts_paths(host: Host) -> tuple[Path, ...]:
    """The known_hosts files host's keys are checked against: the one `known_hosts` names, else every default file
    that exists, the user's and the system's (as OpenSSH reads them); HostKeyError when there is none."""
    keyscan = f"ssh-keyscan -p {host.port} {host.address}" if host.port else f"ssh-keyscan {host.address}"
    hint = f"host keys are always checked (add the key of {host.address}, e.g. {keyscan})"
    if host.known_hosts:
        path = Path(host.known_hosts).expanduser()
        if not path.is_file():
            raise HostKeyError(f"known_hosts file {path} does not exist: {hint}")
        return (path,)
    defaults = default_known_hosts()
    found = tuple(f.path for f in defaults if f.path.is_file())
    if not found:
        raise HostKeyError(f"no known_hosts file ({', '.join(f.written for f in defaults)}) exists: {hint}")
    return found


@dataclass(frozen=True)
class KnownHostsFile:
    """One known_hosts file as OpenSSH reads it: the lines that parse, the numbers of those skipped."""

    path: str
    lines: tuple[str, ...]
    skipped: tuple[int, ...] = ()

    def notes(self) -> tuple[Note, ...]:
        """What the host's log says once about this file: the lines that were skipped, if any."""
        if not self.skipped:
            return ()
        return (Note("known_hosts_skipped", {"path": self.path, "lines": list(self.skipped)}),)


@dataclass(frozen=True)
class KnownHosts:
    """The known_hosts files a host's keys are checked against, and the entries of every line of them that parses."""

    files: tuple[KnownHostsFile, ...]
    entries: asyncssh.SSHKnownHosts | None  # None: not one line could be read

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)

    def notes(self) -> tuple[Note, ...]:
        """What the host's log says once about connecting: each file's skipped lines, one note a file."""
        return tuple(note for f in self.files for note in f.notes())


def read_known_hosts(path: str) -> KnownHostsFile:
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
    return KnownHostsFile(path, tuple(good), tuple(skipped))


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
# The entries of each set of known_hosts files, kept while every file of the set is the version parsed.
_KNOWN_CACHE: dict[tuple[str, ...], KnownHosts] = {}


def _cached(kind: str, path: Path, load: Callable[[str], T]) -> T:
    stat = path.stat()
    key, stamp = (kind, str(path)), (stat.st_mtime_ns, stat.st_size)
    entry = _FILE_CACHE.get(key)
    if entry is None or entry[0] != stamp:
        entry = _FILE_CACHE[key] = (stamp, load(str(path)))
    return cast(T, entry[1])


def known_hosts(host: Host) -> KnownHosts:
    """host's known_hosts files, each parsed once per version; HostKeyError when there is none, or not one line
    of them can be read (no key can be trusted then, as when the host's key is not in them)."""
    files = tuple(_cached("known_hosts", path, read_known_hosts) for path in known_hosts_paths(host))
    paths = tuple(f.path for f in files)
    known = _KNOWN_CACHE.get(paths)
    if known is None or any(old is not new for old, new in zip(known.files, files, strict=True)):
        lines = [line for f in files for line in f.lines]
        entries = asyncssh.import_known_hosts("\n".join(lines)) if lines else None
        known = _KNOWN_CACHE[paths] = KnownHosts(files, entries)
    if known.entries is None:
        raise HostKeyError(_unreadable(known, host))
    return known


def _unreadable(known: KnownHosts, host: Host) -> str:
    if len(known.files) == 1:
        (only,) = known.files
        lines = f" (lines skipped: {', '.join(map(str, only.skipped))})" if only.skipped else ""
        return f"known_hosts file {only.path} has no line that can be read{lines}: no host key of {host.address} " \
               "can be checked"
    skipped = "; ".join(f"{f.path}: {', '.join(map(str, f.skipped))}" for f in known.files if f.skipped)
    lines = f" (lines skipped: {skipped})" if skipped else ""
    return f"known_hosts files {', '.join(known.paths)} have no line that can be read{lines}: no host key of " \
           f"{host.address} can be checked"


# ---------------------------------------------------------------- ssh_config: where a connection goes


@dataclass(frozen=True)
class Jump:
    """A single-hop `ProxyJump`, `[user@]host[:port]` as ssh_config writes it; port and user None when unsaid."""

    spec: str
    host: str
    port: int | None = None
    user: str | None = None

    @classmethod
    def parse(cls, spec: str) -> Jump:
        """Split spec as asyncssh does (the user before the last `@`, the port after the last `:`)."""
        user, _, rest = spec.rpartition("@")
        host, colon, port = rest.rpartition(":")
        if not colon:
            host, port = rest, ""
        if port and not port.isdigit():
            raise ConnectError(f"ssh_config's ProxyJump {spec}: {port!r} is not a port")
        return cls(spec, host, int(port) if port else None, user or None)


@dataclass(frozen=True)
class Route:
    """Where a host's connection goes, with what the inventory leaves unset taken from ssh_config (as asyncssh
    reads `~/.ssh/config`), else from ssh's defaults (port 22, the current user)."""

    hostname: str  # ssh_config's HostName, else the address
    port: int
    user: str
    proxy_jump: str | None = None  # ssh_config's ProxyJump, as written
    # The one jump host fleet shares between the hosts behind it; None without a ProxyJump, or with several hops
    # (asyncssh opens those itself, for each connection).
    jump: Jump | None = None

    @property
    def label(self) -> str:
        """`host:port`, and the jump host it is reached through: what a message about connecting names."""
        via = f" via jump host {self.proxy_jump}" if self.proxy_jump else ""
        return f"{self.hostname}:{self.port}{via}"


# Routes resolved, per (address, port, user, local user): ssh_config is parsed once for a host while the file
# stays as it was (its mtime and size; a file it Includes is not watched).
_ROUTES: dict[tuple[object, ...], tuple[object, Route]] = {}


def route(host: Host) -> Route:
    """Where host's connection goes: the inventory's port and user where set, ssh_config's where not."""
    config = Path("~", ".ssh", "config").expanduser()
    try:
        stat = config.stat()
        stamp: object = (str(config), stat.st_mtime_ns, stat.st_size)
    except OSError:
        stamp = (str(config), None)
    key = (host.address, host.port, host.user, _local_user())
    entry = _ROUTES.get(key)
    if entry is None or entry[0] != stamp:
        options = asyncssh.SSHClientConnectionOptions(
            host=host.address, port=host.port if host.port is not None else (), username=host.user or (),
            config=(), client_keys=None, known_hosts=None,  # only where to go: no key is loaded
        )
        tunnel = options.tunnel if isinstance(options.tunnel, str) else None
        jump = Jump.parse(tunnel) if tunnel and "," not in tunnel else None
        entry = _ROUTES[key] = (stamp, Route(options.host, options.port, options.username, tunnel, jump))
    return entry[1]


def _local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no such user: asyncssh says so when it connects
        return ""


# ---------------------------------------------------------------- options and errors


def connect_options(host: Host, known: KnownHosts | None = None) -> dict[str, object]:
    """asyncssh.connect keyword arguments for host (checked files, bounded waits).

    `port` and `username` only where the inventory sets them: else ssh_config's (asyncssh reads it), else 22
    and the current user. An `identity_file` with a passphrase is not loaded: with an ssh-agent running,
    asyncssh offers the agent's keys (the user has `ssh-add`ed it); without one it is an AuthError at once.
    """
    options: dict[str, object] = {
        "known_hosts": (known or known_hosts(host)).entries,
        "connect_timeout": host.connect_timeout,
        "login_timeout": host.connect_timeout,
        "encryption_algs": list(ENCRYPTION_ALGS),
    }
    if host.port is not None:
        options["port"] = host.port
    if host.user:
        options["username"] = host.user
    if host.identity_file:
        identity = Path(host.identity_file).expanduser()
        if not identity.is_file():
            raise AuthError(f"identity_file {identity} does not exist")
        keys = _cached("identity", identity, _load_identity)
        if keys is not None:
            options["client_keys"] = keys
        elif not os.environ.get("SSH_AUTH_SOCK"):
            raise AuthError(
                f"identity_file {host.identity_file} is encrypted and no ssh-agent is running (SSH_AUTH_SOCK unset):"
                " load it with ssh-add, or use a key without a passphrase"
            )
    return options


def _load_identity(path: str) -> Sequence[asyncssh.SSHKeyPair] | None:
    """The key pairs of an identity file; None when it is encrypted (fleet never asks for a passphrase)."""
    try:
        return asyncssh.load_keypairs([path])
    except asyncssh.KeyImportError as exc:
        if str(exc).startswith("Passphrase"):  # how asyncssh itself tells an encrypted key (ignore_encrypted)
            return None
        raise


@contextmanager
def connect_errors(host: Host, where: Route | None = None, *, prefix: str = "", hint: str = "") -> Iterator[None]:
    """Map what connecting can raise to fleet's errors, each a one-line message.

    `where`: the host's route, once known (its port, user and jump host are named); `prefix` starts every
    message (`jump host ...: `); `hint` ends an authentication failure's.
    """
    target = where.label if where else host.address + (f":{host.port}" if host.port else "")
    who = where.user if where else host.user or "the default user"
    try:
        yield
    except asyncssh.HostKeyNotVerifiable as exc:
        raise HostKeyError(f"{prefix}host key of {target} not trusted ({exc.reason})") from exc
    except asyncssh.PermissionDenied as exc:
        raise AuthError(f"{prefix}authentication failed for {who} at {target}{hint}") from exc
    except asyncssh.KeyImportError as exc:
        raise AuthError(f"{prefix}cannot load identity_file {host.identity_file}: {exc}") from exc
    except asyncssh.ChannelOpenError as exc:  # the jump host could not open the way on
        raise ConnectError(f"{prefix}cannot reach {target}: {exc.reason}") from exc
    except asyncssh.ConfigParseError as exc:
        raise ConnectError(f"{prefix}cannot read ssh_config: {exc}") from exc
    except TimeoutError as exc:  # before OSError: on 3.11 TimeoutError is an OSError
        raise ConnectError(f"{prefix}connect timed out after {host.connect_timeout:g} s ({target})",
                           timed_out=True) from exc
    except ConnectionRefusedError as exc:
        raise ConnectError(f"{prefix}connection refused ({target})") from exc
    except socket.gaierror as exc:
        raise ConnectError(f"{prefix}cannot resolve {where.hostname if where else host.address}: {exc.strerror}") \
            from exc
    except asyncssh.DisconnectError as exc:
        raise ConnectError(f"{prefix}disconnected while connecting ({target}): {exc.reason}") from exc
    except OSError as exc:
        raise ConnectError(f"{prefix}cannot connect ({target}): {exc.strerror or exc}") from exc


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


# ---------------------------------------------------------------- connecting


async def open_ssh(host: Host) -> SshTransport:
    """Open the one SSH connection to host that all of its commands share (through its jump host's shared
    connection when ssh_config gives it a single-hop ProxyJump)."""
    with connect_errors(host):
        known = known_hosts(host)
        options = connect_options(host, known)
        where = route(host)
    agent = bool(host.identity_file) and "client_keys" not in options
    hint = f" (identity_file {host.identity_file} is encrypted: the ssh-agent's keys were offered; ssh-add it)" \
        if agent else ""
    jump = where.jump
    if jump is None:
        with connect_errors(host, where, hint=hint), anyio.fail_after(host.connect_timeout + CONNECT_GRACE_S):
            conn = await asyncssh.connect(host.address, **options)
        return SshTransport(host, conn, known.notes())
    shared = await _lease(host, jump, known)
    try:
        with connect_errors(host, where, hint=hint):
            async with shared.handshakes:
                with anyio.fail_after(host.connect_timeout + CONNECT_GRACE_S):
                    conn = await asyncssh.connect(host.address, tunnel=shared.conn, **options)
    except BaseException:
        await shared.release()
        raise
    return SshTransport(host, conn, known.notes(), jump=shared)


async def _close_connection(conn: asyncssh.SSHClientConnection, abort: bool = False) -> None:
    """Close conn and wait for it (shielded, bounded: aborted past CLOSE_TIMEOUT_S); abort: at once."""
    if abort:
        conn.abort()
        return
    with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True) as waited:
        conn.close()
        await conn.wait_closed()
    if waited.cancelled_caught:
        conn.abort()


@dataclass(eq=False)
class SharedJump:
    """The one connection to a jump host that every host behind it tunnels through: opened once (under `lock`),
    its host key checked like any other; counted by `users` and closed when the last of them releases it.
    `handshakes` bounds the handshakes in flight through it."""

    key: tuple[object, ...]
    spec: str
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    handshakes: anyio.CapacityLimiter = field(default_factory=lambda: anyio.CapacityLimiter(JUMP_HANDSHAKES))
    users: int = 0
    conn: asyncssh.SSHClientConnection | None = None
    error: TransportError | None = None  # why it could not be opened: every host waiting on it is told

    async def release(self, abort: bool = False) -> None:
        """One host is done with it; the last one closes it (shielded, bounded; abort: at once)."""
        self.users -= 1
        if self.users > 0:
            return
        pool = _jump_pool()
        if pool.get(self.key) is self:
            del pool[self.key]
        conn, self.conn = self.conn, None
        if conn is not None:
            await _close_connection(conn, abort)


# The shared jump connections of each event loop (a connection belongs to the loop that opened it).
_JUMP_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[object, ...], SharedJump]] = (
    weakref.WeakKeyDictionary()
)


def _jump_pool() -> dict[tuple[object, ...], SharedJump]:
    return _JUMP_POOLS.setdefault(asyncio.get_running_loop(), {})


async def _lease(host: Host, jump: Jump, known: KnownHosts) -> SharedJump:
    """The shared connection to jump (opened now by the first host that asks), one more user counted.

    A jump that cannot be opened fails every host waiting on it with the same reason, its message naming the
    jump host; once no host holds it, the next one to ask tries again.
    """
    pool = _jump_pool()
    key = (jump.spec, known.paths)
    shared = pool.get(key)
    if shared is None:
        shared = pool[key] = SharedJump(key, jump.spec)
    shared.users += 1
    try:
        async with shared.lock:
            if shared.conn is not None and shared.conn.is_closed():
                shared.conn = None  # it dropped since: open it again
            if shared.conn is None and shared.error is None:
                try:
                    shared.conn = await _open_jump(host, jump, known)
                except TransportError as exc:
                    shared.error = exc
            if shared.error is not None:
                raise _again(shared.error) from None
    except BaseException:
        await shared.release()
        raise
    return shared


async def _open_jump(host: Host, jump: Jump, known: KnownHosts) -> asyncssh.SSHClientConnection:
    """Connect to the jump host as ssh does (its own ssh_config entry, the default keys and the agent; not the
    host's identity_file), its key checked against host's known_hosts, within host's connect_timeout."""
    via = Host(name=jump.spec, address=jump.host, port=jump.port, user=jump.user,
               connect_timeout=host.connect_timeout)
    with connect_errors(via, prefix=f"jump host {jump.spec}: "):
        options = connect_options(via, known)
        with anyio.fail_after(host.connect_timeout + CONNECT_GRACE_S):
            return await asyncssh.connect(via.address, **options)


def _again(exc: TransportError) -> TransportError:
    """A new error like exc, for one more host (an exception is never raised in two tasks)."""
    if isinstance(exc, ConnectError):
        return ConnectError(str(exc), timed_out=exc.reason is Reason.CONNECT_TIMEOUT)
    return type(exc)(str(exc))


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
            process = await self._open(line, deadline, (token, become))
            if process is None:  # the session answers, but opened no channel by the deadline: a slow node
                raise CommandTimeout(make_result(argv, None, None, "", "", started), timeout)
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
            process = await self._open(line, deadline, None, stdin=asyncssh.PIPE)
            first = None if process is None else await self._first_line(process, deadline)
            if process is None or first is None:
                output = ("", "") if process is None else process.collect_output()
                raise CommandTimeout(make_result(argv, None, None, *output, started), timeout)
            if first.endswith("\n"):
                return Held(first.rstrip("\n"), release=lambda: self._release(process, argv, first, started))
            (out, err), timed_out = await self._communicate(process, deadline)  # no full line: it is ending
        result = _result(argv, process, (first + out, err), started)
        if timed_out:
            raise CommandTimeout(result, timeout)
        self._check_ended(result)
        return Held(first.strip(), finish(result, self._host, timeout, become=become))

    async def close(self) -> None:
        """Close the connection and wait for it: idempotent, shielded, bounded; a silent one is aborted at once.

        Then its jump host's connection is released: the last host behind it closes it (aborts it, when silent).
        """
        if self._closed:
            return
        self._closed = True
        try:
            await _close_connection(self._conn, abort=self.silent)
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
        with anyio.CancelScope(deadline=min(deadline, anyio.current_time() + liveness.PROBE_AFTER_S)):
            return await wait()  # the common case: no request, no timer beyond this one
        end = deadline + self._silence_s
        with liveness.Pinger(self._conn, self._silence_s) as pinger:
            while (now := anyio.current_time()) < end or not pinger.answered:
                look = now + liveness.PROBE_EVERY_S
                with anyio.CancelScope(deadline=min(look, end) if now < end else look):
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

    async def _communicate(self, process: _Process, deadline: float) -> tuple[tuple[str, str], bool]:
        """Both streams until the channel closes, or what arrived by the deadline: (output, timed_out).

        A channel that did not close by itself (a deadline, a cancel, silence) is ended on the way out.
        """
        closed = False
        try:
            output = await self._answer(process.communicate, deadline)
            closed = output is not None
        finally:
            if not closed:
                _abandon(process)
        return (output, False) if output is not None else (process.collect_output(), True)

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


def _result(argv: Sequence[str], process: _Process, output: tuple[str, str], started: float) -> CommandResult:
    out, err = output
    signal_info = process.exit_signal  # when set, asyncssh reports exit_status -1
    if signal_info:
        return make_result(argv, None, signal_info[0], out, err, started)
    return make_result(argv, process.exit_status, None, out, err, started)


def _abandon(process: _Process) -> None:
    """End a channel whose command may still run: KILL it (where the server honours that) and close it.

    Not waited for: OpenSSH confirms the close only once the command's output ends, which an
    interrupted command's does when the reap has ended it (or its own `timeout` has).
    """
    if process.exit_status is None:
        with suppress(OSError, asyncssh.Error):
            process.send_signal("KILL")
    process.close()
