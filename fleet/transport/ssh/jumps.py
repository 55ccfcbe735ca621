"""The jump-host pool: hosts that ssh_config puts behind one jump host (a single-hop `ProxyJump`) share one
connection to it (`SharedJump`), opened by the first that asks, closed when the last is done.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field

import anyio

from fleet.inventory.host import Host
from fleet.model.errors import (
    ConnectError,
    TransportError,
)
from fleet.model.outcomes import Reason
from fleet.transport.ssh.asyncssh_quiet import asyncssh
from fleet.transport.ssh.dial import dial
from fleet.transport.ssh.known_hosts import KnownHosts
from fleet.transport.ssh.options import connect_errors, connect_options
from fleet.transport.ssh.routing import Jump, Route, route

# Seconds allowed for a connection to close cleanly (then it is aborted).
CLOSE_TIMEOUT_S = 3.0
# Handshakes in flight through one jump host at a time: each is a channel on the one shared connection, and 500
# hosts behind one bastion must not open 500 at once (its CPU, its sshd's window of unanswered opens).
JUMP_HANDSHAKES = 16


async def close_connection(conn: asyncssh.SSHClientConnection, abort: bool = False) -> None:
    """Close conn and wait for it (shielded, bounded: aborted past CLOSE_TIMEOUT_S); abort: at once."""
    if abort:
        conn.abort()
        return
    with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True) as waited:
        conn.close()
        await conn.wait_closed()
    if waited.cancelled_caught:
        conn.abort()


@dataclass(eq=False, kw_only=True)
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
        pool = jump_pool()
        if pool.get(self.key) is self:
            del pool[self.key]
        conn, self.conn = self.conn, None
        if conn is not None:
            await close_connection(conn, abort)


# The shared jump connections of each event loop (a connection belongs to the loop that opened it).
_JUMP_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[object, ...], SharedJump]] = (
    weakref.WeakKeyDictionary()
)


def jump_pool() -> dict[tuple[object, ...], SharedJump]:
    return _JUMP_POOLS.setdefault(asyncio.get_running_loop(), {})


async def lease(host: Host, jump: Jump, known: KnownHosts, where: Route) -> SharedJump:
    """The shared connection to jump (opened now by the first host that asks), one more user counted.

    A jump that cannot be opened fails every host waiting on it with the same reason, its message naming the
    jump host and where it was really reached (its ssh_config HostName and port), and, for each host, that
    host's own address and port (`where`); once no host holds it, the next one to ask tries again.
    """
    pool = jump_pool()
    key = (jump.spec, known.paths)
    shared = pool.get(key)
    if shared is None:
        shared = pool[key] = SharedJump(key=key, spec=jump.spec)
    shared.users += 1
    try:
        async with shared.lock:
            if shared.conn is not None and shared.conn.is_closed():
                shared.conn = None  # it dropped since: open it again
            if shared.conn is None and shared.error is None:
                try:
                    shared.conn = await open_jump(host, jump, known)
                except TransportError as exc:
                    shared.error = exc
            if shared.error is not None:
                raise again(shared.error, f", on the way to {where.hostname}:{where.port}") from None
    except BaseException:
        await shared.release()
        raise
    return shared


async def open_jump(host: Host, jump: Jump, known: KnownHosts) -> asyncssh.SSHClientConnection:
    """Connect to the jump host as ssh does (its own ssh_config entry, the default keys and the agent; not the
    host's identity_file), its key checked against host's known_hosts, within host's connect_timeout of attention,
admitted like any handshake (`dial`)."""
    via = Host(name=jump.spec, address=jump.host, port=jump.port, user=jump.user,
               connect_timeout=host.connect_timeout)
    with connect_errors(via, prefix=f"jump host {jump.spec}: "):
        reached = route(via)
    with connect_errors(via, reached, prefix=f"jump host {jump.spec}: "):
        options = connect_options(via, known)
        conn, _ = await dial(via, reached, options)
        return conn


def again(exc: TransportError, suffix: str = "") -> TransportError:
    """A new error like exc, its message ending in `suffix`, for one more host (an exception is never raised in
    two tasks)."""
    if isinstance(exc, ConnectError):
        return ConnectError(f"{exc}{suffix}", timed_out=exc.reason is Reason.CONNECT_TIMEOUT)
    return type(exc)(f"{exc}{suffix}")

