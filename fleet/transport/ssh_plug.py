"""The SSH transport as a plug (`connection: ssh`, the default): `fleet.transport.ssh`, imported when a host first
connects, so that a module that only names the transport (the inventory table) never loads asyncssh."""

from __future__ import annotations

from fleet.inventory.host import Host
from fleet.transport.base import Transport
from fleet.transport.plugs import TransportPlug


async def open_ssh(host: Host) -> Transport:
    from fleet.transport.ssh import open_ssh as dial

    return await dial(host)


def address(host: Host) -> str:
    """`address:port`, the port only when the inventory sets it (else ssh_config's, else 22)."""
    return f"{host.address}:{host.port}" if host.port is not None else host.address


TRANSPORT = TransportPlug(open=open_ssh, where=address)
