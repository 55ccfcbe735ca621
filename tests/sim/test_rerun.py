"""`--rerun-failed [RUN_ID|last]`: exactly the hosts that did not end clean in that run, from the history."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest
from support.demo_run import demo_env

from fleet.cli.commands import optional_value
from fleet.history import HISTORY_FILE, History, HostRow, RunRecord, RunRow, not_clean
from fleet.history.rerun import Rerun, decide, find_run
from fleet.model.errors import UsageError
from fleet.runlog.folder import new_run_id
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, UnitSpec

XID_79 = ((5, 79, "pid=2718, name=sglang, GPU has fallen off the bus."),)


def test_a_bare_option_means_the_last_run() -> None:
    assert optional_value(["reset", "--rerun-failed"], "--rerun-failed", "last") == ["reset", "--rerun-failed", "last"]
    assert optional_value(["--rerun-failed", "-y"], "--rerun-failed", "last") == ["--rerun-failed", "last", "-y"]
    assert optional_value(["--rerun-failed", "R1"], "--rerun-failed", "last") == ["--rerun-failed", "R1"]
    assert optional_value(["--", "--rerun-failed"], "--rerun-failed", "last") == ["--", "--rerun-failed"]


def _row(host: str, status: str) -> HostRow:
    return HostRow(run_id="r", host=host, status=status, reason=None, error=None, duration_s=0.0, steps=[],
                   killed_count=0, killed=[], memory_before_mib=None, memory_after_mib=None, settle_s=None, health=[],
                   slurm=None, ended_at=None)


def _run(command: str = "reset", mode: str = "reset", targets: tuple[str, ...] = ("a", "b")) -> RunRow:
    return RunRow(run_id="r", command=command, targets=targets, options={"mode": mode},
                  started_at="2026-12-03T00:00:00.000", ended_at=None, exit_code=None, fleet_version="0.1.0",
                  log_dir="/x")


def test_not_clean_counts_hosts_a_killed_run_never_recorded() -> None:
    """Only `clean` on record is clean: a host skipped, cut short or never recorded is not."""
    record = RunRecord(_run(targets=("a", "b", "c", "d", "e")),
                       [_row("a", "clean"), _row("b", "failed"), _row("c", "skipped"), _row("e", "planned")])
    assert not_clean(record) == ["b", "c", "d", "e"]


def test_a_dry_run_or_a_check_is_refused_saying_what_it_was() -> None:
    """Neither reset anything: exit 2 and one line, never "nothing to rerun" (which would let `&&` go on)."""
    dry = decide(RunRecord(_run(mode="plan"), [_row("a", "planned"), _row("b", "planned")]))
    assert dry == Rerun(run_id="r", hosts=(), exit_code=2,
                        line="--rerun-failed: run r was a dry run (fleet reset --dry-run), not a reset: it reset"
                        " nothing; name a reset's run id, or `last` for the newest reset")
    check = decide(RunRecord(_run("check", "check"), [_row("a", "clean"), _row("b", "clean")]))
    assert check.exit_code == 2 and "run r was a check (fleet check), not a reset" in check.line
    assert "\n" not in dry.line + check.line


def test_nothing_to_rerun_only_when_every_target_ended_clean() -> None:
    done = decide(RunRecord(_run(), [_row("a", "clean"), _row("b", "clean")]))
    assert done == Rerun(run_id="r", hosts=(), line="nothing to rerun: every host of run r ended clean", exit_code=0)
    cut = decide(RunRecord(_run(targets=("a", "b", "c", "d")),
                           [_row("a", "clean"), _row("b", "failed"), _row("c", "skipped")]))  # d: the run died
    assert cut == Rerun(run_id="r", hosts=("b", "c", "d"),
                        line="rerunning 3 hosts of run r: b,c,d (1 failed, 1 skipped, 1 not recorded)")
    one = decide(RunRecord(_run(), [_row("a", "clean"), _row("b", "unreachable")]))
    assert (one.hosts, one.exit_code, one.line) == (("b",), None, "rerunning 1 host of run r: b (1 unreachable)")


def test_last_is_the_newest_reset_and_a_history_without_one_says_so(tmp_path: Path) -> None:
    path = tmp_path / HISTORY_FILE
    with pytest.raises(UsageError, match="no run on record in"):
        find_run(None, "last", path)
    with History.open(path) as history:
        for run_id, command, mode in (("R1", "reset", "reset"), ("R2", "reset", "plan"), ("R3", "check", "check"),
                                      ("R4", "demo", "reset")):
            history.start_run(run_id, command, ["a"], {"mode": mode}, f"2026-12-03T00:00:0{run_id[1]}.000+00:00",
                              "0.1.0", tmp_path)
        assert find_run(history, "last", path).run.run_id == "R1"
        assert find_run(history, "R2", path).run.run_id == "R2"  # found; `decide` refuses it
        demo = decide(find_run(history, "R4", path))  # a newer demo is never `last`, and named it is refused
        assert demo.exit_code == 2 and "was the demo (fleet demo: simulated nodes)" in demo.line
        with pytest.raises(UsageError, match="no run 'R9' on record"):
            find_run(history, "R9", path)
    only_dry = tmp_path / "dry" / HISTORY_FILE
    only_dry.parent.mkdir()
    with History.open(only_dry) as history:
        history.start_run("D1", "reset", ["a"], {"mode": "plan"}, "2026-12-03T00:00:00.000+00:00", "0.1.0", tmp_path)
        with pytest.raises(UsageError, match=r"no reset on record in .*, only dry runs, checks and demos"):
            find_run(history, "last", only_dry)


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[SimFleet]:
    """Three nodes; gpu-b02's kernel log has an Xid 79, so every reset fails it."""
    unit = UnitSpec(name="sglang.service", gpus=(0, 1), mib=30000)
    specs = [NodeSpec(name=n, units=(unit,), linger_s=0.2, xids=XID_79 if n == "gpu-b02" else ())
             for n in ("gpu-b01", "gpu-b02", "gpu-b03")]
    async with SimFleet(tmp_path / "sim", specs) as fleet:
        yield fleet


def fleet_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleet", *args], capture_output=True, text=True, timeout=120,
                          check=False, stdin=subprocess.DEVNULL, env=env)


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


async def test_last_skips_a_newer_dry_run_and_check_and_a_named_one_is_refused(sim: SimFleet,
                                                                                tmp_path: Path) -> None:
    """After a failing reset, a check and a dry run: `last` is still the reset (exit 1, so `&&` stops), and
    naming the check or the dry run is exit 2 with one line saying what it was."""
    inventory, logs = str(sim.inventory_path), str(tmp_path / "logs")
    ids = {}
    for name, args, code in (("reset", ("reset", "-y"), 1), ("check", ("check",), 1),
                             ("dry", ("reset", "--dry-run"), 0)):
        done = await anyio.to_thread.run_sync(functools.partial(
            fleet_cli, *args, "-i", inventory, "-g", "sim", "--json", "--log-dir", logs))
        assert done.returncode == code, done.stderr
        ids[name] = json.loads(done.stdout)["run_id"]

    again = await anyio.to_thread.run_sync(lambda: fleet_cli(
        "reset", "-i", inventory, "--rerun-failed", "last", "-y", "--json", "--log-dir", logs))
    assert again.returncode == 1, again.stderr
    assert f"rerunning 1 host of run {ids['reset']}: gpu-b02 (1 failed)" in again.stderr
    assert "nothing to rerun" not in again.stderr and list(json.loads(again.stdout)["hosts"]) == ["gpu-b02"]
    for name, what in (("dry", "a dry run (fleet reset --dry-run)"), ("check", "a check (fleet check)")):
        refused = await anyio.to_thread.run_sync(
            fleet_cli, "reset", "-i", inventory, "--rerun-failed", ids[name], "-y", "--json", "--log-dir", logs)
        assert refused.returncode == 2 and refused.stdout == ""
        assert refused.stderr.splitlines() == [f"fleet: error: --rerun-failed: run {ids[name]} was {what}, not a"
                                               " reset: it reset nothing; name a reset's run id, or `last` for the"
                                               " newest reset"]


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


def test_the_demo_is_recorded_as_such_and_is_never_last(tmp_path: Path) -> None:
    """`fleet demo` records its runs as such (in its own folder, unless --log-dir names another): its simulated
    hosts are never what `--rerun-failed last` reruns."""
    logs = str(tmp_path / "logs")
    with demo_env(tmp_path) as env:
        assert fleet_cli("demo", "--nodes", "2", "--log-dir", logs, env=env).returncode == 0
    with History.open(Path(logs) / HISTORY_FILE) as history:
        run_id = history.last_run_id()
        record = history.get(run_id) if run_id is not None else None
        assert record is not None and record.run.command == "demo"
    done = fleet_cli("reset", "--rerun-failed", "last", "-y", "--log-dir", logs)
    assert done.returncode == 2 and "only dry runs, checks and demos" in done.stderr, done.stderr
