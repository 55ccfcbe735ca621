"""A HOME of the test's own for SSH client tests: ~/.ssh/config read from it, no agent, no system known_hosts."""

from __future__ import annotations

from pathlib import Path

import asyncssh
import pytest

from fleet.inventory import host as host_module


def public_line(key: asyncssh.SSHKey) -> str:
    return key.export_public_key().decode().strip()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of the test's own (asyncssh reads ~/.ssh/config from $HOME), no agent, no system known_hosts."""
    path = tmp_path / "home"
    (path / ".ssh").mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("HOME", str(path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    etc = tmp_path / "etc"
    monkeypatch.setattr(host_module, "SYSTEM_KNOWN_HOSTS", (str(etc / "ssh_known_hosts"),
                                                            str(etc / "ssh_known_hosts2")))
    return path


def write_config(home: Path, text: str) -> None:
    (home / ".ssh" / "config").write_text(text)


ENCRYPTED = (
    "identity_file {path} is encrypted and no ssh-agent is running (SSH_AUTH_SOCK unset): load it with ssh-add,"
    " or use a key without a passphrase"
)


def encrypted_key(path: Path) -> asyncssh.SSHKey:
    key = asyncssh.generate_private_key("ssh-ed25519")
    path.write_bytes(key.export_private_key("pkcs8-pem", passphrase="secret"))  # OpenSSH's format needs bcrypt
    path.chmod(0o600)
    return key
