"""Transports, by the name a host's `connection:` gives them (`fleet.model.plugs.TRANSPORTS`).

A transport is a plug: a module that provides `TRANSPORT`, a `TransportPlug` whose `open` starts a session to a
host (a `Transport`, `fleet.transport.base`) and whose `where` says, in a table, where the host is reached
(`10.0.0.7:2200`, `local`). `connect` opens the one a host's `connection:` names.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fleet.inventory.host import Host
from fleet.model import plugs
from fleet.transport.base import Transport


@dataclass(frozen=True)
class TransportPlug:
    """What a transport module provides (see the module docstring)."""

    open: Callable[[Host], Awaitable[Transport]]
    where: Callable[[Host], str]


def transport_plug(name: str) -> TransportPlug:
    """The named transport's plug; ValueError for a name the registry does not know."""
    found = plugs.provided(plugs.TRANSPORTS[plugs.known(plugs.TRANSPORTS, "transport", name)], "TRANSPORT")
    assert isinstance(found, TransportPlug)
    return found


async def connect(host: Host) -> Transport:
    """An open session to host, as its `connection:` asks: SSH (the default), this machine's processes, or a
    registered transport's."""
    return await transport_plug(host.connection).open(host)


def where(host: Host) -> str:
    """Where the host is reached, as its transport says it."""
    return transport_plug(host.connection).where(host)
