"""Opening one SSH connection: the name resolved within its own bound, then the handshake, admitted (`admission`) and
bounded by connect_timeout of the controller's attention (`fleet.transport.attention`).

asyncssh's own connect and login timers are off (`options.connect_options`): they run on the wall clock, and a
controller held for 13 s while a handshake was in flight failed that host. Here the one bound is fleet's, re-armed
after a late wake-up, so a late controller only makes connecting slower.

A host that ssh_config sends straight to its HostName (no jump host, no ProxyCommand) is resolved here first, with
a bound of its own (a slow resolver is named as such, and never eats the handshake's time), and asyncssh gets the
connected socket. The name it is given is still the inventory's address, so ssh_config and known_hosts are read
for that name exactly as before.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence

import anyio

from fleet.inventory.host import Host
from fleet.model.errors import ConnectError
from fleet.transport import attention
from fleet.transport.base import Note
from fleet.transport.ssh.admission import Admitted, admission
from fleet.transport.ssh.asyncssh_quiet import asyncssh
from fleet.transport.ssh.routing import Route

SockAddr = tuple[socket.AddressFamily, tuple[object, ...]]


async def dial(host: Host, where: Route, options: dict[str, object],
               tunnel: asyncssh.SSHClientConnection | None = None) -> tuple[asyncssh.SSHClientConnection, Admitted]:
    """Connect to host (through `tunnel`, a jump host's connection, when given): TimeoutError past connect_timeout
    of attention once admitted; ConnectError when its name has no answer within its own bound."""
    addresses = await resolve(host, where) if tunnel is None and where.direct else ()
    async with admission().handshake(host.connect_timeout) as admitted:
        with attention.fail_after(host.connect_timeout):
            if tunnel is not None:
                return await asyncssh.connect(host.address, tunnel=tunnel, **options), admitted
            if not addresses:
                return await asyncssh.connect(host.address, **options), admitted
            sock = await open_socket(addresses)
            try:
                return await asyncssh.connect(host.address, sock=sock, **options), admitted
            except BaseException:
                sock.close()  # asyncssh closes a socket it took; one it never took is closed here
                raise


async def resolve(host: Host, where: Route) -> Sequence[SockAddr]:
    """The addresses of where.hostname, in the resolver's order, within connect_timeout of attention of their own
    (an IP address needs no lookup); socket.gaierror when it has none."""
    try:
        ip = ipaddress.ip_address(where.hostname)
    except ValueError:
        pass
    else:
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        return ((family, (where.hostname, where.port)),)
    try:
        with attention.fail_after(host.connect_timeout):
            found = await anyio.getaddrinfo(where.hostname, where.port, type=socket.SOCK_STREAM)
    except TimeoutError:
        raise ConnectError(f"cannot resolve {where.hostname}: no answer within {host.connect_timeout:g} s",
                           timed_out=True) from None
    return tuple((family, tuple(sockaddr)) for family, _, _, _, sockaddr in found)


async def open_socket(addresses: Sequence[SockAddr]) -> socket.socket:
    """A TCP connection to the first address that takes one, tried in order as ssh does; the last error else."""
    loop = asyncio.get_running_loop()
    error: OSError | None = None
    for family, sockaddr in addresses:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, sockaddr)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    raise error or OSError(f"no address to connect to ({addresses})")


def admission_notes(admitted: Admitted) -> tuple[Note, ...]:
    """What the host's log says about admission: only that it waited, when it did (the run was at its width)."""
    if not admitted.queued:
        return ()
    return (Note("connect_admission", {"waited_s": round(admitted.waited_s, 3), "in_flight": admitted.in_flight,
                                       "width": admitted.width}),)
