"""SSH, the only place fleet imports asyncssh: one connection per host, reused for every command.

    asyncssh_quiet.py  asyncssh, imported without the warning it raises as it is imported (the simulator's SSH
                    server takes it from here too)
    known_hosts.py  the files a host's keys are checked against, parsed as OpenSSH parses them (once a version)
    routing.py      ssh_config: where a connection goes (HostName, port, user, a single-hop ProxyJump)
    options.py      asyncssh's options for a host (keys checked, AES-GCM first), and its errors mapped once to
                    fleet's, each one line
    admission.py    never more handshakes in flight than the loop can finish within connect_timeout
    dial.py         one connection opened: the name resolved within its own bound, the handshake admitted and
                    bounded by connect_timeout of the controller's attention (`fleet.transport.attention`)
    jumps.py        the jump-host pool: the hosts behind one jump host share one connection to it
    transport.py    `open_ssh` and `SshTransport`: commands bounded, streams apart, a silent session told
                    from a slow one (`fleet.transport.liveness`), an interrupted command reaped on the node
"""

from fleet.transport.ssh.admission import AdmissionStats, admission
from fleet.transport.ssh.known_hosts import KnownHosts, known_hosts, read_known_hosts
from fleet.transport.ssh.options import ENCRYPTION_ALGS, connect_options
from fleet.transport.ssh.routing import Jump, Route, route
from fleet.transport.ssh.transport import SshTransport, open_ssh

__all__ = [
    "ENCRYPTION_ALGS", "AdmissionStats", "Jump", "KnownHosts", "Route", "SshTransport", "admission", "connect_options",
    "known_hosts", "open_ssh", "read_known_hosts", "route",
]
