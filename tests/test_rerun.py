"""`--rerun-failed [RUN_ID|last]`: exactly the hosts that did not end clean in that run, from the history."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest

from fleet.cli import optional_value
from fleet.report.history import HostRow, RunRecord, RunRow, not_clean
from fleet.report.logs import new_run_id
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, UnitSpec

XID_79 = ((5, 79, "pid=2718, name=sglang, GPU has fallen off the bus."),)


def test_a_bare_option_means_the_last_run() -> None:
    assert optional_value(["reset", "--rerun-failed"], "--rerun-failed", "last") == ["reset", "--rerun-failed", "last"]
    assert optional_value(["--rerun-failed", "-y"], "--rerun-failed", "last") == ["--rerun-failed", "last", "-y"]
    assert optional_value(["--rerun-failed", "R1"], "--rerun-failed", "last") == ["--rerun-failed", "R1"]
    assert optional_value(["--", "--rerun-failed"], "--rerun-failed", "last") == ["--", "--rerun-failed"]


def _row(host: str, status: str) -> HostRow:
    return HostRow("r", host, status, None, None, 0.0, [], 0, [], None, None, None, [], None, None)


def test_not_clean_counts_hosts_a_killed_run_never_recorded() -> None:
    run = RunRow("r", "reset", ("a", "b", "c", "d", "e"), {}, "2026-12-03T00:00:00.000", None, None, "0.1.0", "/x")
    record = RunRecord(run, [_row("a", "clean"), _row("b", "failed"), _row("c", "skipped"), _row("e", "planned")])
    assert not_clean(record) == ["b", "c", "d"]


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[SimFleet]:
    """Three nodes; gpu-b02's kernel log has an Xid 79, so every reset fails it."""
    unit = UnitSpec("sglang.service", gpus=(0, 1), mib=30000)
    specs = [NodeSpec(name=n, units=(unit,), linger_s=0.2, xids=XID_79 if n == "gpu-b02" else ())
             for n in ("gpu-b01", "gpu-b02", "gpu-b03")]
    async with SimFleet(tmp_path / "sim", specs) as fleet:
        yield fleet


def fleet_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleet", *args], capture_output=True, text=True, timeout=120,
                          check=False, stdin=subprocess.DEVNULL)


async def test_rerun_targets_the_failed_hosts_of_the_last_run_or_of_a_named_one(sim: SimFleet,
                                                                                tmp_path: Path) -> None:
    inventory, logs = str(sim.inventory_path), str(tmp_path / "logs")
    first = await anyio.to_thread.run_sync(lambda: fleet_cli(
        "reset", "-i", inventory, "-g", "sim", "-y", "--json", "--log-dir", logs))
    assert first.returncode == 1
    first_id = json.loads(first.stdout)["run_id"]

    again = await anyio.to_thread.run_sync(lambda: fleet_cli(
        "reset", "-i", inventory, "--rerun-failed", "-y", "--json", "--log-dir", logs))
    assert again.returncode == 1, again.stderr
    assert list(json.loads(again.stdout)["hosts"]) == ["gpu-b02"]
    assert f"rerunning 1 host of run {first_id}: gpu-b02" in again.stderr

    named = await anyio.to_thread.run_sync(lambda: fleet_cli(
        "reset", "-i", inventory, "--rerun-failed", first_id, "--exclude", "gpu-b02", "-y", "--log-dir", logs))
    assert named.returncode == 2 and "no host" in named.stderr  # --exclude narrowed it to nothing


async def test_nothing_to_rerun_exits_0_and_a_bad_run_or_mix_exits_2(sim: SimFleet, tmp_path: Path) -> None:
    inventory, logs = str(sim.inventory_path), str(tmp_path / "logs")
    clean = await anyio.to_thread.run_sync(lambda: fleet_cli(
        "reset", "-i", inventory, "gpu-b01", "-y", "--log-dir", logs))
    assert clean.returncode == 0
    nothing = await anyio.to_thread.run_sync(lambda: fleet_cli(
        "reset", "-i", inventory, "--rerun-failed", "last", "-y", "--log-dir", logs))
    assert nothing.returncode == 0 and "nothing to rerun: every host of run" in nothing.stderr
    unknown = await anyio.to_thread.run_sync(lambda: fleet_cli(
        "reset", "-i", inventory, "--rerun-failed", "20200101T000000Z-000000", "-y", "--log-dir", logs))
    assert unknown.returncode == 2 and "no run '20200101T000000Z-000000' on record" in unknown.stderr
    mixed = await anyio.to_thread.run_sync(lambda: fleet_cli(
        "reset", "-i", inventory, "--rerun-failed", "-g", "sim", "-y", "--log-dir", logs))
    assert mixed.returncode == 2 and "--rerun-failed chooses the hosts" in mixed.stderr
    empty = await anyio.to_thread.run_sync(lambda: fleet_cli(
        "reset", "-i", inventory, "--rerun-failed", "-y", "--log-dir", str(tmp_path / "none")))
    assert empty.returncode == 2 and "no run on record" in empty.stderr


async def test_a_nightly_reset_keeps_its_history_in_bounds(sim: SimFleet, tmp_path: Path) -> None:
    """`reset --keep-days N`: after the run, runs older than N days go (their folders too); this one stays."""
    logs = tmp_path / "logs"
    old = new_run_id(datetime.now(UTC) - timedelta(days=40))
    (logs / old).mkdir(parents=True)
    done = await anyio.to_thread.run_sync(lambda: fleet_cli(
        "reset", "-i", str(sim.inventory_path), "gpu-b01", "-y", "--json", "--keep-days", "30",
        "--log-dir", str(logs)))
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    assert not (logs / old).exists() and (logs / run_id / "summary.json").exists()
    assert "pruned runs older than 30 days: 0 records, 1 log folder" in done.stderr
