"""SIGHUP over a real `fleet` process: the operator's terminal closed mid-run. The run is cut as by Ctrl-C and
exits 129 with summary.json, report.html and its history end written and nothing left running on the nodes;
the same when the hang-up is a real one (fleet under a pty whose master is closed: its writes there fail with
EIO) and when its stderr is a pipe nobody reads (EPIPE). The demo's simulated workers end with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

import anyio
from support.demo_run import demo_workers, end_workers
from support.hung_fleet import fleet_commands_on, wait_for_drain
from support.hung_fleet import hung_fleet as hung_fleet  # two nodes whose unit ignores SIGTERM: a reset sits in drain
from support.waits import until

from fleet.engine.interrupts import HANGUP_LINE
from fleet.history import History, history_path
from fleet.report.html_report import REPORT_HTML
from fleet.runlog.folder import SUMMARY
from fleet.sim.fleetsim import SimFleet

WAIT_S = 60


def reset_argv(sim: SimFleet, logs: Path) -> list[str]:
    return [sys.executable, "-m", "fleet", "reset", "-i", str(sim.inventory_path), "-g", "sim", "-y", "--json",
            "--log-dir", str(logs)]


@contextmanager
def started(argv: list[str], **streams: Any) -> Iterator[subprocess.Popen[bytes]]:
    """The process, SIGKILLed by its pid and reaped if the test leaves it running."""
    process = subprocess.Popen(argv, **streams)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


async def ended(process: subprocess.Popen[bytes]) -> int:
    return await anyio.to_thread.run_sync(lambda: process.wait(timeout=WAIT_S))


def cut_by_the_hang_up(logs: Path, during: str = "drain") -> dict[str, Any]:
    """The run folder's report and page, and the history's end, of a run a hang-up cut: its summary."""
    (folder,) = (p.parent for p in logs.glob(f"*/{SUMMARY}"))
    assert (folder / REPORT_HTML).is_file()
    document: dict[str, Any] = json.loads((folder / SUMMARY).read_text())
    assert {h["error"] for h in document["hosts"].values()} == {f"interrupted during {during}"}
    assert {h["reason"] for h in document["hosts"].values()} == {"interrupted"}
    with History.open(history_path(logs)) as history:
        record = history.get(folder.name)
    assert record is not None and record.run.ended_at is not None and record.run.exit_code == 129
    return document


async def nothing_left_on(sim: SimFleet) -> None:
    await until(lambda: fleet_commands_on(sim) == [], "fleet's commands on the nodes ended")


async def test_sighup_mid_run_exits_129_says_so_and_writes_the_report(hung_fleet: SimFleet, tmp_path: Path) -> None:
    logs, out, err = tmp_path / "logs", tmp_path / "stdout.json", tmp_path / "stderr.txt"
    with out.open("wb") as stdout, err.open("wb") as stderr, \
            started(reset_argv(hung_fleet, logs), stdout=stdout, stderr=stderr) as process:
        await wait_for_drain(logs)
        process.send_signal(signal.SIGHUP)
        assert await ended(process) == 129
    said = err.read_text()
    assert said.count(HANGUP_LINE) == 1, said
    assert "fleet: interrupted; in-flight commands were ended" in said
    assert json.loads(out.read_text()) == cut_by_the_hang_up(logs)  # --json's document, as on disk
    await nothing_left_on(hung_fleet)


async def test_a_real_hang_up_under_a_pty_its_writes_failing_still_writes_the_report(
    hung_fleet: SimFleet, tmp_path: Path
) -> None:
    """fleet the session leader of a pty (its live view and --json on it), the master closed: the kernel hangs
    the terminal up and sends SIGHUP; every later write there fails with EIO."""
    logs = tmp_path / "logs"
    master, slave = os.openpty()
    try:
        argv = ["setsid", "--ctty", *reset_argv(hung_fleet, logs)]  # setsid execs: its pid is fleet's
        with started(argv, stdin=slave, stdout=slave, stderr=slave) as process:
            os.close(slave)
            async with anyio.create_task_group() as group:
                group.start_soon(_drain, master)  # what fleet shows, read so that it never blocks on a full pty
                await wait_for_drain(logs)
                group.cancel_scope.cancel()
            os.close(master)
            master = -1
            assert await ended(process) == 129
    finally:
        for fd in (master, slave):
            with suppress(OSError):
                os.close(fd)
    cut_by_the_hang_up(logs)
    await nothing_left_on(hung_fleet)


async def _drain(master: int) -> None:
    while True:
        await anyio.wait_readable(master)
        try:
            os.read(master, 65536)
        except OSError:
            return


async def test_a_stderr_nobody_reads_any_more_never_crashes_the_report_path(hung_fleet: SimFleet,
                                                                           tmp_path: Path) -> None:
    """`fleet ... 2>&1 | tee log` and tee ended with the terminal: fleet's writes there fail with EPIPE."""
    logs = tmp_path / "logs"
    with started(reset_argv(hung_fleet, logs), stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        for pipe in (process.stdout, process.stderr):
            _close(pipe)
        await wait_for_drain(logs)
        process.send_signal(signal.SIGHUP)
        assert await ended(process) == 129
    cut_by_the_hang_up(logs)
    await nothing_left_on(hung_fleet)


def _close(pipe: IO[bytes] | None) -> None:
    assert pipe is not None
    pipe.close()




async def test_the_demo_hung_up_mid_run_exits_129_and_ends_its_simulated_workers(tmp_path: Path) -> None:
    logs, scratch = tmp_path / "logs", tmp_path / "tmp"
    scratch.mkdir()
    argv = [sys.executable, "-m", "fleet", "demo", "--nodes", "2", "--log-dir", str(logs)]
    try:
        with (tmp_path / "stderr.txt").open("wb") as stderr, \
                started(argv, stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, "TMPDIR": str(scratch)}) \
                as process:
            await until(lambda: any('"step_start"' in p.read_text() for p in logs.glob("*/*.jsonl")), "a step began")
            assert demo_workers(scratch), "the demo's simulated workers run"
            process.send_signal(signal.SIGHUP)
            assert await ended(process) == 129
    finally:  # a demo this test had to SIGKILL cannot end its workers: they are ended here, each by its pid
        left = end_workers(scratch)
    said = (tmp_path / "stderr.txt").read_text()
    assert HANGUP_LINE in said and "simulated fleet torn down" in said, said
    assert left == []
    assert list(logs.glob(f"*/{SUMMARY}")) and list(logs.glob(f"*/{REPORT_HTML}"))
