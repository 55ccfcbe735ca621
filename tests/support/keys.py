"""A client key pair for SSH tests: the private half in OpenSSH format, mode 600."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import asyncssh


@dataclass(frozen=True)
class ClientKey:
    """An ed25519 key pair; the private half in OpenSSH format at `path` (mode 600)."""

    path: Path
    key: asyncssh.SSHKey

    @property
    def public_line(self) -> str:
        return self.key.export_public_key().decode().strip()


def make_client_key(path: Path) -> ClientKey:
    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(path)
    os.chmod(path, 0o600)
    return ClientKey(path, key)
