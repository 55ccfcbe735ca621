"""The SSH transport against the real OpenSSH sshd (integration suite, marker `sshd`)."""

from __future__ import annotations

import getpass
import os
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import anyio
import pytest
from support.keys import ClientKey, make_client_key
from support.sim_servers import SUDO_WANTS_PASSWORD, fake_bin
from support.sshd import Sshd
from support.waits import gone_within, line_within

from fleet.inventory.host import Host
from fleet.model.errors import AuthError, CommandTimeout, HostKeyChanged, HostKeyError
from fleet.model.report import Reason
from fleet.transport import ssh as ssh_module
from fleet.transport.base import OUTPUT_LIMIT
from fleet.transport.ssh import SshTransport, open_ssh


@pytest.fixture
def host(sshd: Sshd, client_key: ClientKey) -> Host:
    """A host entry for the running sshd, our client key authorized there."""
    sshd.authorize(client_key.public_line)
    return Host(
        name="sshd",
        address="127.0.0.1",
        port=sshd.port,
        user=getpass.getuser(),
        identity_file=str(client_key.path),
        known_hosts=str(sshd.known_hosts),
        connect_timeout=5,
    )


@pytest.fixture
async def ssh(host: Host) -> AsyncIterator[SshTransport]:
    transport = await open_ssh(host)
    yield transport
    await transport.close()


async def test_exit_status_and_streams_apart(ssh: SshTransport) -> None:
    result = await ssh.run(["sh", "-c", "echo out; echo err >&2; exit 5"], timeout=5)
    assert (result.exit_status, result.stdout, result.stderr) == (5, "out\n", "err\n")
    assert (await ssh.run(["true"], timeout=5)).ok


async def test_openssh_negotiates_aes_gcm(ssh: SshTransport) -> None:
    """fleet's cipher preference reaches a stock sshd: AES-GCM, one OpenSSL call a packet."""
    assert ssh._conn.get_extra_info("send_cipher") == ssh_module.ENCRYPTION_ALGS[0]
    assert ssh._conn.get_extra_info("recv_cipher") == ssh_module.ENCRYPTION_ALGS[0]


async def test_death_by_signal_is_data(ssh: SshTransport) -> None:
    result = await ssh.run(["sh", "-c", "kill -TERM $$"], timeout=5)
    assert (result.exit_status, result.signal) == (None, "SIGTERM")


async def test_arguments_survive_the_login_shell(ssh: SshTransport, tmp_path: Path) -> None:
    """sshd hands the command line to the user's shell: each argv element stays one word."""
    marker = tmp_path / "injected"
    words = [f"a b; touch {marker}", f"$(touch {marker})", 'it\'s "quoted"', "> /dev/null"]
    result = await ssh.run(["printf", "%s\\n", *words], timeout=5)
    assert result.stdout.splitlines() == words
    assert not marker.exists()


async def test_timeout_ends_the_remote_process(ssh: SshTransport) -> None:
    started = time.monotonic()
    with pytest.raises(CommandTimeout) as caught:
        await ssh.run(["sh", "-c", "echo $$; exec sleep 60"], timeout=1)
    assert time.monotonic() - started < 30  # the bound ended it, not the sleep's own 60 s
    pid = int(caught.value.result.stdout)
    assert await gone_within(pid, 20), f"sleep {pid} outlived its command"


async def test_cancelled_run_ends_the_remote_process_through_openssh(ssh: SshTransport, tmp_path: Path) -> None:
    """OpenSSH does not end a command when its channel closes: fleet finds it by its marker and kills it."""
    pidfile = tmp_path / "pid"
    with anyio.move_on_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: ssh.run(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"], timeout=30))
            pid = int(await line_within(pidfile, 20))
            tg.cancel_scope.cancel()
    assert await gone_within(pid, 20), f"sleep {pid} outlived the interrupted run"
    assert (await ssh.run(["true"], timeout=5)).ok


async def test_authorized_keys_environment_sets_path(
    sshd: Sshd, host: Host, client_key: ClientKey, tmp_path: Path
) -> None:
    """PATH from authorized_keys (as a simulated node's bin dir would be) reaches commands:
    here a sudo that wants a password, which is an AuthError under become."""
    other = make_client_key(tmp_path / "become_key")
    sshd.authorize(other.public_line, {"PATH": fake_bin(tmp_path / "bin", {"sudo": SUDO_WANTS_PASSWORD})})
    async with await open_ssh(replace(host, identity_file=str(other.path), become=True)) as ssh:
        with pytest.raises(AuthError, match="sudo -n on sshd needs a password for true: allow it in sudoers"):
            await ssh.run(["true"], timeout=5, privileged=True)


async def test_a_changed_host_key_and_an_unknown_one_are_told_apart_in_openssh_terms(
        host: Host, tmp_path: Path) -> None:
    """known_hosts holds another key for `[127.0.0.1]:PORT`: CHANGED (its own reason), naming the file and the
    `ssh-keygen -R` to run once checked. It holds a key for another name only: unknown, with the `ssh-keyscan`."""
    lookup = f"[127.0.0.1]:{host.port}"
    changed = tmp_path / "changed_known_hosts"
    changed.write_text(f"{lookup} {make_client_key(tmp_path / 'k1').public_line}\n")
    with pytest.raises(HostKeyChanged) as caught:
        await open_ssh(replace(host, known_hosts=str(changed)))
    assert caught.value.reason is Reason.HOST_KEY_CHANGED
    assert str(caught.value) == (
        f"host key of {lookup} CHANGED: {changed} holds another key for {lookup} (the node reinstalled, or someone"
        f" in between); once you know which, remove the old one: ssh-keygen -R '{lookup}' -f {changed}")
    unknown = tmp_path / "unknown_known_hosts"
    unknown.write_text(f"gpu-b99 {make_client_key(tmp_path / 'k3').public_line}\n")
    with pytest.raises(HostKeyError) as refused:
        await open_ssh(replace(host, known_hosts=str(unknown)))
    assert refused.value.reason is Reason.HOST_KEY and not isinstance(refused.value, HostKeyChanged)
    assert str(refused.value) == (f"host key of {lookup} unknown: {lookup} is not in {unknown}; once checked, add"
                                 f" it: ssh-keyscan -t ed25519 -p {host.port} 127.0.0.1 >> {unknown}")


async def test_wrong_client_key(host: Host, tmp_path: Path) -> None:
    stranger = make_client_key(tmp_path / "k2")
    with pytest.raises(AuthError):
        await open_ssh(replace(host, identity_file=str(stranger.path)))


def test_sshd_runs_as_a_recorded_pid(sshd: Sshd) -> None:
    """The fixture's sshd is ours to kill: its pid file names the process we started."""
    assert int((sshd.dir / "sshd.pid").read_text()) == sshd.process.pid
    assert os.path.exists(f"/proc/{sshd.process.pid}")


def _reset_peak() -> float:
    """Start the peak again from what is resident now (clear_refs 5); that peak, in MiB."""
    Path("/proc/self/clear_refs").write_text("5")
    return _peak_rss_mib()


def _peak_rss_mib() -> float:
    """This process's peak resident memory since the last reset (VmHWM), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc/self/status")


async def test_a_node_that_prints_100_mb_costs_the_controller_its_cap_not_its_output(ssh: SshTransport) -> None:
    """100 MB on stdout and 100 MB on stderr: the controller keeps the first OUTPUT_LIMIT characters of each, with
    the cut marked (which no probe reads as an answer), reads the rest and drops it; its peak RSS grows by a few
    times the cap, not by the output (it kept every byte, 194 MiB for 100 MB, before)."""
    script = "head -c 100000000 /dev/zero | tr '\\0' a; head -c 100000000 /dev/zero | tr '\\0' b >&2"
    before = _reset_peak()
    result = await ssh.run(["sh", "-c", script], timeout=120)
    grown = _peak_rss_mib() - before
    assert result.exit_status == 0
    assert result.stdout.startswith("a" * 1000) and result.stdout.endswith(
        f"... [{100_000_000 - OUTPUT_LIMIT} characters cut]")
    assert result.stderr.endswith(f"... [{100_000_000 - OUTPUT_LIMIT} characters cut]")
    assert grown < 40, f"peak RSS grew {grown:.0f} MiB for 200 MB of output"
