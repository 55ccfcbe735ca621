"""Opening a connection (fleet.transport.ssh.dial) against an in-process asyncssh server on loopback: the name is
resolved by fleet within its own bound, the host key still checked against the name, each address tried in turn."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import asyncssh
import pytest
from support.keys import ClientKey

from fleet.inventory.host import Host
from fleet.model.errors import ConnectError, HostKeyError
from fleet.model.report import Reason
from fleet.sim.server import SimServer
from fleet.transport.ssh import Route, open_ssh
from fleet.transport.ssh.dial import open_socket, resolve


@pytest.fixture
async def server(tmp_path: Path, client_key: ClientKey) -> AsyncIterator[SimServer]:
    async with SimServer(tmp_path, os.environ, client_key.key) as started:
        yield started


def by_name(server: SimServer, client_key: ClientKey, tmp_path: Path, known_as: str) -> Host:
    """The host as `localhost`, its key in known_hosts under `known_as`."""
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[{known_as}]:{server.port} {server.host_key_line}\n")
    return Host(name="gpu-n01", address="localhost", port=server.port, identity_file=str(client_key.path),
                known_hosts=str(known_hosts), connect_timeout=5)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_a_host_named_by_a_name_is_resolved_and_its_key_checked_against_the_name(
    server: SimServer, client_key: ClientKey, tmp_path: Path
) -> None:
    async with await open_ssh(by_name(server, client_key, tmp_path, "localhost")) as ssh:
        assert (await ssh.run(["echo", "hi"], timeout=5)).stdout == "hi\n"


async def test_a_key_known_under_another_name_is_still_refused(
    server: SimServer, client_key: ClientKey, tmp_path: Path
) -> None:
    with pytest.raises(HostKeyError, match=r"^host key of \[localhost\]:\d+ unknown: \[localhost\]:\d+ is not in "):
        await open_ssh(by_name(server, client_key, tmp_path, "gpu-elsewhere"))


async def test_a_name_that_does_not_resolve_says_so(server: SimServer, client_key: ClientKey, tmp_path: Path) -> None:
    host = by_name(server, client_key, tmp_path, "localhost")
    with pytest.raises(ConnectError, match=r"^cannot resolve gpu-n02\.invalid: ") as caught:
        await open_ssh(replace(host, address="gpu-n02.invalid"))
    assert caught.value.reason in (Reason.CONNECT_REFUSED, Reason.CONNECT_TIMEOUT)


async def test_an_address_needs_no_lookup() -> None:
    host = Host(name="gpu-n03", address="::1")
    assert await resolve(host, Route(hostname="::1", port=2222, user="root")) == ((socket.AF_INET6, ("::1", 2222)),)
    assert await resolve(host,
                         Route(hostname="127.0.0.9", port=22, user="root")) == ((socket.AF_INET, ("127.0.0.9", 22)),)


async def test_each_address_is_tried_in_turn_and_the_last_error_is_raised(server: SimServer) -> None:
    refused = (socket.AF_INET, ("127.0.0.1", closed_port()))
    sock = await open_socket([refused, (socket.AF_INET, ("127.0.0.1", server.port))])
    try:
        assert sock.getpeername() == ("127.0.0.1", server.port)
    finally:
        sock.close()
    with pytest.raises(ConnectionRefusedError):
        await open_socket([refused])


async def test_the_socket_fleet_opened_carries_the_whole_session(server: SimServer, client_key: ClientKey,
                                                                 tmp_path: Path) -> None:
    """One connection on the server, commands on it, closed with it."""
    async with await open_ssh(by_name(server, client_key, tmp_path, "localhost")) as ssh:
        for _ in range(2):
            assert (await ssh.run(["true"], timeout=5)).ok
        assert server.connection_count == 1
    with pytest.raises((asyncssh.Error, OSError, ConnectError)):
        await open_ssh(Host(name="gpu-n04", address="127.0.0.1", port=closed_port(), connect_timeout=2,
                            known_hosts=str(tmp_path / "known_hosts")))
