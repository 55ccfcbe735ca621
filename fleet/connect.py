"""Open the Transport a host's `connection` variable asks for."""

from __future__ import annotations

from fleet.local import LocalTransport
from fleet.models import Connection, Host
from fleet.ssh import open_ssh
from fleet.transport import Transport


async def connect(host: Host) -> Transport:
    """An open session to host: SSH (the default) or this machine's own processes."""
    if host.connection == Connection.LOCAL:
        return LocalTransport(host)
    return await open_ssh(host)
