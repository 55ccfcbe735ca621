"""A non-root login through the real OpenSSH sshd: a scan that cannot see every process never says "clean".

A user of its own (created here, removed after) logs in with a key; a root-owned process holds a device
file. Without `become` the holder scan cannot read root's fd tables: the step fails and says why. With
`become` and a sudoers rule that allows it, the scan sees the holder; with a sudoers rule that refuses it,
the step fails and says so. The reset lock's folder, in /run, cannot be made by that login: the host fails
`not_permitted`, naming the user and what to do. Needs root (to add the user and the sudoers rule), sshd and sudo;
CI has all.
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.keys import ClientKey, make_client_key
from support.sshd import SSHD, Sshd, start_sshd

from fleet.inventory.host import Host
from fleet.model.errors import StepFailed
from fleet.model.report import Reason, StepName
from fleet.node.budget import TimeBudget
from fleet.node.node import Node
from fleet.reset import holders
from fleet.reset.lock import LockError, host_lock
from fleet.transport.ssh import open_ssh

SUDOERS_DIR = Path("/etc/sudoers.d")


class Events:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kw: None


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder every user may read (the sshd's keys and config, the device file)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: it adds a user and a sudoers rule (CI runs as root)")
    if not SSHD.exists() or shutil.which("sudo") is None:
        pytest.skip("needs sshd and sudo (apt-get install openssh-server sudo; CI installs them)")
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    folder = Path(tempfile.mkdtemp(prefix="fleet-sight-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@pytest.fixture
def login(world: Path) -> Iterator[str]:
    """A user of this test's own: no home, not locked (sshd without PAM refuses locked accounts)."""
    name = f"fleet-t{secrets.token_hex(3)}"
    subprocess.run(["useradd", "-M", "-d", "/nonexistent", "-s", "/bin/sh", name], check=True)
    try:
        subprocess.run(["usermod", "-p", "*", name], check=True)
        yield name
    finally:
        subprocess.run(["userdel", name], check=False)


@pytest.fixture
def server(world: Path) -> Iterator[Sshd]:
    sshd = start_sshd(world / "sshd")
    for path in [world / "sshd", *(world / "sshd").iterdir()]:
        if "host_ed25519_key" not in path.name or path.suffix == ".pub":
            path.chmod(0o755 if path.is_dir() else 0o644)  # the user's sshd process reads authorized_keys
    yield sshd
    sshd.stop()


@pytest.fixture
def key(world: Path) -> ClientKey:
    return make_client_key(world / "client_key")


@pytest.fixture
def root_holder(world: Path) -> Iterator[int]:
    """A root-owned process holding `nvidia0` in the world-readable folder; ended by its pid."""
    device = world / "nvidia0"
    device.write_text("")
    device.chmod(0o644)
    code = "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); time.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", code, str(device)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


@contextmanager
def sudoers(user: str, rule: str) -> Iterator[None]:
    """A sudoers rule for the user, removed after."""
    path = SUDOERS_DIR / f"fleet-test-{user}"
    path.write_text(f"{user} ALL=(root) NOPASSWD: {rule}\n")
    path.chmod(0o440)
    try:
        yield
    finally:
        with suppress(FileNotFoundError):
            path.unlink()


def host(server: Sshd, key: ClientKey, user: str, world: Path, *, become: bool) -> Host:
    return Host(name="gpu-t01", address="127.0.0.1", port=server.port, user=user, identity_file=str(key.path),
                known_hosts=str(server.known_hosts), devices=(str(world / "nvidia*"),), become=become,
                connect_timeout=10, command_timeout=20)


async def scan(target: Host) -> holders.Scan:
    async with await open_ssh(target) as ssh:
        return await holders.scan(Node(target, ssh, Events()), StepName.VERIFY, TimeBudget(window=0.0, slack=60))


async def test_without_become_a_non_root_login_cannot_see_roots_holder_and_says_so(
    server: Sshd, key: ClientKey, login: str, world: Path, root_holder: int
) -> None:
    server.authorize(key.public_line)
    with pytest.raises(StepFailed) as caught:
        await scan(host(server, key, login, world, become=False))
    assert re.fullmatch(
        rf"cannot see every process on gpu-t01 as {login} \(permission denied on /proc/\*/fd of \d+ processes\): "
        r"run as root or set become",
        str(caught.value),
    ), caught.value


async def test_with_become_and_sudo_allowed_the_scan_sees_roots_holder(
    server: Sshd, key: ClientKey, login: str, world: Path, root_holder: int
) -> None:
    server.authorize(key.public_line)
    with sudoers(login, "ALL"):
        found = await scan(host(server, key, login, world, become=True))
        assert [h.pid for h in found.holders] == [root_holder]
        assert found.holders[0].user == "root" and found.holders[0].start is not None


async def test_with_become_and_a_sudoers_that_refuses_the_scan_fails_and_says_so(
    server: Sshd, key: ClientKey, login: str, world: Path, root_holder: int
) -> None:
    server.authorize(key.public_line)
    # Every command of fleet's is refused without a password prompt (sudo then says "not allowed to execute",
    # in the machine's language): what fleet runs through sudo is `env` (the command's marker) or `timeout`.
    with sudoers(login, "ALL, !/usr/bin/timeout, !/usr/bin/env"), pytest.raises(StepFailed) as caught:
        await scan(host(server, key, login, world, become=True))
    message = str(caught.value)
    assert message.startswith(f"cannot see every process on gpu-t01 as {login} through sudo (the holder scan did "
                              "not run: exit 1: ")
    assert message.endswith("): allow fleet's commands in sudoers (NOPASSWD) or run as root")


async def test_without_become_a_non_root_login_that_cannot_make_the_lock_folder_says_as_whom_and_what_to_do(
    server: Sshd, key: ClientKey, login: str, world: Path
) -> None:
    server.authorize(key.public_line)
    folder = Path(f"/run/fleet-t{secrets.token_hex(3)}")  # in /run: only root may make it
    target = replace(host(server, key, login, world, become=False), lock_file=str(folder / "reset.lock"))
    uid = pwd.getpwnam(login).pw_uid
    async with await open_ssh(target) as ssh:
        with pytest.raises(LockError) as caught:
            async with host_lock(Node(target, ssh, Events()), "run-a", held_s=60, wait_s=1):
                pytest.fail("took a lock in a folder it cannot make")
    assert caught.value.reason is Reason.NOT_PERMITTED
    assert str(caught.value) == (f"cannot create the reset lock folder {folder} as uid {uid} ({login}): Permission "
                                 "denied: log in as root, or set become: true (fleet's commands through passwordless "
                                 "sudo)")
    assert not await anyio.Path(folder).exists()
