"""Ports for the simulator's daemons (slurmctld and slurmd, a test's sshd): free now, and safe to bind a moment
later. A port picked by binding port 0 comes from the kernel's ephemeral range, which every outgoing connection on
the machine draws from too: between the pick and the daemon's own bind, another program (a test beside it, an
SSH client) can be handed it, and the daemon fails with `Address already in use`. These are picked below that
range instead. Stdlib only.
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

from fleet.sim.node import SimError

# Where ports are picked: from here to the kernel's ephemeral range (net.ipv4.ip_local_port_range).
PORTS_FROM = 10000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_ports(count: int) -> list[int]:
    """count distinct TCP ports that nothing is bound to now, picked at random below the ephemeral range (each
    tried with a bind, then closed)."""
    below = _ephemeral_low()
    picked: list[int] = []
    for port in secrets.SystemRandom().sample(range(PORTS_FROM, below), below - PORTS_FROM):
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        picked.append(port)
        if len(picked) == count:
            return picked
    raise SimError(f"fewer than {count} free TCP ports between {PORTS_FROM} and {below}")


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 when it cannot be read)."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
    return max(low, PORTS_FROM + 1000)
