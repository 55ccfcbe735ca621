"""Open the Transport a host's `connection` variable asks for."""

from __future__ import annotations

from fleet.inventory.host import Connection, Host
from fleet.transport.base import Transport
from fleet.transport.local import LocalTransport
from fleet.transport.ssh import open_ssh


async def connect(host: Host) -> Transport:
    """An open session to host: SSH (the default) or this machine's own processes."""
    if host.connection == Connection.LOCAL:
        return LocalTransport(host)
    return await open_ssh(host)
