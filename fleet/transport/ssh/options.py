"""How fleet connects: asyncssh's options for a host (checked known_hosts, bounded waits, AES-GCM first, the
identity file), and asyncssh's errors mapped once, each to a one-line fleet error.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from fleet.inventory.host import Host
from fleet.model.errors import (
    AuthError,
    ConnectError,
    ConnectionLost,
)
from fleet.transport.ssh.asyncssh_quiet import asyncssh
from fleet.transport.ssh.known_hosts import KnownHosts, cached, known_hosts, untrusted
from fleet.transport.ssh.routing import Route

# No SSH keepalives: every command has a client deadline (fleet.transport.base.client_deadline) and connecting
# has connect_timeout, so a host that stalls is dropped by those. asyncssh re-arms its keepalive timer on
# every packet received: at 512 hosts that timer churn was a fifth of the controller's CPU (py-spy). (A wait
# that lasts asks for a keepalive reply itself: fleet.transport.liveness.)

# Ciphers in order of preference: AES-GCM first. asyncssh's default, chacha20-poly1305, is built from
# several cipher objects a packet in Python; AES-GCM is one OpenSSL call (AES-NI where the CPU has it):
# about 30% less client CPU for a connection and eight commands, measured on loopback (benchmarks/).
# Every one of these is in OpenSSH's default server list; the rest of asyncssh's defaults follow.
ENCRYPTION_ALGS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes256-ctr",
    "aes192-ctr",
    "aes128-ctr",
)


def connect_options(host: Host, known: KnownHosts | None = None) -> dict[str, object]:
    """asyncssh.connect keyword arguments for host (checked files; the waits are bounded by `dial`).

    `port` and `username` only where the inventory sets them: else ssh_config's (asyncssh reads it), else 22
    and the current user. An `identity_file` with a passphrase is not loaded: with an ssh-agent running,
    asyncssh offers the agent's keys (the user has `ssh-add`ed it); without one it is an AuthError at once.
    """
    options: dict[str, object] = {
        "known_hosts": (known or known_hosts(host)).entries,
        # asyncssh's own timers run on the wall clock: off. connect_timeout bounds connecting and logging in on the
        # controller's attention clock instead (fleet.transport.ssh.dial).
        "connect_timeout": None,
        "login_timeout": 0,
        "encryption_algs": list(ENCRYPTION_ALGS),
    }
    if host.port is not None:
        options["port"] = host.port
    if host.user:
        options["username"] = host.user
    if host.identity_file:
        identity = Path(host.identity_file).expanduser()
        if not identity.is_file():
            raise AuthError(f"identity_file {identity} does not exist")
        keys = cached("identity", identity, _load_identity)
        if keys is not None:
            options["client_keys"] = keys
        elif not os.environ.get("SSH_AUTH_SOCK"):
            raise AuthError(
                f"identity_file {host.identity_file} is encrypted and no ssh-agent is running (SSH_AUTH_SOCK unset):"
                " load it with ssh-add, or use a key without a passphrase"
            )
    return options


def _load_identity(path: str) -> Sequence[asyncssh.SSHKeyPair] | None:
    """The key pairs of an identity file; None when it is encrypted (fleet never asks for a passphrase)."""
    try:
        return asyncssh.load_keypairs([path])
    except asyncssh.KeyImportError as exc:
        if str(exc).startswith("Passphrase"):  # how asyncssh itself tells an encrypted key (ignore_encrypted)
            return None
        raise


@contextmanager
def connect_errors(host: Host, where: Route | None = None, *, prefix: str = "", hint: str = "") -> Iterator[None]:
    """Map what connecting can raise to fleet's errors, each a one-line message.

    `where`: the host's route, once known (its port, user and jump host are named); `prefix` starts every
    message (`jump host ...: `); `hint` ends an authentication failure's.
    """
    target = where.label if where else host.address + (f":{host.port}" if host.port else "")
    who = where.user if where else host.user or "the default user"
    try:
        yield
    except asyncssh.HostKeyNotVerifiable as exc:
        hostname, port = (where.hostname, where.port) if where else (host.address, host.port or 22)
        why = untrusted(known_hosts(host), hostname, port)
        via = f" (reached{where.via})" if where and where.via else ""
        raise type(why)(f"{prefix}{why}{via}") from exc
    except asyncssh.PermissionDenied as exc:
        raise AuthError(f"{prefix}authentication failed for {who} at {target}{hint}") from exc
    except asyncssh.KeyImportError as exc:
        raise AuthError(f"{prefix}cannot load identity_file {host.identity_file}: {exc}") from exc
    except asyncssh.ChannelOpenError as exc:  # the jump host could not open the way on
        raise ConnectError(f"{prefix}cannot reach {target}: {exc.reason}") from exc
    except asyncssh.ConfigParseError as exc:
        raise ConnectError(f"{prefix}cannot read ssh_config: {exc}") from exc
    except TimeoutError as exc:  # before OSError: on 3.11 TimeoutError is an OSError
        raise ConnectError(f"{prefix}connect timed out after {host.connect_timeout:g} s ({target})",
                           timed_out=True) from exc
    except ConnectionRefusedError as exc:
        raise ConnectError(f"{prefix}connection refused ({target})") from exc
    except socket.gaierror as exc:
        raise ConnectError(f"{prefix}cannot resolve {where.hostname if where else host.address}: {exc.strerror}") \
            from exc
    except asyncssh.DisconnectError as exc:
        raise ConnectError(f"{prefix}disconnected while connecting ({target}): {exc.reason}") from exc
    except OSError as exc:
        raise ConnectError(f"{prefix}cannot connect ({target}): {exc.strerror or exc}") from exc


@contextmanager
def session_errors(host: Host) -> Iterator[None]:
    """Map what a running command can raise to ConnectionLost."""
    try:
        yield
    except (asyncssh.Error, OSError) as exc:
        raise ConnectionLost(f"session to {host.name} dropped: {_reason(exc)}") from exc


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncssh.Error):
        return exc.reason
    return str(exc) or type(exc).__name__

