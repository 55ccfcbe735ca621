"""The SSH and local transports against an in-process asyncssh server and local processes.

What is asserted is what the node saw and what is left running there, not how
asyncssh was called.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import anyio
import asyncssh
import pytest
import yaml
from support.keys import make_client_key
from support.sim_servers import SUDO_WANTS_PASSWORD, MakeNode, Node, fake_bin
from support.sim_servers import make_node as make_node  # the fixture: SimServers stopped after the test
from support.waits import alive, eventually, gone_within, line_within

from fleet.inventory.host import Connection, Host
from fleet.model.errors import AuthError, CommandTimeout, ConnectError, ConnectionLost, HostKeyError
from fleet.model.report import Reason
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, UnitSpec
from fleet.transport import connect
from fleet.transport import ssh as ssh_module
from fleet.transport.base import Note
from fleet.transport.liveness import silence_s
from fleet.transport.local import LocalTransport
from fleet.transport.ssh import SshTransport, open_ssh

# Stands in for coreutils' timeout on a node whose own bound does not work:
# drops `-k K T` and runs the command unbounded, so only the client deadline is left.
UNBOUNDED_TIMEOUT = '#!/bin/sh\nshift 3\nexec "$@"\n'






@pytest.fixture
async def node(make_node: MakeNode) -> Node:
    return await make_node()


@pytest.fixture
async def ssh(node: Node) -> AsyncIterator[SshTransport]:
    transport = await open_ssh(node.host)
    yield transport
    await transport.close()


async def test_stdout_and_stderr_come_apart_and_exit_status_is_data(ssh: SshTransport) -> None:
    """A non-zero exit is a result, not an exception; the streams are not merged."""
    result = await ssh.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=5)
    assert (result.exit_status, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert result.argv == ("sh", "-c", "echo out; echo err >&2; exit 3")
    assert not result.ok and result.signal is None and result.duration_s >= 0


async def test_death_by_signal_is_data(ssh: SshTransport) -> None:
    """Not an exception. The sim runs `/bin/sh -c`: dash forks and reports 128+n, while
    bash (and the real sshd test) execs the command, whose signal then comes back as such."""
    result = await ssh.run(["sh", "-c", "kill -TERM $$"], timeout=5)
    assert (result.exit_status, result.signal) in {(143, None), (None, "SIGTERM")}


async def test_arguments_arrive_as_single_words_and_are_not_executed(ssh: SshTransport, tmp_path: Path) -> None:
    """Spaces, quotes, `;` and `$(...)` reach the program as one argv element each."""
    marker = tmp_path / "injected"
    words = [f"a b; touch {marker}", f"$(touch {marker})", 'it\'s "quoted"', "`id`", "*"]
    result = await ssh.run(["printf", "%s\\n", *words], timeout=5)
    assert result.stdout.splitlines() == words
    assert not marker.exists()


async def test_commands_share_one_connection(ssh: SshTransport, node: Node) -> None:
    for _ in range(3):
        assert (await ssh.run(["true"], timeout=5)).ok
    assert node.server.connection_count == 1


async def test_remote_timeout_raises_with_partial_output_and_ends_the_process(ssh: SshTransport) -> None:
    """The node's own bound fires first: CommandTimeout carries what was printed."""
    started = time.monotonic()
    with pytest.raises(CommandTimeout) as caught:
        await ssh.run(["sh", "-c", "echo $$; exec sleep 60"], timeout=1)
    assert time.monotonic() - started < 30  # the bound ended it, not the sleep's own 60 s
    pid = int(caught.value.result.stdout)
    assert await gone_within(pid, 20), f"sleep {pid} outlived its command"


async def test_client_deadline_ends_the_process_when_the_node_bound_does_not(
    make_node: MakeNode, tmp_path: Path
) -> None:
    """With `timeout` broken on the node, the client deadline closes the channel and the server kills the
    command's whole session; the session answers keepalives, so it is slow, not silent: the channel is given
    one silence bound past the deadline (a starved sshd's exit status arrives late), no more."""
    node = await make_node({**os.environ, "PATH": fake_bin(tmp_path / "bin", {"timeout": UNBOUNDED_TIMEOUT})})
    started = time.monotonic()
    async with await open_ssh(node.host) as ssh:
        with pytest.raises(CommandTimeout) as caught:
            await ssh.run(["sh", "-c", "echo $$; sleep 60 & echo $!; wait"], timeout=0.5)
        assert time.monotonic() - started < 0.5 + 3 + silence_s(node.host.connect_timeout) + 2
        pids = [int(line) for line in caught.value.result.stdout.split()]
        assert len(pids) == 2, "partial output is kept"
        for pid in pids:
            assert await gone_within(pid, 20), f"pid {pid} outlived the client deadline"
        assert (await ssh.run(["echo", "still usable"], timeout=5)).stdout == "still usable\n"


async def test_cancelled_run_ends_the_remote_process(ssh: SshTransport, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    with anyio.move_on_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: ssh.run(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"], timeout=30))
            pid = int(await line_within(pidfile, 20))
            tg.cancel_scope.cancel()
    assert await gone_within(pid, 20)
    assert (await ssh.run(["true"], timeout=5)).ok


async def test_dropped_connection_mid_command_is_connection_lost(ssh: SshTransport, node: Node, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"

    async def drop_once_started() -> None:
        pid = int(await line_within(pidfile, 20))
        node.server.drop_connections()
        assert await gone_within(pid, 20), "the server must kill what a dropped session started"

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(drop_once_started)
            with pytest.raises(ConnectionLost):
                await ssh.run(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"], timeout=30)
        with pytest.raises(ConnectionLost):
            await ssh.run(["true"], timeout=5)


async def test_sudo_wanting_a_password_is_auth_error(make_node: MakeNode, tmp_path: Path) -> None:
    """Under become only a privileged command goes through sudo; a sudo that asks is one AuthError line."""
    path = fake_bin(tmp_path / "bin", {"sudo": SUDO_WANTS_PASSWORD})
    node = await make_node({**os.environ, "PATH": path}, become=True)
    async with await open_ssh(node.host) as ssh:
        assert (await ssh.run(["true"], timeout=5)).ok
        with pytest.raises(AuthError) as caught:
            await ssh.run(["kill", "-s", "TERM", "--", "1"], timeout=5, privileged=True)
    assert str(caught.value) == (
        f"sudo -n on {node.host.name} needs a password for kill: allow it in sudoers (NOPASSWD) or run as root"
    )
    assert re.match(r"env FLEET_CMD=[0-9a-f]{16} timeout ", node.server.commands[0])
    assert re.match(r"timeout -k 1 5\.0 sudo -n env FLEET_CMD=[0-9a-f]{16} timeout -k 1 5\.0 kill ",
                    node.server.commands[1])


async def test_refused_port_is_connect_error(node: Node) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectError, match=rf"connection refused \(127.0.0.1:{port}\)"):
        await open_ssh(replace(node.host, port=port))


async def test_stalled_server_is_connect_timeout(node: Node) -> None:
    """A port that accepts and never speaks is given up after connect_timeout."""
    await node.server.stall()
    started = time.monotonic()
    with pytest.raises(ConnectError, match=r"connect timed out after 1 s") as caught:
        await open_ssh(replace(node.host, connect_timeout=1))
    assert time.monotonic() - started < 30  # a stalled server never speaks: connect_timeout ended it
    assert caught.value.reason is Reason.CONNECT_TIMEOUT


async def test_wrong_host_key_is_host_key_error_and_nothing_runs(node: Node, tmp_path: Path) -> None:
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    known_hosts = tmp_path / "wrong_known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{node.host.port} {other}\n")
    with pytest.raises(HostKeyError, match="host key"):
        await open_ssh(replace(node.host, known_hosts=str(known_hosts)))
    assert node.server.commands == []


async def test_known_hosts_is_parsed_once_and_again_when_it_changes(node: Node, tmp_path: Path) -> None:
    """One parse serves every connection (a fleet's file has a line a host); an edited file is read anew."""
    right = await anyio.Path(node.host.known_hosts or "").read_text()
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{node.host.port} {other}\n")
    host = replace(node.host, known_hosts=str(known_hosts))
    with pytest.raises(HostKeyError):
        await open_ssh(host)
    known_hosts.write_text(right)
    first, second = await open_ssh(host), await open_ssh(host)
    await first.close()
    await second.close()
    assert ssh_module.connect_options(host)["known_hosts"] is ssh_module.connect_options(host)["known_hosts"]


def test_known_hosts_is_read_as_openssh_reads_it(tmp_path: Path) -> None:
    """Lines that cannot be parsed are skipped (and named, from 1); comments and blank lines are no lines."""
    key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    path = tmp_path / "known_hosts"
    path.write_text(f"# fleet\n@cert-authority\n\n[127.0.0.1]:2222 {key}\r\n|1|c2FsdA== {key}\nhost\n")
    known = ssh_module.read_known_hosts(str(path))
    assert known.skipped == (2, 5, 6)
    assert known.notes() == (Note("known_hosts_skipped", {"path": str(path), "lines": [2, 5, 6]}),)
    assert known.lines == (f"[127.0.0.1]:2222 {key}",)
    path.write_text(f"# fleet\n[127.0.0.1]:2222 {key}\n")
    assert ssh_module.read_known_hosts(str(path)).notes() == ()


async def test_known_hosts_without_a_usable_line_is_host_key_error(node: Node, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("@cert-authority\n# only this\n")
    with pytest.raises(HostKeyError, match=r"has no line that can be read \(lines skipped: 1\)"):
        await open_ssh(replace(node.host, known_hosts=str(known_hosts)))
    assert node.server.connection_count == 0


async def test_missing_known_hosts_is_host_key_error(node: Node, tmp_path: Path) -> None:
    """Never a fallback to no checking."""
    with pytest.raises(HostKeyError, match="does not exist"):
        await open_ssh(replace(node.host, known_hosts=str(tmp_path / "absent")))
    assert node.server.connection_count == 0


async def test_wrong_client_key_is_auth_error(node: Node, tmp_path: Path) -> None:
    stranger = make_client_key(tmp_path / "stranger_key")
    with pytest.raises(AuthError, match="authentication failed"):
        await open_ssh(replace(node.host, identity_file=str(stranger.path)))
    assert node.server.commands == []


async def test_close_is_idempotent(node: Node) -> None:
    ssh = await open_ssh(node.host)
    await ssh.close()
    await ssh.close()
    with pytest.raises(ConnectionLost):
        await ssh.run(["true"], timeout=5)
    assert await eventually(lambda: node.server.connection_count == 0, 20)


async def test_connect_dispatches_on_connection(node: Node) -> None:
    local = await connect(replace(node.host, connection=Connection.LOCAL))
    remote = await connect(node.host)
    try:
        assert isinstance(local, LocalTransport) and isinstance(remote, SshTransport)
    finally:
        await remote.close()
        await local.close()


# --- LocalTransport: the same semantics without SSH ---------------------------------------

LOCAL = Host(name="self", address="localhost", connection=Connection.LOCAL)


async def test_local_streams_apart_and_exit_status_is_data() -> None:
    result = await LocalTransport(LOCAL).run(["sh", "-c", "echo out; echo err >&2; exit 4"], timeout=5)
    assert (result.exit_status, result.stdout, result.stderr) == (4, "out\n", "err\n")
    assert result.argv == ("sh", "-c", "echo out; echo err >&2; exit 4")


async def test_local_death_by_signal_is_data() -> None:
    result = await LocalTransport(LOCAL).run(["sh", "-c", "kill -TERM $$"], timeout=5)
    assert (result.exit_status, result.signal) == (None, "SIGTERM")


async def test_local_arguments_are_not_executed(tmp_path: Path) -> None:
    marker = tmp_path / "injected"
    result = await LocalTransport(LOCAL).run(["echo", f"$(touch {marker}); x"], timeout=5)
    assert result.stdout == f"$(touch {marker}); x\n" and not marker.exists()


async def test_local_node_bound_raises_command_timeout() -> None:
    with pytest.raises(CommandTimeout) as caught:
        await LocalTransport(LOCAL).run(["sh", "-c", "echo $$; exec sleep 60"], timeout=0.5)
    assert caught.value.result.exit_status == 124
    assert await gone_within(int(caught.value.result.stdout), 20)


async def test_local_client_deadline_kills_the_whole_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", fake_bin(tmp_path / "bin", {"timeout": UNBOUNDED_TIMEOUT}))
    started = time.monotonic()
    with pytest.raises(CommandTimeout) as caught:
        await LocalTransport(LOCAL).run(["sh", "-c", "echo $$; sleep 60 & echo $!; wait"], timeout=0.5)
    assert time.monotonic() - started < 30  # the deadline ended it, not the sleep's own 60 s
    pids = [int(p) for p in caught.value.result.stdout.split()]
    assert len(pids) == 2
    for pid in pids:
        assert await gone_within(pid, 20)


async def test_local_cancel_kills_the_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    with anyio.move_on_after(30):
        async with anyio.create_task_group() as tg:
            argv = ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"]
            tg.start_soon(lambda: LocalTransport(LOCAL).run(argv, timeout=30))
            pid = int(await line_within(pidfile, 20))
            tg.cancel_scope.cancel()
    assert await gone_within(pid, 20)


async def test_local_sudo_wanting_a_password_is_auth_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", fake_bin(tmp_path / "bin", {"sudo": SUDO_WANTS_PASSWORD}))
    with pytest.raises(AuthError, match="sudo -n on self needs a password for true: allow it in sudoers"):
        await LocalTransport(replace(LOCAL, become=True)).run(["true"], timeout=5, privileged=True)


# --- SimFleet: many nodes, each on its own address with its own host key -------------------


def inventory_host(sim: SimFleet, name: str) -> Host:
    """The Host the inventory written by SimFleet describes (read without fleet.inventory)."""
    entry = yaml.safe_load(sim.inventory_path.read_text())["hosts"][name]
    fields = ("address", "port", "user", "identity_file", "known_hosts")
    return Host(name=name, connect_timeout=5, **{k: entry[k] for k in fields})


def node_names(count: int) -> list[str]:
    return [f"gpu-{i:02d}" for i in range(1, count + 1)]


async def test_sim_fleet_serves_16_nodes_each_with_its_own_address_and_key(tmp_path: Path) -> None:
    """(How fast they start is `make bench`'s to say, not a timed assertion's: this machine may be loaded.)"""
    names = node_names(16)
    specs = [NodeSpec(name=n, units=(UnitSpec(name="sglang.service", gpus=(0, 1)),)) for n in names]
    async with SimFleet(tmp_path / "sim", specs, groups={"pair": names[:2]}, host_vars={names[0]: {"gpus": 7}}) as sim:
        inventory = yaml.safe_load(sim.inventory_path.read_text())
        assert inventory["groups"] == {"sim": {"hosts": names}, "pair": {"hosts": names[:2]}}
        first = inventory["hosts"][names[0]]
        assert first["gpus"] == 7 and first["services"] == ["sglang.service"]
        assert first["devices"] == [sim.nodes[names[0]].devices_glob]
        known = sim.known_hosts_path.read_text().splitlines()
        assert [line.split()[0] for line in known] == [f"[{sim.address(n)}]:{sim.port(n)}" for n in names]
        assert len({line.split()[2] for line in known}) == 16, "every node has its own host key"
        assert len({sim.address(n) for n in names}) == 16
        assert sim.client_key_path.stat().st_mode & 0o777 == 0o600
        async with await open_ssh(inventory_host(sim, names[-1])) as ssh:
            result = await ssh.run([first["nvidia_smi"].replace(names[0], names[-1]), "-L"], timeout=10)
        assert result.ok and result.stdout.count("GPU ") == 8
        pids = [p for node in sim.nodes.values() for p in node.recorded_pids()]
    assert pids and not [p for p in pids if alive(p)], "exit ends every node's processes"


async def test_sim_fleet_stopped_server_refuses_and_corrupt_key_is_rejected(tmp_path: Path) -> None:
    names = node_names(3)
    async with SimFleet(tmp_path / "sim", [NodeSpec(name=n) for n in names]) as sim:
        await sim.stop_server(names[0])
        sim.corrupt_host_key(names[1])
        with pytest.raises(ConnectError, match="refused"):
            await open_ssh(inventory_host(sim, names[0]))
        with pytest.raises(HostKeyError):
            await open_ssh(inventory_host(sim, names[1]))
        assert sim.servers[names[1]].commands == []
        async with await open_ssh(inventory_host(sim, names[2])) as ssh:
            assert (await ssh.run(["true"], timeout=5)).ok


async def test_sim_fleet_cancelled_while_starting_leaves_nothing_running(tmp_path: Path) -> None:
    """Cancelled once the first node has started a process: exit still ends them all."""
    root = tmp_path / "sim"
    sim = SimFleet(root, [NodeSpec(name=n, units=(UnitSpec(name="a.service"),)) for n in node_names(4)])

    def some_node_started() -> bool:
        return any(log.stat().st_size for log in root.glob("nodes/*/state/pids.log"))

    async with anyio.create_task_group() as tg:

        async def cancel_once_started() -> None:
            assert await eventually(some_node_started, 10)
            tg.cancel_scope.cancel()

        tg.start_soon(cancel_once_started)
        async with sim:
            pytest.fail("the fleet should not have finished starting")
    pids = [p for node in sim.nodes.values() for p in node.recorded_pids()]
    assert pids, "the nodes had started processes when the cancel came"
    assert not [p for p in pids if alive(p)]
