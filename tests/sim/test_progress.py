"""The run as it goes: a live view on a terminal, a status line every interval without one, never on stdout."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from fleet.engine.walk import HostRun, Mode, worst_by_phase
from fleet.inventory.host import Host
from fleet.model.report import HostStatus, StepName
from fleet.report import progress
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, UnitSpec


@dataclass
class FakeRun:
    status: HostStatus | None = None
    current: StepName | None = None
    started: float | None = None
    ended: float | None = None
    worst_s: float | None = None
    locking: float | None = None


def test_a_host_waiting_for_another_runs_lock_is_said_once_it_has_waited_a_few_seconds() -> None:
    """Hosts that wait for the node's reset lock count as `lock`; past LOCK_SAID_S they are named, with the longest
    wait, on the status line and in the live view's caption."""
    hosts = {"a": FakeRun(None, None, 0.0, locking=1.0), "b": FakeRun(None, None, 0.0, locking=2.0),
             "c": FakeRun(None, None, 0.0, locking=9.5), "d": FakeRun(None, StepName.KILL, 0.0)}
    snap = progress.snapshot(hosts, started=0.0, now=10.0)
    assert dict(snap.in_flight) == {"lock": 3, "kill": 1}
    assert progress.status_line(snap).endswith("; waiting for another run's reset lock: a,b (up to 9 s)")
    assert str(progress.table(snap).caption).endswith("waiting for another run's reset lock: a,b (up to 9 s)")
    alone = progress.snapshot({"a": FakeRun(None, None, 0.0, locking=5.5)}, started=0.0, now=10.0)
    assert progress.lock_line(alone) == "waiting for another run's reset lock: a (4 s)"
    assert progress.lock_line(progress.snapshot(hosts, started=0.0, now=4.0)) is None  # none past 3 s yet


def test_snapshot_counts_each_host_once_and_names_the_slowest() -> None:
    hosts = {
        "a": FakeRun(HostStatus.CLEAN, None, 0.0, 10.0),
        "b": FakeRun(HostStatus.FAILED, None, 0.0, 12.0),
        "c": FakeRun(None, StepName.SETTLE, 1.0),
        "d": FakeRun(None, StepName.KILL, 5.0),
        "e": FakeRun(None, None, 9.0),  # connecting
        "f": FakeRun(),  # waiting for its wave
    }
    snap = progress.snapshot(hosts, started=0.0, now=15.0)
    assert snap.finished == 2 and snap.waiting == 1
    assert dict(snap.in_flight) == {"settle": 1, "kill": 1, "connect": 1}
    assert snap.slowest[0] == ("c", "settle", 14.0)
    assert snap.eta_s is None  # c has run 14 s, past the typical 11 s: when it ends cannot be told
    line = progress.status_line(snap)
    assert line.startswith("fleet: 2/6 done (1 clean, 1 failed); in flight: connect 1, kill 1, settle 1; 1 waiting;")
    assert "15 s elapsed" in line and "slowest c (settle, 14 s)" in line


def test_the_estimate_comes_from_the_typical_host_and_the_waves_still_to_start() -> None:
    hosts = {"a": FakeRun(HostStatus.CLEAN, None, 0.0, 10.0), "b": FakeRun(HostStatus.CLEAN, None, 0.0, 12.0),
             "c": FakeRun(None, StepName.KILL, 10.0), "d": FakeRun()}
    snap = progress.snapshot(hosts, started=0.0, now=13.0)
    assert snap.eta_s == (11 - 3) + 11  # c's 8 s to the typical 11, then d's wave
    assert "about 19 s left" in progress.status_line(snap)


@pytest.mark.parametrize("elapsed", [10.5, 11.0, 60.0])
def test_a_host_in_flight_past_the_typical_duration_with_no_bound_known_is_never_about_0_s_left(
        elapsed: float) -> None:
    """A host stuck in a step and nothing known of how long it can take there: no estimate, rather than a wrong
    one."""
    hosts = {"a": FakeRun(HostStatus.CLEAN, None, 0.0, 11.0), "b": FakeRun(None, StepName.SETTLE, 0.0)}
    snap = progress.snapshot(hosts, started=0.0, now=elapsed)
    assert snap.eta_s is None
    assert "left" not in progress.status_line(snap) and "left" not in str(progress.table(snap).title)


@pytest.mark.parametrize(("elapsed", "left"), [(5.0, 6.0), (10.5, 30.5), (30.0, 11.0), (40.0, 1.0), (40.5, None),
                                               (90.0, None)])
def test_a_host_past_the_typical_duration_counts_on_the_longest_one_way_of_going_wrong_takes(
        elapsed: float, left: float | None) -> None:
    """b's driver is wedged (30 s at the default bounds, where it is): past the typical 11 s, the estimate is what
    is left of those 30 s and the typical rest; past that too (two things went wrong), nothing, never 0 s."""
    hosts = {"a": FakeRun(HostStatus.CLEAN, None, 0.0, 11.0), "b": FakeRun(None, StepName.VERIFY, 0.0, None, 30.0)}
    snap = progress.snapshot(hosts, started=0.0, now=elapsed)
    assert snap.eta_s == left
    shown = progress.status_line(snap)
    assert (f"about {left:.0f} s left" in shown) if left is not None else ("left" not in shown)


def test_a_hosts_worst_is_where_it_is_now() -> None:
    """A reset's host with a unit, at the default bounds: connect (nothing answers: 20 s), drain (a stop that
    hangs: 40 s), kill (a silent session: 14 s), settle (memory that never comes back: 61 s), verify (a wedged
    driver: 30 s)."""
    host = Host(name="gpu-b01", address="10.0.0.1", services=("sglang.service",))
    run = HostRun(host=host, worst_by_phase=worst_by_phase(host, Mode.RESET))
    seen = {}
    for step in (None, *StepName):
        run.current = step
        seen[step] = run.worst_s
    assert seen == {None: 20.0, StepName.DRAIN: 40.0, StepName.KILL: 14.0, StepName.SETTLE: 61.0,
                    StepName.VERIFY: 30.0}
    assert HostRun(host=host).worst_s is None


def test_no_estimate_before_a_host_finished_and_none_once_all_did() -> None:
    assert progress.snapshot({"a": FakeRun(None, StepName.DRAIN, 0.0)}, 0.0, 3.0).eta_s is None
    done = progress.snapshot({"a": FakeRun(HostStatus.CLEAN, None, 0.0, 2.0)}, 0.0, 3.0)
    assert "left" not in progress.status_line(done)


def test_status_interval_comes_from_the_environment() -> None:
    assert progress.status_interval({}) == 30.0
    assert progress.status_interval({"FLEET_STATUS_INTERVAL": "2"}) == 2.0
    assert progress.status_interval({"FLEET_STATUS_INTERVAL": "soon"}) == 30.0


@pytest.fixture
async def slow_fleet(tmp_path: Path) -> AsyncIterator[SimFleet]:
    """Two nodes whose memory lingers 3 s after the unit dies: a reset takes a few seconds."""
    unit = UnitSpec(name="sglang.service", gpus=(0, 1), mib=30000)
    specs = [NodeSpec(name=n, units=(unit,), linger_s=3.0) for n in ("gpu-b01", "gpu-b02")]
    async with SimFleet(tmp_path / "sim", specs) as sim:
        yield sim


def _reset_argv(sim: SimFleet, tmp_path: Path) -> list[str]:
    return [sys.executable, "-m", "fleet", "reset", "-i", str(sim.inventory_path), "-g", "sim", "-y", "--json",
            "--log-dir", str(tmp_path / "logs")]


async def test_without_a_terminal_a_status_line_comes_every_interval_on_stderr(slow_fleet: SimFleet,
                                                                              tmp_path: Path) -> None:
    env = {**os.environ, "FLEET_STATUS_INTERVAL": "0.5"}
    done = await anyio.to_thread.run_sync(lambda: subprocess.run(
        _reset_argv(slow_fleet, tmp_path), capture_output=True, text=True, env=env, timeout=120, check=False))
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)["hosts"]) == {"gpu-b01", "gpu-b02"}  # stdout: the document alone
    lines = [line for line in done.stderr.splitlines() if line.startswith("fleet: ") and " done" in line]
    assert len(lines) >= 2, done.stderr
    assert any("in flight: " in line for line in lines)


async def test_on_a_terminal_the_live_view_is_on_stderr_and_stdout_stays_one_document(slow_fleet: SimFleet,
                                                                                      tmp_path: Path) -> None:
    argv = _reset_argv(slow_fleet, tmp_path)
    code, out, shown = await anyio.to_thread.run_sync(_run_on_a_terminal, argv)
    assert code == 0, shown.decode(errors="replace")
    assert set(json.loads(out)["hosts"]) == {"gpu-b01", "gpu-b02"}
    assert b"hosts done" in shown and b"settle" in shown  # the live view's title and its step columns
    assert b"hosts done" not in out


def _run_on_a_terminal(argv: list[str]) -> tuple[int, bytes, bytes]:
    """Run argv with stderr on a pseudo-terminal and stdout on a pipe: (exit code, stdout, what the terminal
    showed)."""
    leader, follower = pty.openpty()
    try:
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=follower, stdin=subprocess.DEVNULL,
                              env={**os.environ, "COLUMNS": "120"}) as process:
            os.close(follower)
            follower = -1
            shown = _read_all(leader, process)
            out = process.stdout.read() if process.stdout else b""
            code = process.wait(timeout=30)
    finally:
        if follower >= 0:
            os.close(follower)
        os.close(leader)
    return code, out, shown


def _read_all(fd: int, process: subprocess.Popen[bytes]) -> bytes:
    """Everything the terminal shows until the process ends (bounded)."""
    chunks = []
    for _ in range(1200):
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        elif process.poll() is not None:
            break
    return b"".join(chunks)
