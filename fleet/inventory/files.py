"""The local files an SSH connection needs, checked before anything connects.

A missing `identity_file` or `known_hosts` is an inventory error (exit 2, nothing
touched), named by the key that set it, not a host found unreachable at connect
time. With `known_hosts` unset, the default files are read as OpenSSH reads them
(the user's and the system's, every one that exists): that none exists is the
error then. Only the commands that connect (`reset`, `check`, `reset --dry-run`)
ask: `fleet inventory` lists hosts on a machine that has none of their files.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from fleet.inventory.host import Connection, Host, default_known_hosts
from fleet.inventory.load import Inventory
from fleet.model.errors import InventoryError

_KNOWN_HOSTS_HINT = "host keys are always checked; set known_hosts or run ssh-keyscan"


def check_files(inventory: Inventory, hosts: Iterable[Host]) -> None:
    """Raise `InventoryError` for the first SSH host whose key or known_hosts file is missing or unreadable."""
    checked: dict[str, str | None] = {}  # path -> what is wrong with it (None: nothing); hosts share their files
    defaults: list[str | None] = []  # what is wrong with the default known_hosts files, once checked
    for host in hosts:
        if host.connection != Connection.SSH:
            continue
        for variable, path in _files(host):
            if path not in checked:
                checked[path] = _problem(Path(path).expanduser())
            problem = checked[path]
            if problem is not None:
                key = inventory.source(host.name, variable)
                raise InventoryError(inventory.named, key, _message(host, variable, problem))
        if host.known_hosts is None:
            if not defaults:
                defaults.append(_defaults_problem())
            if defaults[0] is not None:
                raise InventoryError(inventory.named, inventory.source(host.name, "known_hosts"), defaults[0])


def _files(host: Host) -> list[tuple[str, str]]:
    """(variable, path) of each file the host's SSH connection reads that the inventory names."""
    files = [("identity_file", host.identity_file)] if host.identity_file else []
    return files + ([("known_hosts", host.known_hosts)] if host.known_hosts else [])


def _problem(path: Path) -> str | None:
    if not path.exists():
        return "does not exist"
    if not path.is_file():
        return "is not a file"
    return None if os.access(path, os.R_OK) else "cannot be read"


def _message(host: Host, variable: str, problem: str) -> str:
    if variable == "identity_file":
        return f"{host.identity_file} {problem}"
    return f"{host.known_hosts} {problem} ({_KNOWN_HOSTS_HINT})"


def _defaults_problem() -> str | None:
    """What is wrong with the default known_hosts files: none exists, or one that exists cannot be read."""
    files = default_known_hosts()
    existing = [f for f in files if f.path.exists()]
    for f in existing:
        problem = _problem(f.path)
        if problem is not None:
            return f"{f.written} (a default known_hosts, {f.path}) {problem} ({_KNOWN_HOSTS_HINT})"
    if existing:
        return None
    first, *others = files
    names = [f"the system's {f.written}" if f.system and not before.system else f.written
             for before, f in zip(files, others, strict=False)]
    return (f"{first.written} (the default, {first.path}), like {', '.join(names[:-1])} and {names[-1]},"
            f" does not exist ({_KNOWN_HOSTS_HINT})")
