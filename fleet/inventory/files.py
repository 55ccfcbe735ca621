"""The local files an SSH connection needs, checked before anything connects.

A missing `identity_file` or `known_hosts` is an inventory error (exit 2, nothing
touched), named by the key that set it, not a host found unreachable at connect
time. Only the commands that connect (`reset`, `check`, `reset --dry-run`) ask:
`fleet inventory` lists hosts on a machine that has none of their files.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from fleet.errors import InventoryError
from fleet.inventory.host import DEFAULT_KNOWN_HOSTS, Connection, Host
from fleet.inventory.load import Inventory

_KNOWN_HOSTS_HINT = "host keys are always checked; set known_hosts or run ssh-keyscan"


def check_files(inventory: Inventory, hosts: Iterable[Host]) -> None:
    """Raise `InventoryError` for the first SSH host whose key or known_hosts file is missing or unreadable."""
    checked: dict[str, str | None] = {}  # path -> what is wrong with it (None: nothing); hosts share their files
    for host in hosts:
        if host.connection is not Connection.SSH:
            continue
        for variable, path in _files(host):
            if path not in checked:
                checked[path] = _problem(Path(path).expanduser())
            problem = checked[path]
            if problem is not None:
                key = inventory.source(host.name, variable)
                raise InventoryError(str(inventory.path), key, _message(host, variable, problem))


def _files(host: Host) -> list[tuple[str, str]]:
    """(variable, path) of each file the host's SSH connection reads."""
    known_hosts = ("known_hosts", host.known_hosts or DEFAULT_KNOWN_HOSTS)
    return [("identity_file", host.identity_file), known_hosts] if host.identity_file else [known_hosts]


def _problem(path: Path) -> str | None:
    if not path.exists():
        return "does not exist"
    if not path.is_file():
        return "is not a file"
    return None if os.access(path, os.R_OK) else "cannot be read"


def _message(host: Host, variable: str, problem: str) -> str:
    if variable == "identity_file":
        return f"{host.identity_file} {problem}"
    if host.known_hosts is None:
        default = f"{DEFAULT_KNOWN_HOSTS} (the default, {Path(DEFAULT_KNOWN_HOSTS).expanduser()})"
        return f"{default} {problem} ({_KNOWN_HOSTS_HINT})"
    return f"{host.known_hosts} {problem} ({_KNOWN_HOSTS_HINT})"
