"""The transport seam is a plug: a fake transport, registered by one row of `fleet.model.plugs.TRANSPORTS`, is what
a host's `connection:` names; the inventory accepts the name, a reset's commands go through it over in-process
simulated nodes, and the inventory table says where the host is as the transport says it. This module is what a
new transport writes: a class with `run`, `open_command` and `close`, and `TRANSPORT` (how to open one, where)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import ClassVar

import pytest

from fleet.app.run import run_and_report
from fleet.engine.options import RunOptions
from fleet.inventory.host import Host
from fleet.inventory.load import load_inventory
from fleet.inventory.targeting import select
from fleet.model import plugs
from fleet.model.errors import InventoryError
from fleet.model.report import HostStatus
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, WorkerSpec
from fleet.transport import ssh_plug
from fleet.transport.base import CommandResult, OpenCommand, Transport
from fleet.transport.plugs import TransportPlug, where

FAST = {"drain_timeout": 5, "kill_grace": 2, "settle_timeout": 15, "command_timeout": 5}


class Recording:
    """Records every command a host is asked to run, then runs it over SSH (the host's address and keys)."""

    opened: ClassVar[dict[str, Recording]] = {}  # the test's own record of what it opened, by host

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.notes = getattr(inner, "notes", ())
        self.ran: list[tuple[str, ...]] = []

    async def run(self, argv: Sequence[str], *, timeout: float, privileged: bool = False,
                  stdin: str | None = None) -> CommandResult:
        self.ran.append(tuple(argv))
        return await self.inner.run(argv, timeout=timeout, privileged=privileged, stdin=stdin)

    async def open_command(self, argv: Sequence[str], *, timeout: float, privileged: bool = False) -> OpenCommand:
        self.ran.append(tuple(argv))
        return await self.inner.open_command(argv, timeout=timeout, privileged=privileged)

    async def close(self) -> None:
        await self.inner.close()


async def open_recording(host: Host) -> Transport:
    Recording.opened[host.name] = recording = Recording(await ssh_plug.open_ssh(host))
    return recording


TRANSPORT = TransportPlug(open=open_recording, where=lambda host: f"recorded {ssh_plug.address(host)}")


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The one registry line; monkeypatch takes it out again after the test."""
    Recording.opened.clear()
    monkeypatch.setitem(plugs.TRANSPORTS, "recorded", __name__)
    yield
    Recording.opened.clear()


@pytest.mark.usefixtures("registered")
async def test_a_reset_goes_through_the_transport_a_hosts_connection_names(tmp_path: Path) -> None:
    """`connection: recorded` on one of two simulated nodes: both end clean, the stray on each killed; every
    command of that host went through the fake, none of the other's."""
    specs = [NodeSpec(name=name, linger_s=0.2) for name in ("gpu-01", "gpu-02")]
    host_vars: dict[str, dict[str, object]] = {"gpu-01": {**FAST, "connection": "recorded"}, "gpu-02": {**FAST}}
    async with SimFleet(tmp_path / "sim", specs, host_vars=host_vars) as sim:
        strays = {n: sim.nodes[n].spawn_worker(WorkerSpec(gpus=(0,), mib=1523, name="python3")) for n in sim.nodes}
        hosts = select(load_inventory(sim.inventory_path), groups=["sim"])
        assert [h.connection for h in hosts] == ["recorded", "ssh"]
        assert [where(h) for h in hosts] == [f"recorded {sim.address('gpu-01')}:{sim.port('gpu-01')}",
                                             f"{sim.address('gpu-02')}:{sim.port('gpu-02')}"]
        _, report = await run_and_report(hosts, RunOptions(), as_json=False, log_dir=tmp_path / "logs")
        assert not any(sim.nodes[n].alive(pid) for n, pid in strays.items())
    assert {n: h.status for n, h in report.hosts.items()} == {"gpu-01": HostStatus.CLEAN, "gpu-02": HostStatus.CLEAN}
    assert list(Recording.opened) == ["gpu-01"]
    ran = Recording.opened["gpu-01"].ran
    assert any("nvidia-smi" in " ".join(argv) for argv in ran) and any("kill" in " ".join(argv) for argv in ran)
    for node in sim.nodes.values():
        assert not [p for p in node.recorded_pids() if node.alive(p)], "teardown left a process alive"


def test_a_connection_no_transport_is_registered_for_is_an_inventory_error(tmp_path: Path) -> None:
    inventory = tmp_path / "site.yaml"
    inventory.write_text("hosts: {n1: {connection: recorded}}\n")
    with pytest.raises(InventoryError, match=r"hosts\.n1\.connection: expected 'ssh' or 'local', got 'recorded'"):
        load_inventory(inventory)
