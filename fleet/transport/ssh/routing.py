"""ssh_config: where a host's connection goes (port, user, HostName, a single-hop ProxyJump), as asyncssh reads
`~/.ssh/config`, with the inventory's port and user first.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from pathlib import Path

from fleet.inventory.host import Host
from fleet.model.errors import (
    ConnectError,
)
from fleet.transport.ssh.asyncssh_quiet import asyncssh


@dataclass(frozen=True, kw_only=True)
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
        return cls(spec=spec, host=host, port=int(port) if port else None, user=user or None)


@dataclass(frozen=True, kw_only=True)
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
    # The jump host(s) as messages name them: each hop as written, with the address and port it is really reached
    # at (its own ssh_config entry's HostName and Port) where the hop does not say them (`rack7-jump (10.0.0.9:2200)`).
    jumps_named: str | None = None

    @property
    def direct(self) -> bool:
        """Whether fleet resolves the name and opens the TCP connection itself (no jump host, no ProxyCommand)."""
        return self.proxy_jump is None and not self.own_way

    @property
    def label(self) -> str:
        """`host:port`, and the jump host it is reached through (as `host:port` too): what a message about
        connecting names."""
        return f"{self.hostname}:{self.port}{self.via}"

    @property
    def via(self) -> str:
        """` via jump host rack7-jump (10.0.0.9:2200)`: the jump host(s), named with where each is reached; ''
        without one."""
        if self.proxy_jump is None:
            return ""
        named = self.jumps_named or self.proxy_jump
        return f" via jump host{'s' if ',' in self.proxy_jump else ''} {named}"


# Routes resolved, per (address, port, user, local user): ssh_config is parsed once for a host while the file
# stays as it was (its mtime and size; a file it Includes is not watched).
_ROUTES: dict[tuple[object, ...], tuple[object, Route]] = {}
# How each jump host is named in messages, per (ProxyJump hop as written, local user), read the same way.
_HOPS: dict[tuple[str, str], tuple[object, str]] = {}


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
        named = ", ".join(_hop_named(hop.strip(), stamp) for hop in tunnel.split(",")) if tunnel else None
        found = Route(hostname=options.host, port=options.port, user=options.username, proxy_jump=tunnel, jump=jump,
                      own_way=own_way, jumps_named=named)
        entry = _ROUTES[key] = (stamp, found)
    return entry[1]


def _hop_named(spec: str, stamp: object) -> str:
    """A jump host as messages name it: `[user@]host:port` where ssh_config sends it to the host written (its port
    filled in), else as written with where it really goes (its entry's HostName and Port): `rack7-jump
    (10.0.0.9:2200)`. Read once per ssh_config, like routes: every host behind one jump names it alike."""
    key = (spec, _local_user())
    entry = _HOPS.get(key)
    if entry is not None and entry[0] == stamp:
        return entry[1]
    try:
        hop = Jump.parse(spec)
    except ConnectError:  # a hop of several that fleet cannot read: asyncssh says what it makes of it
        return spec
    options = asyncssh.SSHClientConnectionOptions(
        host=hop.host, port=hop.port if hop.port is not None else (), username=hop.user or (),
        config=(), client_keys=None, known_hosts=None,  # only where it goes: no key is loaded
    )
    if options.host == hop.host:
        named = f"{hop.user + '@' if hop.user else ''}{hop.host}:{options.port}"
    else:
        named = f"{spec} ({options.host}:{options.port})"
    _HOPS[key] = (stamp, named)
    return named


def _local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no such user: asyncssh says so when it connects
        return ""

