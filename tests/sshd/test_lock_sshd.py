"""The host's reset lock through a stock OpenSSH sshd (integration suite, marker `sshd`).

OpenSSH does not end a command when its channel closes, so the lock holder is a
command that ends at EOF on its stdin: released by fleet, or by sshd closing
the pipes once the client is gone (here: a fleet process SIGKILLed mid-hold).
"""

from __future__ import annotations

import getpass
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from support.keys import ClientKey
from support.processes import lock_freed, lock_held
from support.scripted_node import Log
from support.sshd import Sshd

from fleet.inventory.host import Host
from fleet.node.node import Node
from fleet.reset.lock import LockBusy, host_lock
from fleet.transport.ssh import open_ssh

# A fleet process that takes the lock over SSH, says so, then waits to be killed.
HOLDER = """
import sys, anyio
from fleet.reset.lock import lock_argv
from fleet.inventory.host import Host
from fleet.transport.ssh import open_ssh

async def main(port, user, key, known_hosts, lock_file):
    host = Host(name="sshd", address="127.0.0.1", port=int(port), user=user, identity_file=key,
                known_hosts=known_hosts, connect_timeout=5)
    transport = await open_ssh(host)
    held = await transport.open_command(lock_argv(lock_file, "run-dead", 1), timeout=120)
    print(held.first_line, flush=True)
    await anyio.sleep(120)

anyio.run(main, *sys.argv[1:])
"""


@pytest.fixture
def host(sshd: Sshd, client_key: ClientKey, tmp_path: Path) -> Host:
    sshd.authorize(client_key.public_line)
    return Host(
        name="sshd", address="127.0.0.1", port=sshd.port, user=getpass.getuser(),
        identity_file=str(client_key.path), known_hosts=str(sshd.known_hosts), connect_timeout=5,
        lock_file=str(tmp_path / "fleet-reset.lock"),
    )


@pytest.fixture
def holder(host: Host) -> Iterator[subprocess.Popen[str]]:
    """A separate fleet process holding the host's lock over SSH; SIGKILLed by pid and reaped after."""
    argv = [sys.executable, "-c", HOLDER, str(host.port), host.user or "", host.identity_file or "",
            host.known_hosts or "", host.lock_file]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


async def test_release_is_eof_and_ends_the_holder_through_openssh(host: Host) -> None:
    """OpenCommand across OpenSSH, refused to a second session with the owner's id, freed by EOF (exit 0, no kill)."""
    first_log, second_log = Log(), Log()
    async with await open_ssh(host) as first, await open_ssh(host) as second:
        async with host_lock(Node(host, first, first_log), "run-a", held_s=60, wait_s=2):
            assert lock_held(host.lock_file)
            with pytest.raises(LockBusy, match=r"^locked by run run-a$"):
                async with host_lock(Node(host, second, second_log), "run-b", held_s=60, wait_s=0.5):
                    pytest.fail("two holders at once")
        released = first_log.first("lock_released")
        assert released["exit_status"] == 0, "the holder did not end by itself at EOF"
        assert not lock_held(host.lock_file)
        async with host_lock(Node(host, second, second_log), "run-b", held_s=60, wait_s=0.5):
            assert lock_held(host.lock_file)
    assert not lock_held(host.lock_file)


async def test_a_fleet_that_dies_holding_the_lock_frees_it(host: Host, holder: subprocess.Popen[str]) -> None:
    assert holder.stdout is not None
    line = await anyio.to_thread.run_sync(holder.stdout.readline)
    assert line == "locked\n"
    assert lock_held(host.lock_file)
    os.kill(holder.pid, signal.SIGKILL)
    assert await lock_freed(host.lock_file, 20), "sshd's holder outlived the client"
    async with await open_ssh(host) as ssh, host_lock(Node(host, ssh, Log()), "run-b", held_s=60, wait_s=1):
        assert lock_held(host.lock_file)
