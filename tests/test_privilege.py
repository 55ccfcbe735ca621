"""Privilege: only the commands that need root go through `sudo -n` on a `become` host."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_runner_logic import make_host, node_script, run

from fleet.errors import AuthError
from fleet.node import probes
from fleet.node.lock import lock_argv
from fleet.report.models import HostStatus
from fleet.transport.base import CommandResult, bounded_argv
from fleet.transport.local import finish
from fleet.transport.scripted import ScriptedTransport


@pytest.mark.parametrize(
    ("argv", "root"),
    [
        (probes.kill_argv("SIGTERM", [100, 101]), True),
        (probes.kill_argv("SIGKILL", [100]), True),
        (probes.unit_stop_argv("sglang.service"), True),
        (probes.unit_kill_argv("sglang.service"), True),
        (["systemctl", "start", "--", "sglang.service"], True),
        (["systemctl", "restart", "--", "sglang.service"], True),
        (probes.holders_scan_argv(["/dev/nvidia*"]), True),
        (probes.exe_argv([100, 101]), True),
        (lock_argv("/run/lock/fleet-reset.lock", "run-1", 10), True),
        (lock_argv("/var/lock/fleet-reset.lock", "run-1", 10), True),
        (probes.unit_state_argv("sglang.service"), False),
        (probes.ps_argv([100]), False),
        (probes.alive_argv([100]), False),
        (probes.gpu_query_argv("nvidia-smi", probes.VERIFY_FIELDS), False),
        (probes.compute_apps_argv("/usr/bin/nvidia-smi"), False),
        (lock_argv("/srv/sim/gpu-01/run/fleet-reset.lock", "run-1", 10), False),
        (["cat", "--", "/run/lock/fleet-reset.lock.owner"], False),
        (["find", "/srv", "-name", "x"], False),
        (["find", "/procfs"], False),
        (["systemctl"], False),
        ([], False),
    ],
)
def test_needs_root(argv: list[str], root: bool) -> None:
    assert probes.needs_root(argv) is root


def test_bounded_argv_prefixes_sudo_only_when_asked() -> None:
    assert bounded_argv(["kill", "-s", "TERM", "--", "7"], 5) == ["timeout", "-k", "1", "5.0", "kill", "-s", "TERM",
                                                                  "--", "7"]
    assert bounded_argv(["kill", "--", "7"], 2.5, become=True) == ["sudo", "-n", "timeout", "-k", "1", "2.5",
                                                                   "kill", "--", "7"]


@pytest.mark.parametrize("stderr", ["sudo: a password is required\n", "sudo: a terminal is required to read the"
                                                                      " password; use -S\n"])
def test_a_sudo_that_asks_is_one_auth_error_line(stderr: str) -> None:
    host = make_host()
    result = CommandResult(("systemctl", "stop", "--no-block", "--", "x.service"), 1, "", stderr, 0.01)
    with pytest.raises(AuthError) as caught:
        finish(result, host, 5, become=True)
    assert str(caught.value) == (
        "sudo -n on gpu-01 needs a password for systemctl: allow it in sudoers (NOPASSWD) or run as root"
    )
    assert finish(result, host, 5, become=False) is result  # no sudo ran: the same stderr is data


async def test_with_become_only_privileged_commands_get_sudo(tmp_path: Path) -> None:
    """A whole reset over the scripted transport: sudo for kill, stop, /proc scans and the lock; nothing else."""
    t = ScriptedTransport(node_script(), become=True)
    report, _ = await run([make_host(become=True)], {"gpu-01": t}, tmp_path)
    assert report.hosts["gpu-01"].status is HostStatus.CLEAN, report.hosts["gpu-01"].error
    with_sudo = {argv[0] for argv, wire in zip(t.ran, t.sent, strict=True) if wire[:2] == ("sudo", "-n")}
    without = {argv[0] for argv, wire in zip(t.ran, t.sent, strict=True) if wire[0] == "timeout"}
    assert with_sudo == {"flock", "systemctl", "find", "kill"}
    assert without == {"systemctl", "ps", "nvidia-smi", "awk", "grep"}  # awk, grep: world-readable /proc files
    for argv, wire in zip(t.ran, t.sent, strict=True):
        assert (wire[:2] == ("sudo", "-n")) is probes.needs_root(argv), argv
        assert wire[-len(argv):] == argv
    shows = [wire for argv, wire in zip(t.ran, t.sent, strict=True) if argv[:2] == ("systemctl", "show")]
    assert shows and all(wire[0] == "timeout" for wire in shows)


async def test_without_become_nothing_gets_sudo(tmp_path: Path) -> None:
    t = ScriptedTransport(node_script())
    report, _ = await run([make_host()], {"gpu-01": t}, tmp_path)
    assert report.hosts["gpu-01"].status is HostStatus.CLEAN
    assert t.sent and all(wire[0] == "timeout" for wire in t.sent)
