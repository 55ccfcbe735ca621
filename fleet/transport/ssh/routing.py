"""ssh_config: where a host's connection goes (port, user, HostName, a single-hop ProxyJump), as asyncssh reads
`~/.ssh/config`, with the inventory's port and user first.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from fleet.inventory.host import Host
from fleet.model.errors import (
    ConnectError,
)


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
    # ssh_config reaches the host some way of its own (ProxyCommand, CanonicalizeHostname): asyncssh resolves and
    # connects. Else fleet resolves `hostname` itself (bounded apart) and hands asyncssh the connected socket.
    own_way: bool = False

    @property
    def direct(self) -> bool:
        """Whether fleet resolves the name and opens the TCP connection itself (no jump host, no ProxyCommand)."""
        return self.proxy_jump is None and not self.own_way

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
        own_way = bool(options.proxy_command) or bool(options.canonicalize_hostname and options.canonical_domains)
        entry = _ROUTES[key] = (stamp, Route(options.host, options.port, options.username, tunnel, jump, own_way))
    return entry[1]


def _local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no such user: asyncssh says so when it connects
        return ""

