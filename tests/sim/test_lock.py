"""The host's reset lock: `Transport.hold` on the local and in-process SSH transports, `host_lock`, the runner.

Real `flock` on temp files where a lock is taken; a scripted transport where only
the runner's decisions are checked.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import asyncssh
import pytest
from support import scripted_node
from support.processes import lock_held
from support.scripted_node import Log
from support.scripted_run import make_host, node_script, run
from support.sim_servers import SUDO_WANTS_PASSWORD, MakeNode, fake_bin
from support.sim_servers import make_node as make_node  # the fixture: SimServers stopped after the test
from support.waits import gone_within, line_within

from fleet.engine.walk import Mode
from fleet.inventory import validate
from fleet.inventory.host import Host
from fleet.inventory.load import load_inventory
from fleet.model.errors import CommandTimeout, InventoryError
from fleet.model.report import HostStatus, Reason, StepStatus
from fleet.node.node import Node
from fleet.node.probe import action
from fleet.reset import lock
from fleet.reset.lock import LockBusy, LockError, host_lock
from fleet.transport.base import OpenCommand, Transport
from fleet.transport.local import LocalTransport
from fleet.transport.scripted import Reply, ScriptedTransport
from fleet.transport.ssh import open_ssh

BUSY_OWNER = (("cat", "--"), Reply(stdout="run-a\n"))
LOCK_CMD = ("sh", "-c", lock.LOCK_SH)
OpenTransport = Callable[[Host], Awaitable[Transport]]


# --- pure parts ------------------------------------------------------------------------------


def test_lock_argv_and_owner_parsing() -> None:
    argv = lock.lock_argv("/run/fleet/reset.lock", "20261202T110501Z-3f9c2a", 10)
    assert argv == ["sh", "-c", lock.LOCK_SH, "fleet-lock", "/run/fleet/reset.lock", "10", "20261202T110501Z-3f9c2a",
                    "/run/fleet/reset.lock.owner"]
    assert lock.is_lock_argv(argv) and not lock.is_lock_argv(["sh", "-c", "x", "fleet-signal"])
    assert "#" not in lock.LOCK_SH  # comments stay home
    assert lock.parse_owner("run-a\n") == "run-a"
    assert lock.parse_owner("") is None
    assert lock.parse_owner("$(reboot)\n") is None
    with pytest.raises(ValueError, match="invalid run id"):
        lock.lock_argv("/run/lock/x.lock", "a b; reboot", 10)


@pytest.mark.parametrize("bad", ["run/fleet.lock", "/run/fleet/../x.lock", "/run/fleet/a b.lock", "/run/fleet/",
                                 "/run/$(reboot).lock", ""])
def test_lock_file_must_be_a_plain_absolute_path(bad: str) -> None:
    with pytest.raises(ValueError, match=r"lock file|must not be empty"):
        validate.lock_file(bad)


@pytest.mark.parametrize("shared", ["/tmp/fleet.lock", "/run/lock/fleet-reset.lock", "/var/lock/x.lock",
                                    "/var/tmp/x.lock", "/run/fleet.lock"])
def test_a_lock_file_right_in_a_shared_folder_is_refused(shared: str) -> None:
    with pytest.raises(ValueError, match=r"must be in a folder of fleet's own .*, not right in /.*: fleet keeps"):
        validate.lock_file(shared)
    assert validate.lock_file(shared.rsplit("/", 1)[0] + "/fleet/reset.lock")  # a folder of its own in there


def test_lock_file_is_a_host_variable(tmp_path: Path) -> None:
    path = tmp_path / "site.yaml"
    path.write_text("hosts:\n  gpu-01: {}\n  gpu-02: {lock_file: /var/run/fleet/gpu.lock}\n")
    hosts = load_inventory(path).hosts
    assert hosts["gpu-01"].lock_file == "/run/fleet/reset.lock"
    assert hosts["gpu-02"].lock_file == "/var/run/fleet/gpu.lock"
    path.write_text("hosts:\n  gpu-01: {lock_file: fleet.lock}\n")
    with pytest.raises(InventoryError, match="lock_file"):
        load_inventory(path)


# --- Transport.hold on real processes ---------------------------------------------------------


@pytest.fixture
async def open_transport(make_node: MakeNode, request: pytest.FixtureRequest) -> AsyncIterator[OpenTransport]:
    """`local` or `ssh` (an in-process SimServer): a transport for a host with the given variables."""
    opened: list[Transport] = []

    async def open_one(host: Host) -> Transport:
        if request.param == "local":
            return LocalTransport(host)
        node = await make_node(os.environ)
        transport = await open_ssh(replace(node.host, name=host.name, become=host.become, lock_file=host.lock_file))
        opened.append(transport)
        return transport

    yield open_one
    for transport in opened:
        await transport.close()


both = pytest.mark.parametrize("open_transport", ["local", "ssh"], indirect=True)


async def test_the_sim_server_passes_stdin_and_its_eof_to_the_command(make_node: MakeNode) -> None:
    node = await make_node(os.environ)
    host = node.host
    async with asyncssh.connect(host.address, port=host.port, known_hosts=host.known_hosts,
                                client_keys=[host.identity_file]) as conn:
        result = await conn.run("cat; echo done", input="hello\n", check=False)
        quiet = await conn.run("echo no stdin needed", stdin=asyncssh.DEVNULL, check=False)
    assert (result.exit_status, result.stdout) == (0, "hello\ndone\n")
    assert (quiet.exit_status, quiet.stdout) == (0, "no stdin needed\n")


@both
async def test_hold_keeps_the_command_until_release_then_eof_ends_it(open_transport: OpenTransport,
                                                                      tmp_path: Path) -> None:
    transport = await open_transport(make_host())
    pidfile = tmp_path / "pid"
    held = await transport.open_command(["sh", "-c", 'echo $$ > "$1"; echo ready; exec cat', "x", str(pidfile)],
                                        timeout=30)
    pid = int(await line_within(pidfile, 20))
    assert held.first_line == "ready" and held.running and held.result is None
    await anyio.sleep(0.2)
    assert not await gone_within(pid, 0), "the held command ended before release"
    result = await held.release()
    assert result is not None and result.exit_status == 0 and result.stdout == "ready\n"
    assert await gone_within(pid, 20)
    assert await held.release() is result  # idempotent


@both
async def test_a_command_that_ends_before_its_first_line_is_a_result(open_transport: OpenTransport) -> None:
    transport = await open_transport(make_host())
    held = await transport.open_command(["sh", "-c", "echo no lock >&2; exit 3"], timeout=10)
    assert not held.running
    assert held.result is not None and held.result.exit_status == 3 and held.result.stderr == "no lock\n"
    assert await held.release() is held.result


@both
async def test_cancel_while_waiting_for_the_first_line_ends_the_command(open_transport: OpenTransport,
                                                                        tmp_path: Path) -> None:
    transport = await open_transport(make_host())
    pidfile = tmp_path / "pid"
    argv = ["sh", "-c", 'echo $$ > "$1"; exec sleep 60', "x", str(pidfile)]
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: transport.open_command(argv, timeout=30))
            pid = int(await line_within(pidfile, 20))  # it runs, and says no line
            tg.cancel_scope.cancel()
    assert await gone_within(pid, 20)


@both
async def test_no_first_line_within_the_remote_bound_is_a_timeout(open_transport: OpenTransport) -> None:
    transport = await open_transport(make_host())
    with anyio.fail_after(10), pytest.raises(CommandTimeout):
        await transport.open_command(["sleep", "60"], timeout=0.5)


# --- host_lock with real flock ----------------------------------------------------------------


@asynccontextmanager
async def remote_for(open_transport: OpenTransport, host: Host) -> AsyncIterator[tuple[Node, Log]]:
    events = Log()
    transport = await open_transport(host)
    try:
        yield Node(host, transport, events), events
    finally:
        await transport.close()


@both
async def test_a_second_holder_waits_then_is_told_who_holds(open_transport: OpenTransport, tmp_path: Path) -> None:
    host = make_host(lock_file=str(tmp_path / "fleet-reset.lock"))
    async with remote_for(open_transport, host) as (first, first_log), remote_for(open_transport, host) as (
        second, second_log
    ):
        async with host_lock(first, "run-a", held_s=60, wait_s=5):
            assert lock_held(host.lock_file)
            started = anyio.current_time()
            with pytest.raises(LockBusy) as caught:
                async with host_lock(second, "run-b", held_s=60, wait_s=0.5):
                    pytest.fail("two holders at once")
            assert anyio.current_time() - started >= 0.5
        assert not lock_held(host.lock_file)
        async with host_lock(second, "run-b", held_s=60, wait_s=0.5):
            assert (tmp_path / "fleet-reset.lock.owner").read_text() == "run-b\n"
    assert str(caught.value) == "locked by run run-a" and caught.value.owner == "run-a"
    assert first_log.names() == ["lock_acquired", "command", "lock_released"]
    assert first_log.first("lock_released")["exit_status"] == 0
    assert second_log.names()[:3] == ["command", "command", "lock_busy"]
    assert second_log.first("lock_busy")["owner"] == "run-a"


@both
async def test_the_lock_is_released_when_the_block_raises(open_transport: OpenTransport, tmp_path: Path) -> None:
    host = make_host(lock_file=str(tmp_path / "fleet-reset.lock"))
    async with remote_for(open_transport, host) as (remote, _):
        with pytest.raises(RuntimeError, match="step blew up"):
            async with host_lock(remote, "run-a", held_s=60, wait_s=1):
                raise RuntimeError("step blew up")
        assert not lock_held(host.lock_file)
        with anyio.CancelScope() as scope:
            async with host_lock(remote, "run-a", held_s=60, wait_s=1):
                scope.cancel()
                await anyio.sleep(5)
        assert not lock_held(host.lock_file)


@both
async def test_a_lock_file_that_cannot_be_opened_is_a_lock_error(open_transport: OpenTransport,
                                                                 tmp_path: Path) -> None:
    host = make_host(lock_file=str(tmp_path / "missing" / "run" / "fleet-reset.lock"))
    async with remote_for(open_transport, host) as (remote, _):
        with pytest.raises(LockError, match=r"^cannot create the reset lock folder .*missing/run as uid \d+ \(\w+\): "
                                            r"No such file or directory$") as caught:
            async with host_lock(remote, "run-a", held_s=60, wait_s=1):
                pytest.fail("locked a file in a missing directory")
    assert caught.value.reason is Reason.PROBE_FAILED


async def test_sudo_that_asks_for_the_lock_is_one_line(make_node: MakeNode, tmp_path: Path) -> None:
    node = await make_node({**os.environ, "PATH": fake_bin(tmp_path / "bin", {"sudo": SUDO_WANTS_PASSWORD})},
                           become=True)
    events = Log()
    async with await open_ssh(node.host) as ssh:
        with pytest.raises(LockError) as caught:
            async with host_lock(Node(node.host, ssh, events), "run-a", held_s=60, wait_s=1):
                pytest.fail("sudo refused, yet locked")
    assert str(caught.value) == (
        f"cannot take the reset lock: sudo -n on {node.host.name} needs a password for sh: "
        "allow it in sudoers (NOPASSWD) or run as root"
    )
    assert node.server.commands[0].startswith("timeout -k 1 ") and " sudo -n timeout " in node.server.commands[0]


# --- the runner -------------------------------------------------------------------------------


async def test_a_host_locked_by_another_run_fails_and_nothing_runs(tmp_path: Path) -> None:
    t = ScriptedTransport(script=[(LOCK_CMD, Reply(stderr="held by: pid 4321 (root)\n", exit_status=75)), BUSY_OWNER,
                                  *node_script()])
    report, _ = await run([make_host()], {"gpu-01": t}, tmp_path)
    host = report.hosts["gpu-01"]
    assert host.status is HostStatus.FAILED
    assert host.error == "locked by run run-a"
    assert all(s.status is StepStatus.SKIPPED for s in host.steps)
    assert [argv[3] if lock.is_lock_argv(argv) else argv[0] for argv in t.ran] == ["fleet-lock", "cat"]
    assert t.closed


async def test_an_unusable_lock_fails_the_host_with_the_reason(tmp_path: Path) -> None:
    denied = "flock: 9: Bad file descriptor\n"
    t = ScriptedTransport(script=[(LOCK_CMD, Reply(stderr=denied, exit_status=1)), *node_script()])
    report, _ = await run([make_host()], {"gpu-01": t}, tmp_path)
    assert report.hosts["gpu-01"].error == ("cannot take the reset lock /run/fleet/reset.lock: "
                                            "flock: 9: Bad file descriptor")
    assert report.hosts["gpu-01"].reason is Reason.PROBE_FAILED
    assert [lock.is_lock_argv(argv) for argv in t.ran] == [True]


@pytest.mark.parametrize(("status", "reason"), [(lock.REFUSED_EXIT, Reason.PROBE_FAILED),
                                                (lock.FOREIGN_EXIT, Reason.LOCKED)])
async def test_a_lock_the_node_refuses_fails_the_host_with_its_one_line(tmp_path: Path, status: int,
                                                                       reason: Reason) -> None:
    said = "reset lock /run/fleet/reset.lock is owned by nobody (uid 65534), not uid 0; held by: pid 77 (nobody)"
    t = ScriptedTransport(script=[(LOCK_CMD, Reply(stderr=said + "\n", exit_status=status)), *node_script()])
    report, _ = await run([make_host()], {"gpu-01": t}, tmp_path)
    assert (report.hosts["gpu-01"].error, report.hosts["gpu-01"].reason) == (said, reason)
    assert len(t.ran) == 1


async def test_reset_holds_the_lock_and_releases_it_even_after_an_internal_error(tmp_path: Path) -> None:
    clean = ScriptedTransport(script=node_script())
    # the signal unscripted (a bug); the kernel-log read, the other sh program, still answered
    broken = ScriptedTransport(script=[(scripted_node.KERNEL_LOG, scripted_node.kernel_log_reply()),
                                       *[s for s in node_script() if s[0] != ("sh", "-c")]])
    report, _ = await run([make_host("gpu-01"), make_host("gpu-02")], {"gpu-01": clean, "gpu-02": broken}, tmp_path)
    assert report.hosts["gpu-01"].status is HostStatus.CLEAN
    assert "internal error during kill" in (report.hosts["gpu-02"].error or "")
    for t in (clean, broken):
        assert lock.is_lock_argv(t.ran[0])
        assert t.open_commands == 0


async def test_check_takes_no_lock(tmp_path: Path) -> None:
    t = ScriptedTransport(script=node_script())
    await run([make_host()], {"gpu-01": t}, tmp_path, mode=Mode.CHECK)
    assert t.ran and not any(lock.is_lock_argv(argv) for argv in t.ran)


def test_held_that_ended_is_not_running() -> None:
    assert not OpenCommand("", None).running


class _StubbornHold:
    """A Transport whose held command never ends on release (OpenCommand.release returns None: it was killed)."""

    async def open_command(self, argv: Any, *, timeout: float, privileged: bool = False) -> OpenCommand:
        async def release() -> None:
            return None

        return OpenCommand("locked", release=release)


async def test_a_held_command_killed_on_release_is_still_logged_as_a_command() -> None:
    log = Log()
    remote = Node(make_host(), _StubbornHold(), log)  # type: ignore[arg-type]  # only open_command is used
    held = await remote.open_command(action(["flock", "/run/lock/x", "cat"], "reset lock", needs_root=True), timeout=30)
    assert await held.release() is None
    assert log.names() == ["command"]
    fields = log.first("command")
    assert fields["argv"] == ["flock", "/run/lock/x", "cat"]
    assert fields["signal"] == "KILL" and fields["timed_out"] is True and fields["exit_status"] is None
    assert "killed" in fields["note"]
