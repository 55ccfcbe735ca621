"""How fleet talks to a node: the Transport seam and the transports behind it.

    base.py      the seam: the Transport protocol, CommandResult, OpenCommand, bounded argv, clip
    ssh/         the SSH Transport (asyncssh): known_hosts, ssh_config, jump hosts, the transport
    local.py     the local Transport (`connection: local`): this machine's own processes
    scripted.py  a scripted Transport for logic tests
    sessions.py  ending a whole local process session
    reap.py      finding an interrupted command on a node by its marker

The rule: ssh/ is the only package outside `fleet.sim` that imports asyncssh.
"""

from __future__ import annotations

from fleet.inventory.host import Connection, Host
from fleet.transport.base import CommandResult, OpenCommand, Transport
from fleet.transport.local import LocalTransport

__all__ = ["CommandResult", "OpenCommand", "Transport", "connect"]


async def connect(host: Host) -> Transport:
    """An open session to host, as its `connection` variable asks: SSH (the default) or this machine's processes."""
    if host.connection == Connection.LOCAL:
        return LocalTransport(host)
    # Imported here: every logic module imports the seam (fleet.transport.base), which runs this
    # file first, and that must not load asyncssh.
    from fleet.transport.ssh import open_ssh

    return await open_ssh(host)
