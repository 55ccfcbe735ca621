"""Simulated nodes behind in-process asyncssh servers (fleet.sim.server.SimServer), each a Host to reach it by; and
fake tools on a PATH."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from fleet.inventory.host import Host
from fleet.sim.server import SimServer
from support.keys import ClientKey

SUDO_WANTS_PASSWORD = '#!/bin/sh\necho "sudo: a password is required" >&2\nexit 1\n'


@dataclass
class Node:
    server: SimServer
    host: Host


MakeNode = Callable[..., Awaitable[Node]]


def fake_bin(directory: Path, scripts: Mapping[str, str]) -> str:
    """Write executable scripts into directory; return a PATH that finds them first."""
    directory.mkdir(exist_ok=True)
    for name, text in scripts.items():
        (directory / name).write_text(text)
        (directory / name).chmod(0o755)
    return f"{directory}:{os.environ['PATH']}"


@pytest.fixture
async def make_node(tmp_path: Path, client_key: ClientKey) -> AsyncIterator[MakeNode]:
    """Start SimServers (root: a temp dir, env: ours); all stopped after the test."""
    numbers = itertools.count()
    async with AsyncExitStack() as stack:

        async def make(env: Mapping[str, str] | None = None, **host_vars: Any) -> Node:
            root = tmp_path / f"node{next(numbers)}"
            root.mkdir()
            server = SimServer(root, env or os.environ, client_key.key)
            await stack.enter_async_context(server)
            known_hosts = root / "known_hosts"
            known_hosts.write_text(server.known_hosts_line() + "\n")
            host = Host(
                name=root.name,
                address="127.0.0.1",
                port=server.port,
                identity_file=str(client_key.path),
                known_hosts=str(known_hosts),
                connect_timeout=5,
            )
            return Node(server, replace(host, **host_vars))

        yield make
