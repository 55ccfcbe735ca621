"""Privilege: only the probes that declare `needs_root` go through `sudo -n` on a `become` host."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.scripted_run import make_host, node_script, run

from fleet.model.errors import AuthError
from fleet.model.report import HostStatus, Reason
from fleet.node.bounds import Bound
from fleet.node.node import Node
from fleet.node.probe import Probe
from fleet.node.probes import lineage, procs, smi, units
from fleet.reset import lock
from fleet.transport.base import CommandResult, OpenCommand, bounded_argv, finish
from fleet.transport.scripted import ScriptedTransport

ID_100 = procs.Identity(pid=100, start=4242, exe=b"/usr/bin/python3.11", user="root")
ID_101 = procs.Identity(pid=101, start=4243, exe=None, user="alice")


def through_sudo(wire: Sequence[str]) -> bool:
    """Whether a command went on the wire through sudo: `timeout -k K T sudo -n ...` (sudo inside the bound)."""
    return list(wire[:6]) == ["timeout", "-k", wire[2], wire[3], "sudo", "-n"]


@pytest.mark.parametrize(
    ("probe", "root"),
    [
        pytest.param(procs.signal("SIGTERM", [ID_100, ID_101]), True, id="signal TERM"),
        pytest.param(procs.signal("SIGKILL", [ID_100]), True, id="signal KILL"),
        pytest.param(procs.signal(procs.ALIVE, [ID_100]), True, id="alive (same identity)"),
        pytest.param(units.unit_stop("sglang.service"), True, id="unit_stop"),
        pytest.param(units.unit_kill("sglang.service"), True, id="unit_kill"),
        pytest.param(procs.holder_scan(["/dev/nvidia*"]), True, id="holder_scan"),
        pytest.param(procs.exe([100, 101]), True, id="exe"),
        pytest.param(lock.lock_probe("/run/fleet/reset.lock", "run-1", 10), True, id="lock in /run"),
        pytest.param(lock.lock_probe("/var/lock/fleet-reset.lock", "run-1", 10), True, id="lock in /var/lock"),
        pytest.param(units.unit_state("sglang.service"), False, id="unit_state"),
        pytest.param(units.unit_restart("sglang.service"), False, id="unit_restart"),
        pytest.param(procs.ps([100]), True, id="ps (sees every process, hidepid too)"),
        pytest.param(lineage.lineage([100]), True, id="lineage"),
        pytest.param(units.units_of([100], simulated=False), True, id="units_of"),
        pytest.param(smi.gpu_query("nvidia-smi", smi.VERIFY_FIELDS), False, id="gpu_query"),
        pytest.param(smi.compute_apps("/usr/bin/nvidia-smi"), False, id="compute_apps"),
        pytest.param(lock.lock_probe("/srv/sim/gpu-01/run/fleet-reset.lock", "run-1", 10), False, id="lock in /srv"),
        pytest.param(lock.owner_probe("/run/lock/fleet-reset.lock"), False, id="lock owner"),
    ],
)
def test_needs_root(probe: Probe[Any], root: bool) -> None:
    assert probe.needs_root is root


def test_bounded_argv_prefixes_sudo_only_when_asked_and_bounds_sudo_itself() -> None:
    assert bounded_argv(["kill", "-s", "TERM", "--", "7"], 5) == ["timeout", "-k", "1", "5.0", "kill", "-s", "TERM",
                                                                  "--", "7"]
    assert bounded_argv(["kill", "--", "7"], 2.5, become=True) == ["timeout", "-k", "1", "2.5", "sudo", "-n",
                                                                   "timeout", "-k", "1", "2.5", "kill", "--", "7"]


@pytest.mark.parametrize("stderr", ["sudo: a password is required\n", "sudo: a terminal is required to read the"
                                                                      " password; use -S\n"])
def test_a_sudo_that_asks_is_one_auth_error_line(stderr: str) -> None:
    host = make_host()
    result = CommandResult(argv=("systemctl", "stop", "--no-block", "--", "x.service"), exit_status=1, stdout="",
                           stderr=stderr, duration_s=0.01)
    with pytest.raises(AuthError) as caught:
        finish(result, host, 5, become=True)
    assert str(caught.value) == (
        "sudo -n on gpu-01 needs a password for systemctl: allow it in sudoers (NOPASSWD) or run as root"
    )
    assert caught.value.reason is Reason.AUTH
    assert finish(result, host, 5, become=False) is result  # no sudo ran: the same stderr is data


async def test_with_become_only_privileged_commands_get_sudo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole reset over the scripted transport: sudo for signals, stop, /proc reads and the lock; nothing else."""
    asked: list[Probe[Any]] = []  # every probe the node ran, batched or held
    node_run, node_hold, node_batch = Node.run, Node.open_command, Node.batch

    async def run_probe(self: Node, probe: Probe[Any], **kw: Any) -> CommandResult:
        asked.append(probe)
        return await node_run(self, probe, **kw)

    async def hold_probe(self: Node, probe: Probe[Any], **kw: Any) -> OpenCommand:
        asked.append(probe)
        return await node_hold(self, probe, **kw)

    async def batch_probes(self: Node, probes: Sequence[Probe[Any] | tuple[Probe[Any], Bound]], **kw: Any) -> Any:
        asked.extend(p[0] if isinstance(p, tuple) else p for p in probes)
        return await node_batch(self, probes, **kw)

    monkeypatch.setattr(Node, "run", run_probe)
    monkeypatch.setattr(Node, "open_command", hold_probe)
    monkeypatch.setattr(Node, "batch", batch_probes)
    t = ScriptedTransport(script=node_script(), become=True)
    report, _ = await run([make_host(become=True)], {"gpu-01": t}, tmp_path)
    assert report.hosts["gpu-01"].status is HostStatus.CLEAN, report.hosts["gpu-01"].error
    with_sudo = {argv[0] for argv, wire in zip(t.ran, t.sent, strict=True) if through_sudo(wire)}
    without = {argv[0] for argv, wire in zip(t.ran, t.sent, strict=True) if not through_sudo(wire)}
    # sudo: the lock, systemctl stop, and everything that reads other users' /proc entries (the holder
    # scan: sh, scan.sh's find; ps, exe, lineage, cgroups: under hidepid, all of them) or signals (sh: the
    # identity-checked signal),
    # and the kernel log (sh too: journalctl piped through the Xid summary), and the lock (sh: lock.sh); env: the
    # exe lookup and the lineage walk, run in the C locale (`env LC_ALL=C ...`: they escape bytes, not characters)
    assert with_sudo == {"systemctl", "sh", "ps", "env", "grep"}
    assert any(argv[3:4] == ("fleet-scan",) and through_sudo(wire) for argv, wire in zip(t.ran, t.sent, strict=True))
    assert any("fleet-kernel-log" in argv and through_sudo(wire) for argv, wire in zip(t.ran, t.sent, strict=True))
    assert any(lock.is_lock_argv(argv) and through_sudo(wire) for argv, wire in zip(t.ran, t.sent, strict=True))
    assert without == {"systemctl", "nvidia-smi", "nv-fabricmanager"}  # its version: a compiled-in string
    by_argv = {probe.argv: probe for probe in asked}
    assert sorted(by_argv) == sorted(set(t.ran))  # every command is a probe that declared its privilege
    for argv, wire in zip(t.ran, t.sent, strict=True):  # a batched one went in a batch of its own privilege
        assert through_sudo(wire) is by_argv[argv].needs_root, argv
        assert wire[-len(argv):] == argv or shlex.join(argv) in wire
    # A unit's state is read without sudo, but for the look that says whether drain's stop ends a running unit: it
    # rides in the stop's own command (a batch is one command a privilege, the privileged one first: before the stop)
    shows = [(argv, wire) for argv, wire in zip(t.ran, t.sent, strict=True) if argv[:2] == ("systemctl", "show")]
    before = [wire for argv, wire in shows if argv[2] == "--property=ActiveState"]
    assert before and all(through_sudo(wire) for wire in before)
    assert len(shows) > len(before) and not any(through_sudo(wire) for argv, wire in shows if wire not in before)


async def test_without_become_nothing_gets_sudo(tmp_path: Path) -> None:
    t = ScriptedTransport(script=node_script())
    report, _ = await run([make_host()], {"gpu-01": t}, tmp_path)
    assert report.hosts["gpu-01"].status is HostStatus.CLEAN
    assert t.sent and all(wire[0] == "timeout" and not through_sudo(wire) for wire in t.sent)
