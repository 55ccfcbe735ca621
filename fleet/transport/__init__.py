"""How fleet talks to a node: the Transport seam and the transports behind it.

    base.py      the seam: the Transport protocol, CommandResult, OpenCommand, bounded argv, clip
    plugs.py     transports by name (a host's `connection:`, `fleet.model.plugs.TRANSPORTS`), `connect`
    ssh/         the SSH Transport (asyncssh): known_hosts, ssh_config, jump hosts, the transport
    ssh_plug.py  SSH as a plug, asyncssh imported only when a host first connects
    local.py     the local Transport (`connection: local`): this machine's own processes
    scripted.py  a scripted Transport for logic tests
    sessions.py  ending a whole local process session
    reap.py      finding an interrupted command on a node by its marker

The rule: ssh/ is the only package outside `fleet.sim` that uses asyncssh, and `ssh/asyncssh_quiet.py` the only
module that imports it (without the warning asyncssh raises as it is imported).
"""

from __future__ import annotations

from fleet.transport.base import CommandResult, OpenCommand, Transport
from fleet.transport.plugs import connect

__all__ = ["CommandResult", "OpenCommand", "Transport", "connect"]
