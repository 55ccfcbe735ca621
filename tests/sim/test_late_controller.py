"""A late controller is never a node's failure: the event loop held 13 s (a blocking call on the loop, as a GC pause
or 10,000 handshakes at once would hold it) while hosts are mid-connect, and while a step is in its drain window.
Every host ends as it would have without the hold.

The nodes are simulated and served by in-process asyncssh servers on loopback, on the same event loop: the hold
stops them too, as it stops everything the controller does; the nodes' own processes run on.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.lowlevel
import pytest
from support import scripted_node

from fleet.engine.graph import run_hosts
from fleet.engine.options import RunOptions
from fleet.engine.walk import Mode
from fleet.inventory.host import Host
from fleet.inventory.load import load_inventory
from fleet.inventory.targeting import select
from fleet.model.report import HostStatus, RunReport, StepName, StepOutcome, StepStatus
from fleet.node.node import Node
from fleet.reset import kill
from fleet.runlog.folder import RunLogs
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, UnitSpec
from fleet.transport import Transport, attention, connect
from fleet.transport.base import CommandResult, OpenCommand
from fleet.transport.scripted import Reply, ScriptedTransport

# Past the default connect_timeout (10 s) and past drain_timeout (4 s) below: with either bound on the wall clock,
# the hold alone failed the host (unreachable; a unit SIGKILLed that was stopping by itself).
HOLD_S = 13.0
# A short drain window; commands given room (on a loaded test machine the node's own `timeout` must not end them).
FAST = {"drain_timeout": 4, "kill_grace": 2, "settle_timeout": 30, "command_timeout": 30}


def hold_the_loop() -> None:
    """The controller held: nothing on this event loop runs for HOLD_S."""
    time.sleep(HOLD_S)


@pytest.fixture
async def fleet(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[SimFleet]:
    specs: Sequence[NodeSpec] = request.param
    async with SimFleet(tmp_path / "sim", specs, host_vars={s.name: dict(FAST) for s in specs}) as sim:
        yield sim


async def reset(sim: SimFleet, tmp_path: Path, connector: Any) -> RunReport:
    hosts = select(load_inventory(sim.inventory_path), groups=["sim"])
    logs = RunLogs(tmp_path / "logs", f"run-{os.urandom(3).hex()}")
    logs.create()
    try:
        report, _ = await run_hosts(hosts, RunOptions(mode=Mode("reset")), logs, connector=connector)
    finally:
        logs.close()
    return report


IDLE = [NodeSpec(name=f"gpu-l0{i}") for i in range(1, 5)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fleet", [IDLE], indirect=True)
async def test_held_13s_while_hosts_are_mid_connect_every_host_ends_clean(fleet: SimFleet, tmp_path: Path) -> None:
    """Four hosts whose servers have taken the TCP connection, none of them logged in yet: the loop is held 13 s,
    past connect_timeout (10 s). Each connects and ends clean; none is unreachable."""
    connected: list[str] = []
    held: list[bool] = []

    async def connector(host: Host) -> Transport:
        transport = await connect(host)
        connected.append(host.name)
        return transport

    def mid_connect() -> bool:
        return all(server.connection_count for server in fleet.servers.values())

    async def hold_once_all_are_mid_connect() -> None:
        with anyio.fail_after(30):
            while not mid_connect():
                await anyio.lowlevel.checkpoint()
        held.append(not connected)
        hold_the_loop()

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold_once_all_are_mid_connect)
        report = await reset(fleet, tmp_path, connector)

    assert held == [True], "the hold came after a host had connected"
    for name, host in report.hosts.items():
        assert (host.status, host.error) == (HostStatus.CLEAN, None), (name, host.error)
    assert sorted(connected) == [spec.name for spec in IDLE]


class HoldBeforePoll:
    """A transport that holds the loop once, just before the first host's drain polls its unit again: the drain
    window is open, and the unit was still up at the last look."""

    held: ClassVar[list[str]] = []

    def __init__(self, inner: Transport, name: str) -> None:
        self.inner, self.name = inner, name

    async def run(self, argv: Sequence[str], *, timeout: float, privileged: bool = False,
                  stdin: str | None = None) -> CommandResult:
        words = " ".join(argv).replace("'", "")
        if not self.held and "systemctl show" in words and "systemctl stop" not in words:
            self.held.append(self.name)
            hold_the_loop()
        return await self.inner.run(argv, timeout=timeout, privileged=privileged, stdin=stdin)

    async def open_command(self, argv: Sequence[str], *, timeout: float, privileged: bool = False) -> OpenCommand:
        return await self.inner.open_command(argv, timeout=timeout, privileged=privileged)

    async def close(self) -> None:
        await self.inner.close()


# A unit whose stop takes 1.5 s: its process ignores SIGTERM, and its own TimeoutStopSec ends it (failed, timeout).
UNIT = UnitSpec(name="sglang.service", gpus=(0, 1, 2, 3, 4, 5, 6, 7), mib=30000, process_name="sglang",
                ignore_sigterm=True, timeout_stop_sec=1.5)
BUSY = [NodeSpec(name=f"gpu-l1{i}", units=(UNIT,)) for i in range(1, 4)]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("fleet", [BUSY], indirect=True)
async def test_held_13s_inside_a_drain_window_every_host_ends_clean(fleet: SimFleet, tmp_path: Path) -> None:
    """Three busy hosts whose unit takes 1.5 s to stop (drain_timeout 4 s). When the first is about to look at its
    stopping unit again (seen still up), the loop is held 13 s: its window "ended" during the hold (and its whole
    budget too, with a command_timeout under 9 s). It looks at the node again, sees the unit down, and ends clean
    without SIGKILLing it; so does every other host, wherever the hold found it."""
    HoldBeforePoll.held = []

    async def connector(host: Host) -> Transport:
        return HoldBeforePoll(await connect(host), host.name)

    report = await reset(fleet, tmp_path, connector)

    assert len(HoldBeforePoll.held) == 1
    for name, host in report.hosts.items():
        assert (host.status, host.error) == (HostStatus.CLEAN, None), (name, host.error)
        drain = next(s for s in host.steps if s.name is StepName.DRAIN)
        assert drain.detail == "sglang.service failed", name  # ended by its own stop timeout, never by fleet
        assert not [e for e in host.steps if "SIGKILL" in e.detail]


class BusyController:
    """A scripted node whose every answer costs the controller `share` seconds of work (reading the attention clock
    all along, as a host's parsing does) before the host's task waits for its next turn of the loop."""

    def __init__(self, inner: ScriptedTransport, share: float) -> None:
        self.inner, self.share = inner, share

    async def run(self, argv: Sequence[str], *, timeout: float, privileged: bool = False,
                  stdin: str | None = None) -> CommandResult:
        clock, until = attention.loop_clock(), time.monotonic() + self.share
        while time.monotonic() < until:
            clock.now()
        await anyio.lowlevel.checkpoint()  # the network wait: the next host's turn
        return await self.inner.run(argv, timeout=timeout, privileged=privileged, stdin=stdin)

    async def open_command(self, argv: Sequence[str], *, timeout: float, privileged: bool = False) -> OpenCommand:
        return await self.inner.open_command(argv, timeout=timeout, privileged=privileged)

    async def close(self) -> None:
        await self.inner.close()


def one_holder_node() -> ScriptedTransport:
    """A node with one GPU holder (pid 100, a python3 child of init) that SIGTERM ends; scans after it find none."""
    scans = iter(["root\t/proc/100/task/100/fd/3\t/dev/nvidia0\n"])
    return ScriptedTransport(script=[
        (scripted_node.SCAN, lambda argv: Reply(stdout=scripted_node.scan(next(scans, "")))),
        (("ps", "-ww"), Reply(stdout=scripted_node.ps("  100     1 root     python3 -m trainer\n"))),
        (scripted_node.EXE, scripted_node.exe_reply({100: "/usr/bin/python3.11"})),
        (scripted_node.LINEAGE, scripted_node.lineage),
        (("grep",), Reply(stdout="")),
        (("sh", "-c"), scripted_node.signal()),
    ])


@pytest.mark.timeout(120)
async def test_a_loop_busy_with_many_hosts_never_spends_a_hosts_kill_budget() -> None:
    """The 10,000-host run on a machine at load 15-68 that failed 2,450 hosts as `kill: step budget spent`: the loop
    never blocked, but each turn of it lasted seconds of the other hosts' work. Twenty hosts kill at once, each
    answer costing 0.05 s of the controller's work: a turn lasts about 1 s, the kill step's 11 turns outlast its
    6.1 s budget on the wall. Each host kills its holder and ends its step OK."""
    hosts = [Host(name=f"gpu-b{i:02d}", address="127.0.0.1", command_timeout=0.1, kill_grace=0.3) for i in range(20)]
    outcomes: dict[str, StepOutcome] = {}

    async def one(host: Host) -> None:
        node = Node(host, BusyController(one_holder_node(), share=0.05), scripted_node.Log())
        outcomes[host.name] = await kill.kill(node)

    async with anyio.create_task_group() as tg:
        for host in hosts:
            tg.start_soon(one, host)

    for name, outcome in outcomes.items():
        assert (outcome.result.status, outcome.result.error) == (StepStatus.OK, None), name
        assert [k.pid for k in outcome.killed] == [100], name
    assert len(outcomes) == len(hosts)
