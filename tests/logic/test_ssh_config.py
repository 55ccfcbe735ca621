"""SSH as the user configured it: ssh_config's Port, User and ProxyJump, known_hosts as OpenSSH reads them, ssh-agent.

Unit tests build the options from a `Host` and a HOME of the test's own; the ones marked `sshd` run against two
real OpenSSH sshd (a jump host and a target, each on its own port on 127.0.0.1) and read their logs
(LogLevel VERBOSE: one `Accepted publickey` line per authenticated connection).
"""

from __future__ import annotations

import getpass
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import cast

import anyio
import asyncssh
import pytest
from support.ssh_home import ENCRYPTED, encrypted_key, public_line, write_config
from support.ssh_home import home as home  # the fixture

from fleet.inventory import host as host_module
from fleet.inventory.host import Host
from fleet.model.errors import AuthError, ConnectError, HostKeyError
from fleet.model.report import Reason
from fleet.report.tables import inventory_table
from fleet.transport.base import Note
from fleet.transport.ssh import Jump, connect_options, known_hosts, open_ssh, route

# ---------------------------------------------------------------- port and user: inventory > ssh_config > ssh's


def test_port_and_user_reach_asyncssh_only_when_the_inventory_sets_them(tmp_path: Path) -> None:
    (tmp_path / "kh").write_text(f"gpu-a01 {public_line(asyncssh.generate_private_key('ssh-ed25519'))}\n")
    bare = Host(name="gpu-a01", address="gpu-a01", known_hosts=str(tmp_path / "kh"))
    assert "port" not in connect_options(bare) and "username" not in connect_options(bare)
    set_ = replace(bare, port=2222, user="ops")
    assert (connect_options(set_)["port"], connect_options(set_)["username"]) == (2222, "ops")


def test_ssh_config_fills_what_the_inventory_leaves_unset(home: Path) -> None:
    write_config(home, """\
Host gpu-a*
  HostName 10.0.0.7
  Port 2200
  User ops
  ProxyJump admin@bastion:2022
Host gpu-m*
  ProxyJump a,b
Host gpu-n*
  ProxyJump none
""")
    where = route(Host(name="gpu-a01", address="gpu-a01"))
    assert (where.hostname, where.port, where.user) == ("10.0.0.7", 2200, "ops")
    assert where.jump == Jump(spec="admin@bastion:2022", host="bastion", port=2022, user="admin")
    assert where.label == "10.0.0.7:2200 via jump host admin@bastion:2022"
    set_ = route(Host(name="gpu-a01", address="gpu-a01", port=22, user="root"))
    assert (set_.hostname, set_.port, set_.user) == ("10.0.0.7", 22, "root")  # the inventory's win
    multi = route(Host(name="gpu-m01", address="gpu-m01"))
    assert (multi.proxy_jump, multi.jump) == ("a,b", None)  # several hops: asyncssh opens them itself
    plain = route(Host(name="gpu-n01", address="gpu-n01"))
    assert (plain.port, plain.user, plain.jump) == (22, getpass.getuser(), None)


def test_a_jump_host_is_named_with_the_address_and_port_it_is_reached_at(home: Path) -> None:
    """A jump ssh_config names by an alias is named with its entry's HostName and Port; one written as `host` alone
    gets the port it is reached at; each hop of several is named so."""
    write_config(home, """\
Host gpu-a*
  HostName 10.0.0.7
  ProxyJump rack7-jump
Host gpu-b*
  ProxyJump ops@bastion
Host gpu-m*
  ProxyJump rack7-jump,bastion:2022
Host rack7-jump
  HostName 127.0.0.9
  Port 2200
Host bastion
  Port 2201
""")
    aliased = route(Host(name="gpu-a01", address="gpu-a01"))
    assert aliased.label == "10.0.0.7:22 via jump host rack7-jump (127.0.0.9:2200)"
    assert route(Host(name="gpu-b01", address="gpu-b01")).label == "gpu-b01:22 via jump host ops@bastion:2201"
    multi = route(Host(name="gpu-m01", address="gpu-m01", port=2222))
    assert multi.label == "gpu-m01:2222 via jump hosts rack7-jump (127.0.0.9:2200), bastion:2022"


@pytest.mark.parametrize(("spec", "jump"), [
    ("bastion", Jump(spec="bastion", host="bastion")),
    ("bastion:2022", Jump(spec="bastion:2022", host="bastion", port=2022)),
    ("me@bastion", Jump(spec="me@bastion", host="bastion", port=None, user="me")),
    ("me@x@bastion:1", Jump(spec="me@x@bastion:1", host="bastion", port=1, user="me@x")),
])
def test_a_single_hop_proxy_jump_is_read_as_asyncssh_reads_it(spec: str, jump: Jump) -> None:
    assert Jump.parse(spec) == jump


def test_a_proxy_jump_fleet_cannot_read_fails_the_host_before_connecting(home: Path) -> None:
    write_config(home, "Host gpu-*\n  ProxyJump bastion:ssh\n")
    with pytest.raises(ConnectError, match=r"^ssh_config's ProxyJump bastion:ssh: 'ssh' is not a port$"):
        route(Host(name="gpu-a01", address="gpu-a01"))


def test_the_inventory_table_shows_a_port_only_when_set(capsys: pytest.CaptureFixture[str]) -> None:
    inventory_table([Host(name="n1", address="10.0.0.1"), Host(name="n2", address="10.0.0.2", port=2222)])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [row[:2] for row in rows] == [["n1", "10.0.0.1"], ["n2", "10.0.0.2:2222"]]


# ---------------------------------------------------------------- known_hosts as OpenSSH reads them


def test_unset_known_hosts_reads_every_default_file_that_exists(home: Path) -> None:
    keys = {name: asyncssh.generate_private_key("ssh-ed25519") for name in ("a", "b", "c")}
    (home / ".ssh" / "known_hosts").write_text(f"gpu-a {public_line(keys['a'])}\n@cert-authority\n")
    (home / ".ssh" / "known_hosts2").write_text(f"gpu-b {public_line(keys['b'])}\n")
    system = Path(host_module.SYSTEM_KNOWN_HOSTS[0])
    system.parent.mkdir()
    system.write_text(f"# the site's\ngpu-c {public_line(keys['c'])}\nbroken\n")
    known = known_hosts(Host(name="n1", address="n1"))
    assert known.paths == (str(home / ".ssh/known_hosts"), str(home / ".ssh/known_hosts2"), str(system))
    assert known.entries is not None
    for name, key in keys.items():
        trusted = known.entries.match(f"gpu-{name}", "", 22)[0]
        assert [k.public_data for k in trusted] == [key.public_data]
    assert known.notes() == (Note("known_hosts_skipped", {"path": str(home / ".ssh/known_hosts"), "lines": [2]}),
                             Note("known_hosts_skipped", {"path": str(system), "lines": [3]}))
    assert known_hosts(Host(name="n2", address="n2")) is known  # parsed once while the files stay as they are


def test_a_set_known_hosts_is_the_only_file_read(home: Path, tmp_path: Path) -> None:
    (home / ".ssh" / "known_hosts").write_text(f"gpu-a {public_line(asyncssh.generate_private_key('ssh-ed25519'))}\n")
    mine = tmp_path / "kh"
    mine.write_text(f"gpu-b {public_line(asyncssh.generate_private_key('ssh-ed25519'))}\n")
    assert known_hosts(Host(name="n1", address="n1", known_hosts=str(mine))).paths == (str(mine),)


def test_no_default_known_hosts_is_a_host_key_error(home: Path) -> None:
    with pytest.raises(HostKeyError) as caught:
        known_hosts(Host(name="n1", address="gpu-a01"))
    assert str(caught.value) == (
        "no known_hosts file (~/.ssh/known_hosts, ~/.ssh/known_hosts2, "
        f"{', '.join(host_module.SYSTEM_KNOWN_HOSTS)}) exists: host keys are always checked "
        "(add the key of gpu-a01, e.g. ssh-keyscan gpu-a01)"
    )


def test_default_known_hosts_without_a_usable_line_names_every_file(home: Path) -> None:
    (home / ".ssh" / "known_hosts").write_text("@cert-authority\n")
    (home / ".ssh" / "known_hosts2").write_text("# nothing\n")
    with pytest.raises(HostKeyError) as caught:
        known_hosts(Host(name="n1", address="gpu-a01"))
    assert str(caught.value) == (
        f"known_hosts files {home}/.ssh/known_hosts, {home}/.ssh/known_hosts2 have no line that can be read"
        f" (lines skipped: {home}/.ssh/known_hosts: 1): no host key of gpu-a01 can be checked"
    )


# ---------------------------------------------------------------- a key with a passphrase: ssh-agent




@pytest.mark.parametrize("made_by", ["asyncssh", "ssh-keygen"])
async def test_an_encrypted_identity_file_without_an_agent_is_one_auth_line(home: Path, tmp_path: Path,
                                                                            made_by: str) -> None:
    """PKCS#8 from asyncssh, OpenSSH's own format from ssh-keygen: neither is decrypted, nothing connects."""
    (home / ".ssh" / "known_hosts").write_text(f"gpu-a01 {public_line(asyncssh.generate_private_key('ssh-ed25519'))}\n")
    key = tmp_path / "id_ed25519"
    if made_by == "asyncssh":
        encrypted_key(key)
    else:
        if shutil.which("ssh-keygen") is None:
            pytest.skip("no ssh-keygen here (openssh-client)")
        with anyio.fail_after(30):
            await anyio.run_process(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(key)])
    host = Host(name="gpu-a01", address="gpu-a01", identity_file=str(key))
    with pytest.raises(AuthError) as caught:
        await open_ssh(host)
    assert str(caught.value) == ENCRYPTED.format(path=key)
    assert caught.value.reason is Reason.AUTH


def test_an_encrypted_identity_file_with_an_agent_is_left_to_the_agent(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (home / ".ssh" / "known_hosts").write_text(f"gpu-a01 {public_line(asyncssh.generate_private_key('ssh-ed25519'))}\n")
    key = tmp_path / "id_ed25519"
    encrypted_key(key)
    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "agent.sock"))
    options = connect_options(Host(name="gpu-a01", address="gpu-a01", identity_file=str(key)))
    assert "client_keys" not in options  # asyncssh offers the agent's keys (and the default key files)
    plain = tmp_path / "id_plain"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(plain)
    options = connect_options(Host(name="gpu-a01", address="gpu-a01", identity_file=str(plain)))
    assert len(cast(Sequence[asyncssh.SSHKeyPair], options["client_keys"])) == 1  # what connect_options loaded
