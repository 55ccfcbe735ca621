"""Holders a scan of /proc/PID/fd alone would miss, each a process of user `nobody` on a simulated node behind the
real OpenSSH sshd: a thread with a file table of its own, a process whose leader thread exited while another keeps
the device, a mapping whose fd was closed, the device bind-mounted on another path in a namespace of its own.
`fleet check` says the node is not clean, naming each; `fleet reset` kills
each (and says so) and ends clean: all of them are gone. Needs root (to run processes as nobody) and setpriv.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from support.hidden_holders import TABLE_WAYS, HiddenHolders, hidden_holders
from support.processes import NOBODY
from support.sshd_nodes import NAME, MakeHost, run
from support.sshd_nodes import make_host as make_host  # the fixture: nodes stopped after the test
from support.waits import eventually

from fleet.engine.walk import Mode
from fleet.model.report import HostStatus, Reason
from fleet.sim.node import NodeSpec

__all__ = ["hidden_holders", "make_host"]  # fixtures, used by name


@pytest.fixture
def shared_device() -> Iterator[Path]:
    """A device file nobody may open, in a folder every user may reach; removed after."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv: the holders run as nobody (CI has both)")
    folder = Path(tempfile.mkdtemp(prefix="fleet-hidden-"))
    folder.chmod(0o755)
    device = folder / "nvidia7"
    device.write_bytes(b"\0" * 4096)
    device.chmod(0o644)
    yield device
    shutil.rmtree(folder)


async def test_holders_hidden_from_a_leaders_fd_table_are_seen_killed_and_gone(
        make_host: MakeHost, hidden_holders: HiddenHolders, shared_device: Path, tmp_path: Path) -> None:
    _, host = make_host(NodeSpec(name=NAME))
    host = replace(host, devices=(*host.devices, str(shared_device.parent / "nvidia*")))
    pids = {way: hidden_holders.hold(way, shared_device, prefix=NOBODY) for way in TABLE_WAYS}

    checked, _ = await run(host, tmp_path, Mode.CHECK)
    assert checked.status is HostStatus.FAILED, checked.error
    assert checked.reason is Reason.HOLDERS_LEFT, (checked.reason, checked.error)
    named = [pid for pid in pids.values() if (checked.error or "").startswith(f"pid {pid} python still holds ")]
    assert len(named) == 1 and (checked.error or "").endswith(f"{shared_device} (+2 more)"), checked.error
    assert all(hidden_holders.alive(pid) for pid in pids.values())  # a check kills nothing

    reset, _ = await run(host, tmp_path, Mode.RESET)
    assert reset.status is HostStatus.CLEAN, reset.error
    assert {k.pid for k in reset.killed} == set(pids.values())
    assert {k.user for k in reset.killed} == {"nobody"}
    for pid in pids.values():
        assert await eventually(lambda pid=pid: not hidden_holders.alive(pid), 10), pid  # type: ignore[misc]


async def test_a_device_held_under_another_path_is_seen_killed_and_gone(
        make_host: MakeHost, hidden_holders: HiddenHolders, shared_device: Path, tmp_path: Path) -> None:
    """The link reads a path no glob matches; the device is named as the globs name it, and the holder is killed."""
    _, host = make_host(NodeSpec(name=NAME))
    host = replace(host, devices=(*host.devices, str(shared_device.parent / "nvidia*")))
    target = shared_device.parent / "gpu"
    target.write_bytes(b"")
    pid = hidden_holders.elsewhere(shared_device, target)

    checked, _ = await run(host, tmp_path, Mode.CHECK)
    assert checked.status is HostStatus.FAILED, checked.error
    assert checked.reason is Reason.HOLDERS_LEFT, (checked.reason, checked.error)
    assert checked.error == f"pid {pid} python still holds {shared_device}", checked.error
    assert hidden_holders.alive(pid)

    reset, _ = await run(host, tmp_path, Mode.RESET)
    assert reset.status is HostStatus.CLEAN, reset.error
    assert [(k.pid, k.user) for k in reset.killed] == [(pid, "nobody")]
    assert await eventually(lambda: not hidden_holders.alive(pid), 10)
