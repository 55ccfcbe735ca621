"""ssh_config, jump hosts and encrypted keys through the real OpenSSH sshd: a jump host and a target."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import asyncssh
import pytest
from support.keys import ClientKey
from support.ssh_home import ENCRYPTED, encrypted_key, public_line, write_config
from support.ssh_home import home as home  # the fixture
from support.sshd import Sshd, start_sshd

from fleet.inventory.host import Host
from fleet.model.errors import AuthError, ConnectError
from fleet.model.report import Reason
from fleet.transport import ssh as ssh_module
from fleet.transport.ssh import jumps, open_ssh

# ---------------------------------------------------------------- through the real sshd: a jump host and a target


@dataclass
class Site:
    """A jump sshd and a target sshd, and a HOME whose ssh_config reaches the target (gpu-j*) through the jump."""

    home: Path
    jump: Sshd
    target: Sshd
    key: ClientKey

    @property
    def jump_spec(self) -> str:
        return f"root@127.0.0.1:{self.jump.port}"

    def env(self, **extra: str) -> dict[str, str]:
        skip = {"SSH_AUTH_SOCK", "FLEET_INVENTORY", "FLEET_LOG_DIR"}
        return {**{k: v for k, v in os.environ.items() if k not in skip}, "HOME": str(self.home), **extra}


def accepted(sshd: Sshd, user: str = "root") -> int:
    """How many connections sshd accepted for user (its log, LogLevel VERBOSE)."""
    return sshd.log.read_text().count(f"Accepted publickey for {user} ")


def host_line(sshd: Sshd) -> str:
    return (sshd.dir / "ssh_host_ed25519_key.pub").read_text().split(maxsplit=2)[1]


@pytest.fixture
def site(tmp_path: Path, sshd: Sshd, client_key: ClientKey, home: Path) -> Iterator[Site]:
    jump = start_sshd(tmp_path / "jump")
    try:
        for server in (jump, sshd):
            server.authorize(client_key.public_line)
        (home / ".ssh" / "id_ed25519").write_bytes(client_key.path.read_bytes())  # the default key: ssh finds it
        (home / ".ssh" / "id_ed25519").chmod(0o600)
        write_config(home, f"""\
Host gpu-j*
  HostName 127.0.0.1
  Port {sshd.port}
  User root
  ProxyJump root@127.0.0.1:{jump.port}
""")
        (home / ".ssh" / "known_hosts").write_text(jump.known_hosts.read_text() + sshd.known_hosts.read_text())
        yield Site(home, jump, sshd, client_key)
    finally:
        jump.stop()


def free_port() -> int:
    """A port nothing listens on (bound once, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def fleet_check(site: Site, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """`fleet check ... --json` in its own process, with the site's HOME; (exit status, the report)."""
    done = subprocess.run([sys.executable, "-m", "fleet", "check", *args, "--json", "--log-dir",
                           str(site.home / "logs")], capture_output=True, text=True, timeout=90, check=False,
                          env=env or site.env())
    assert done.stdout, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, report


async def test_a_host_behind_a_jump_is_reached_through_it_with_ssh_configs_port_and_user(site: Site) -> None:
    async with await open_ssh(Host(name="gpu-j01", address="gpu-j01", connect_timeout=10)) as ssh:
        result = await ssh.run(["sh", "-c", 'echo "$(id -un) $SSH_CONNECTION"'], timeout=10)
    user, _, _, _, server_port = result.stdout.split()
    assert (user, int(server_port)) == ("root", site.target.port)  # ssh_config's User and Port
    assert accepted(site.jump) == 1 and accepted(site.target) == 1  # through the jump, its key checked
    assert not jumps.jump_pool()  # closed with the last host behind it


async def test_ssh_configs_user_is_used_and_the_inventorys_wins(site: Site) -> None:
    """ssh_config names a user the target does not have: sshd sees that user, fleet names it; the inventory's wins."""
    write_config(site.home, (site.home / ".ssh" / "config").read_text().replace("User root", "User fleet-nosuch"))
    with pytest.raises(AuthError) as caught:
        await open_ssh(Host(name="gpu-j01", address="gpu-j01", connect_timeout=10))
    assert str(caught.value) == (
        f"authentication failed for fleet-nosuch at 127.0.0.1:{site.target.port} via jump host {site.jump_spec}"
    )
    assert "Invalid user fleet-nosuch from 127.0.0.1" in site.target.log.read_text()
    assert not jumps.jump_pool()
    async with await open_ssh(Host(name="gpu-j01", address="gpu-j01", user="root", connect_timeout=10)):
        pass
    assert accepted(site.target, "root") == 1


async def test_a_jump_host_error_names_where_the_jump_and_the_target_really_were(site: Site) -> None:
    """ssh_config names the jump by an alias (`rack7-badjump`) whose HostName and Port are elsewhere: the error
    says where fleet really went (the jump's address and port) and on the way to where (the target's), as a
    direct host's error does."""
    closed = free_port()
    write_config(site.home, (site.home / ".ssh" / "config").read_text().replace(
        f"ProxyJump root@127.0.0.1:{site.jump.port}", "ProxyJump rack7-badjump")
        + f"Host rack7-badjump\n  HostName 127.0.0.1\n  Port {closed}\n  User root\n")
    with pytest.raises(ConnectError) as caught:
        await open_ssh(Host(name="gpu-j01", address="gpu-j01", connect_timeout=10))
    assert str(caught.value) == (f"jump host rack7-badjump: connection refused (127.0.0.1:{closed}), on the way to"
                                 f" 127.0.0.1:{site.target.port}")
    assert caught.value.reason is Reason.CONNECT_REFUSED
    assert not jumps.jump_pool()


async def test_the_inventorys_port_wins_over_ssh_configs(site: Site) -> None:
    closed = Host(name="gpu-j01", address="gpu-j01", port=free_port(), connect_timeout=10)
    with pytest.raises(ConnectError) as caught:
        await open_ssh(closed)
    assert str(caught.value) == (
        f"cannot reach 127.0.0.1:{closed.port} via jump host {site.jump_spec}: Connection refused"
    )
    assert caught.value.reason is Reason.CONNECT_REFUSED
    assert accepted(site.target) == 0 and not jumps.jump_pool()
    write_config(site.home, (site.home / ".ssh" / "config").read_text().replace(f"Port {site.target.port}",
                                                                               f"Port {closed.port}"))
    async with await open_ssh(replace(closed, port=site.target.port)):
        pass
    assert accepted(site.target) == 1


async def test_a_host_the_jump_cannot_reach_names_the_jump_by_address_and_port(site: Site) -> None:
    """ssh_config names the jump by an alias (`rack7-jump`) whose HostName and Port say where it is: the error of a
    host behind it it cannot reach names the alias and where the jump really was."""
    write_config(site.home, (site.home / ".ssh" / "config").read_text().replace(
        f"ProxyJump root@127.0.0.1:{site.jump.port}", "ProxyJump rack7-jump")
        + f"Host rack7-jump\n  HostName 127.0.0.1\n  Port {site.jump.port}\n  User root\n")
    closed = Host(name="gpu-j01", address="gpu-j01", port=free_port(), connect_timeout=10)
    with pytest.raises(ConnectError) as caught:
        await open_ssh(closed)
    assert str(caught.value) == (
        f"cannot reach 127.0.0.1:{closed.port} via jump host rack7-jump (127.0.0.1:{site.jump.port}):"
        " Connection refused"
    )
    assert caught.value.reason is Reason.CONNECT_REFUSED
    assert accepted(site.jump) == 1 and accepted(site.target) == 0 and not jumps.jump_pool()


def test_hosts_behind_one_jump_share_one_connection_to_it(site: Site) -> None:
    """`fleet check -w` (no inventory: the built-in defaults, ssh_config for the rest): two hosts, one jump
    connection, each host its own connection to the target through it."""
    status, report = fleet_check(site, "-w", "gpu-j[01-02]")
    hosts = report["hosts"]
    assert sorted(hosts) == ["gpu-j01", "gpu-j02"]
    for result in hosts.values():  # connected: verify ran (and found no nvidia-smi on this machine)
        assert result["status"] != "unreachable", result
    assert status == (0 if all(h["status"] == "clean" for h in hosts.values()) else 1)
    assert accepted(site.jump) == 1
    assert accepted(site.target) == 2
    (log,) = (site.home / "logs").glob("*/gpu-j01.jsonl")
    (start,) = [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "host_start"]
    assert (start["address"], start["port"]) == ("gpu-j01", None)  # the port ssh_config gives is not the inventory's


def test_a_wrong_key_for_the_jump_makes_its_hosts_unreachable_naming_it(site: Site) -> None:
    wrong = public_line(asyncssh.generate_private_key("ssh-ed25519"))
    (site.home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{site.jump.port} {wrong}\n"
                                                    + site.target.known_hosts.read_text())
    status, report = fleet_check(site, "-w", "gpu-j[01-02]")
    assert status == 4  # unreachable, none failed
    for result in report["hosts"].values():
        assert (result["status"], result["reason"]) == ("unreachable", "host_key_changed")
        assert result["error"].startswith(f"jump host {site.jump_spec}: host key of [127.0.0.1]:{site.jump.port}"
                                          " CHANGED"), result["error"]
    assert accepted(site.jump) == 0 and accepted(site.target) == 0


def test_an_encrypted_identity_file_without_an_agent_fails_its_host_at_once(site: Site, tmp_path: Path) -> None:
    key = tmp_path / "id_encrypted"
    encrypted_key(key)
    inventory = tmp_path / "site.yaml"
    inventory.write_text(f"hosts: {{gpu-j01: {{identity_file: {key}}}}}\n")
    started = time.monotonic()
    status, report = fleet_check(site, "-i", str(inventory), "gpu-j01")
    assert time.monotonic() - started < 30
    result = report["hosts"]["gpu-j01"]
    assert (status, result["status"], result["reason"]) == (4, "unreachable", "auth")
    assert result["error"] == ENCRYPTED.format(path=key)
    assert accepted(site.jump) == 0 and accepted(site.target) == 0


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[str]:
    """A real ssh-agent on a socket of the test's own, in the foreground; killed by its pid after."""
    if shutil.which("ssh-agent") is None or shutil.which("ssh-add") is None:
        pytest.skip("no ssh-agent here (openssh-client)")
    socket_path = tmp_path / "agent.sock"
    process = subprocess.Popen(["ssh-agent", "-D", "-a", str(socket_path)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not socket_path.exists():
            assert process.poll() is None and time.monotonic() < deadline, "ssh-agent did not start"
            time.sleep(0.02)
        yield str(socket_path)
    finally:
        process.kill()
        process.wait(timeout=10)


async def test_an_encrypted_identity_file_added_to_the_agent_connects(
    site: Site, agent: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's key has a passphrase; the user has ssh-added it (here: an unencrypted copy of the same key)."""
    key = tmp_path / "id_encrypted"
    private = encrypted_key(key)
    site.target.authorize(public_line(private))
    copy = tmp_path / "id_copy"
    private.write_private_key(copy)
    copy.chmod(0o600)
    with anyio.fail_after(30):
        added = await anyio.run_process(["ssh-add", str(copy)], env=site.env(SSH_AUTH_SOCK=agent), check=False)
    assert added.returncode == 0, added.stderr
    (site.home / ".ssh" / "id_ed25519").unlink()  # the agent's key is the only one: the jump host takes it too
    site.jump.authorize(public_line(private))
    monkeypatch.setenv("SSH_AUTH_SOCK", agent)
    async with await open_ssh(Host(name="gpu-j01", address="gpu-j01", identity_file=str(key),
                                   connect_timeout=10)) as ssh:
        assert (await ssh.run(["true"], timeout=10)).ok
    assert accepted(site.target) == 1


async def test_the_jump_connection_closes_with_the_last_host_and_on_a_cancel(site: Site) -> None:
    host = Host(name="gpu-j01", address="gpu-j01", connect_timeout=10)
    first = await open_ssh(host)
    second = await open_ssh(replace(host, name="gpu-j02"))
    (shared,) = jumps.jump_pool().values()
    assert (shared.users, shared.handshakes.total_tokens) == (2, jumps.JUMP_HANDSHAKES)
    conn = shared.conn
    assert conn is not None
    await first.close()
    assert shared.users == 1 and not conn.is_closed()
    await second.close()
    assert not jumps.jump_pool() and conn.is_closed()
    assert accepted(site.jump) == 1
    with anyio.CancelScope() as scope:
        scope.cancel()  # Ctrl-C as the host starts: nothing is left open
        await open_ssh(host)
    assert not jumps.jump_pool()


async def test_handshakes_through_one_jump_are_bounded(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many hosts at once behind one jump host: never more handshakes through it in flight than the bound."""
    monkeypatch.setattr(jumps, "JUMP_HANDSHAKES", 2)
    real_connect = asyncssh.connect
    in_flight: list[int] = [0]
    most: list[int] = [0]

    async def counting(*args: Any, **kwargs: Any) -> asyncssh.SSHClientConnection:
        tunnelled = "tunnel" in kwargs
        in_flight[0] += tunnelled
        most[0] = max(most[0], in_flight[0])
        try:
            return await real_connect(*args, **kwargs)
        finally:
            in_flight[0] -= tunnelled

    monkeypatch.setattr(asyncssh, "connect", counting)
    opened: list[ssh_module.SshTransport] = []
    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for n in range(6):
                    host = Host(name=f"gpu-j{n:02}", address=f"gpu-j{n:02}", connect_timeout=20)
                    tg.start_soon(_open_into, host, opened)
    finally:
        for transport in opened:
            await transport.close()
    assert (len(opened), most[0]) == (6, 2)
    assert accepted(site.jump) == 1 and accepted(site.target) == 6
    assert not jumps.jump_pool()


async def _open_into(host: Host, opened: list[ssh_module.SshTransport]) -> None:
    opened.append(await open_ssh(host))
