"""Run history (`fleet.history`): real SQLite files, real fleet processes where it matters, and the
`fleet runs` / `fleet show` commands over them."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process

from fleet.app.run import run_and_report
from fleet.cli.commands import main
from fleet.engine.options import RunOptions
from fleet.history import (
    HISTORY_FILE,
    History,
    HistoryError,
    HostRow,
    Liveness,
    Recorder,
    RunKind,
    RunRow,
    history_path,
    host_from_row,
    host_values,
    liveness,
    run_id_time,
    run_kind,
    stamp,
)
from fleet.history.recorder import GATHER_S
from fleet.history.schema import MIGRATIONS, json_text
from fleet.history.view import (
    log_line,
    log_lines,
    outcome,
    parse_since,
    run_lines,
    tally,
    tally_line,
    terminal_columns,
    took,
)
from fleet.inventory.host import Host
from fleet.model.codec import run_from_document, settings_document
from fleet.model.errors import ConnectError, UsageError
from fleet.model.fabric import FabricManager
from fleet.model.gpu_facts import GpuSettings
from fleet.model.report import (
    Finding,
    GpuReport,
    HostFinding,
    HostPlan,
    HostReport,
    HostStatus,
    KilledProcess,
    Level,
    PlannedProcess,
    Reason,
    RunReport,
    SchedulerRecord,
    StepName,
    StepResult,
    StepStatus,
)
from fleet.report import render
from fleet.runlog.folder import RunLiveness, RunLogs, new_run_id
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, UnitSpec

NOW = datetime(2026, 12, 2, 11, 5, 1, tzinfo=UTC)


def host(name: str, status: HostStatus = HostStatus.CLEAN, error: str | None = None, reason: Reason | None = None,
         **kw: Any) -> HostReport:
    return HostReport(name=name, status=status, duration_s=1.5, error=error, reason=reason, **kw)


def record_run(history: History, run_id: str, started: datetime, reports: list[HostReport],
               exit_code: int | None = None) -> None:
    """A run as `run_and_report` writes it: started, each host as it ends, then the end (unless None)."""
    history.start_run(run_id, "reset", [r.name for r in reports], {"mode": "reset"}, stamp(started), "0.1.0", "/logs")
    for report in reports:
        history.record_host(run_id, report, stamp(started + timedelta(seconds=5)))
    if exit_code is not None:
        history.finish_run(run_id, stamp(started + timedelta(seconds=8)), exit_code)


# --- the store ------------------------------------------------------------------------------------------------


def test_two_runs_are_on_record_and_the_history_answers_across_them(tmp_path: Path) -> None:
    held = "gpu 0 holds 1523 MiB (pid 39865 python3)"
    with History.open(tmp_path / HISTORY_FILE) as history:
        record_run(history, "run-1", NOW - timedelta(days=1),
                   [host("gpu-b01"), host("gpu-b02", HostStatus.FAILED, held, Reason.MEMORY_HELD)], exit_code=1)
        record_run(history, "run-2", NOW, [host("gpu-b02"), host("gpu-b03", HostStatus.UNREACHABLE, "refused",
                                                                 Reason.CONNECT_REFUSED)], exit_code=1)
    with History.open(tmp_path / HISTORY_FILE) as history:  # a fresh connection reads what the first wrote
        runs = history.runs()
        assert [r.run_id for r in runs] == ["run-2", "run-1"]  # newest first
        assert runs[1].counts == {"clean": 1, "failed": 1}
        assert runs[1].targets == ("gpu-b01", "gpu-b02")
        assert runs[1].exit_code == 1
        assert runs[1].duration_s == 8.0
        assert [(h.run_id, h.status, h.reason, h.error) for h in history.host_history("gpu-b02")] == [
            ("run-2", "clean", None, None), ("run-1", "failed", "memory_held", held)]
        assert [r.run_id for r in history.runs(host="gpu-b01")] == ["run-1"]
        assert [r.run_id for r in history.runs(group_hosts=["gpu-b03", "gpu-x"])] == ["run-2"]
        assert [r.run_id for r in history.runs(status="unreachable")] == ["run-2"]
        assert [r.run_id for r in history.runs(host="gpu-b02", status="failed")] == ["run-1"]
        assert [r.run_id for r in history.runs(since=NOW - timedelta(hours=1))] == ["run-2"]
        assert [r.run_id for r in history.runs(limit=1)] == ["run-2"]
        assert history.last_run_id() == "run-2"
        assert history.last_failed("run-2") == ["gpu-b03"]
        assert history.last_failed("run-1") == ["gpu-b02"]
        record = history.get("run-1")
        assert record is not None
        assert [h.host for h in record.hosts] == ["gpu-b01", "gpu-b02"]
        assert history.get("run-9") is None


def test_the_last_reset_is_the_newest_that_was_not_a_dry_run_and_the_last_run_is_any(tmp_path: Path) -> None:
    """`last_reset_id` (`--rerun-failed last`) passes over dry runs and checks, as `run_kind` tells them;
    `last_run_id` (`fleet show last`) does not."""
    with History.open(tmp_path / HISTORY_FILE) as history:
        assert history.last_reset_id() is None
        runs = (("run-1", "reset", {"mode": "reset"}), ("run-2", "reset", {"mode": "plan"}),
                ("run-3", "check", {"mode": "check"}), ("run-4", "reset", {"mode": "plan"}))
        for minute, (run_id, command, options) in enumerate(runs):
            history.start_run(run_id, command, ["gpu-b01"], options, stamp(NOW + timedelta(minutes=minute)), "0.1.0",
                              "/logs")
            if run_id == "run-2":
                assert history.last_reset_id() == "run-1"
        assert (history.last_run_id(), history.last_reset_id()) == ("run-4", "run-1")
        kinds = {r.run_id: run_kind(r) for r in history.runs()}
        assert kinds == {"run-1": RunKind.RESET, "run-2": RunKind.DRY_RUN, "run-3": RunKind.CHECK,
                         "run-4": RunKind.DRY_RUN}
        record_run(history, "run-5", NOW + timedelta(minutes=9), [host("gpu-b01")], exit_code=0)
        assert history.last_reset_id() == "run-5"


def test_a_host_recorded_again_is_updated_and_keeps_when_it_first_ended(tmp_path: Path) -> None:
    with History.open(tmp_path / HISTORY_FILE) as history:
        history.start_run("run-1", "reset", ["gpu-b01"], {}, stamp(NOW), "0.1.0", "/logs")
        history.record_host("run-1", host("gpu-b01", HostStatus.FAILED, "x", Reason.SLURM), stamp(NOW))
        record = SchedulerRecord(node="gpu-b01", by="slurm", state_after="IDLE")
        history.record_host("run-1", host("gpu-b01", scheduler=record), stamp(NOW + timedelta(seconds=9)))
        (row,) = history.host_history("gpu-b01")
    assert (row.status, row.reason, row.error, row.ended_at) == ("clean", None, None, stamp(NOW))
    assert row.slurm is not None and row.slurm["state_after"] == "IDLE"



def test_hosts_recorded_together_are_each_on_record_across_statements_and_keep_when_they_first_ended(
        tmp_path: Path) -> None:
    """`record_hosts` writes a few dozen hosts a statement: 120 of them (three statements) each read back, and
    those recorded again are updated but keep their first `ended_at`."""
    names = [f"gpu-b{i:03d}" for i in range(120)]
    with History.open(tmp_path / HISTORY_FILE) as history:
        history.start_run("run-1", "reset", names, {}, stamp(NOW), "0.1.0", "/logs")
        history.record_hosts("run-1",
                             [(host(n, gpus=(GpuReport(index=0, memory_used_mib=i),)),
                               stamp(NOW + timedelta(seconds=i)))
                                       for i, n in enumerate(names)])
        later = stamp(NOW + timedelta(hours=1))
        history.record_hosts("run-1", [(host(n, HostStatus.FAILED, "release failed", Reason.SLURM), later)
                                       for n in names[49:51]])
        record = history.get("run-1")
    assert record is not None
    assert [h.host for h in record.hosts] == names
    assert [h.status for h in record.hosts] == ["clean"] * 49 + ["failed"] * 2 + ["clean"] * 69
    assert [h.ended_at for h in record.hosts] == [stamp(NOW + timedelta(seconds=i)) for i in range(120)]
    assert [h.memory_after_mib for h in record.hosts[:3]] == [[0], [1], [2]]

def test_a_host_report_becomes_the_hosts_columns() -> None:
    gpus = (GpuReport(index=0, memory_used_mib=3, settle_s=0.4, health=(Finding("xid", Level.FAIL, "Xid 79"),)),
            GpuReport(index=1, memory_used_mib=None))
    report = HostReport(
        name="gpu-b01", status=HostStatus.FAILED, duration_s=6.1, error="gpu 0: Xid 79",
        steps=(StepResult(name=StepName.DRAIN, status=StepStatus.OK, duration_s=1.2, detail="x"),),
        killed=(KilledProcess(pid=39865, name="python3", user="root", signal="SIGTERM"),), gpus=gpus,
        reason=Reason.HEALTH,
        health=(HostFinding(check="xid", level=Level.FAIL, detail="Xid 74", pci="0000:05:00"),),
    )
    values = host_values(report)
    assert values["reason"] == "health"
    assert json.loads(values["steps"]) == [{"name": "drain", "status": "ok", "duration_s": 1.2}]
    assert values["killed_count"] == 1
    assert json.loads(values["killed"]) == [{"pid": 39865, "name": "python3", "user": "root", "signal": "SIGTERM"}]
    assert json.loads(values["memory_after_mib"]) == [3, None]
    assert json.loads(values["settle_s"]) == [0.4, None]
    assert json.loads(values["health"]) == [  # the host's own (on no listed GPU): gpu null, its PCI address
        {"gpu": 0, "check": "xid", "level": "fail", "detail": "Xid 79"},
        {"gpu": None, "check": "xid", "level": "fail", "detail": "Xid 74", "pci": "0000:05:00"}]
    assert values["memory_before_mib"] is None and values["slurm"] is None
    planned = host_values(host("gpu-b02", HostStatus.PLANNED, plan=HostPlan(gpu_memory_mib=(30000, 0))))
    assert json.loads(planned["memory_before_mib"]) == [30000, 0]
    assert planned["memory_after_mib"] is None



def test_the_settings_column_is_each_gpus_settings_whether_gpus_share_one_value_or_not() -> None:
    """Alike GPUs share one GpuSettings (`of_each`) and its text is made once: the column is still every GPU's,
    in order, as `json_text` writes the list (GPUs equal but not shared, different, and unread included)."""
    h100 = GpuSettings(name="NVIDIA H100 80GB HBM3", driver="575.57.08", power_limit_w=700.0, mig=False)
    lowered = GpuSettings(name="NVIDIA H100 80GB HBM3", driver="575.57.08", power_limit_w=450.0, mig=False)
    alike = dataclasses.replace(h100)
    gpus = (GpuReport(index=0, memory_used_mib=0, settings=h100), GpuReport(index=1, memory_used_mib=0, settings=h100),
            GpuReport(index=2, memory_used_mib=0, settings=lowered),
            GpuReport(index=3, memory_used_mib=0, settings=None), GpuReport(index=4, memory_used_mib=0, settings=alike),
            GpuReport(index=5, memory_used_mib=0, settings=h100))
    column = host_values(host("gpu-b01", gpus=gpus))["settings"]
    assert column == json_text([settings_document(g) for g in gpus])
    assert [None if s is None else s["power_limit_w"] for s in json.loads(column)] == [700.0, 700.0, 450.0, None, 700.0,
                                                                                       700.0]

# --- the schema -----------------------------------------------------------------------------------------------


def test_a_database_at_version_0_is_migrated_and_keeps_what_it_had(tmp_path: Path) -> None:
    path = tmp_path / HISTORY_FILE
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
        conn.execute("INSERT INTO notes VALUES ('kept')")
    conn.close()
    with History.open(path) as history:
        assert history.conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert history.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert history.conn.execute("SELECT text FROM notes").fetchall() == [("kept",)]
        tables = {r[0] for r in history.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        indexes = {r[0] for r in history.conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"runs", "hosts", "notes"} <= tables
    assert {"hosts_by_host", "runs_by_started"} <= indexes


def test_migration_2_adds_the_settings_column_and_keeps_the_rows_before_it(tmp_path: Path) -> None:
    """A history of fleet 0.2 (schema 1) holding a host: migrated, the host reads back with no GPU settings; a host
    recorded after keeps each GPU's (null where verify did not read them) both ways: a page built from the history
    marks the odd hosts out as the run's did."""
    path = tmp_path / HISTORY_FILE
    with History.open(path, migrations=MIGRATIONS[:1]) as old:
        old.start_run("run-1", "reset", ["gpu-b01"], {}, stamp(NOW), "0.2.0", "/logs")
        old.conn.execute("INSERT INTO hosts (run_id, host, status, duration_s, steps, killed_count, killed, health,"
                         " memory_after_mib) VALUES ('run-1', 'gpu-b01', 'clean', 1.0, '[]', 0, '[]', '[]', '[0]')")
    said = GpuSettings(name="NVIDIA H100 80GB HBM3", driver="570.86.15", mig=False, power_limit_w=700.0,
                       app_clock_graphics_mhz=1980)
    gpus = (GpuReport(index=0, memory_used_mib=0, settings=said), GpuReport(index=1, memory_used_mib=0))
    with History.open(path) as history:
        assert history.conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        (before,) = history.host_history("gpu-b01")
        assert before.settings is None and [g.settings for g in host_from_row(before).gpus] == [None]
        record_run(history, "run-2", NOW + timedelta(hours=1), [host("gpu-b01", gpus=gpus)], 0)
        after = next(r for r in history.host_history("gpu-b01") if r.run_id == "run-2")
    assert [g.settings for g in host_from_row(after).gpus] == [said, None]
    assert json.loads(host_values(host("x", gpus=gpus))["settings"])[0]["driver"] == "570.86.15"
    assert host_values(host("x"))["settings"] is None


def test_migration_3_adds_the_fabric_manager_column_and_keeps_the_rows_before_it(tmp_path: Path) -> None:
    """A history of schema 2 holding a host: migrated, it reads back with no fabric manager (not read); a host
    recorded after keeps its own both ways, each state as the JSON report writes it."""
    path = tmp_path / HISTORY_FILE
    with History.open(path, migrations=MIGRATIONS[:2]) as old:
        old.start_run("run-1", "reset", ["gpu-b01"], {}, stamp(NOW), "0.3.0", "/logs")
        old.conn.execute("INSERT INTO hosts (run_id, host, status, duration_s, steps, killed_count, killed, health,"
                         " memory_after_mib) VALUES ('run-1', 'gpu-b01', 'clean', 1.0, '[]', 0, '[]', '[]', '[0]')")
    found = {"gpu-b01": FabricManager.present("575.57.08"), "gpu-b02": FabricManager.absent(),
             "gpu-b03": FabricManager.unread("nv-fabricmanager --version exited 1: x")}
    with History.open(path) as history:
        assert history.conn.execute("PRAGMA user_version").fetchone()[0] == 3
        (before,) = history.host_history("gpu-b01")
        assert before.fabric_manager is None and host_from_row(before).fabric_manager is None
        record_run(history, "run-2", NOW + timedelta(hours=1),
                   [replace(host(name), fabric_manager=fm) for name, fm in found.items()], 0)
        after = {name: next(r for r in history.host_history(name) if r.run_id == "run-2") for name in found}
    assert {name: host_from_row(row).fabric_manager for name, row in after.items()} == found
    assert after["gpu-b01"].fabric_manager == {"state": "present", "version": "575.57.08", "why": None}
    assert host_values(host("x"))["fabric_manager"] is None


def test_migrations_run_in_order_only_the_pending_ones_and_whole_or_not_at_all(tmp_path: Path) -> None:
    path = tmp_path / HISTORY_FILE
    first = (("CREATE TABLE a (x)",), ("CREATE TABLE b (x)", "INSERT INTO b SELECT x FROM a"))
    History.open(path, migrations=first).close()
    third = ("CREATE TABLE c (x)",)
    with History.open(path, migrations=(*first, third)) as history:  # a and b again would fail: not run
        assert history.conn.execute("PRAGMA user_version").fetchone()[0] == 3
    broken = ("CREATE TABLE d (x)", "THIS IS NO SQL")
    with pytest.raises(HistoryError, match="cannot use the history database"):
        History.open(path, migrations=(*first, third, broken))
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 3  # the broken migration left nothing
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'd'").fetchone()[0] == 0
    conn.close()


def test_a_database_from_a_newer_fleet_is_refused_in_one_line_and_left_as_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / HISTORY_FILE
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 7")
    conn.close()
    with pytest.raises(HistoryError) as refused:
        History.open(path)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: written by a newer fleet (history schema 7")
    assert main(["runs", "--log-dir", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"fleet: error: {message}\n"
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 7
        assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
    conn.close()


async def test_a_history_that_cannot_be_written_is_a_warning_never_the_run_s_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A database from a newer fleet: the run runs and reports as without history, plus one warning line."""
    logs = tmp_path / "logs"
    logs.mkdir()
    with sqlite3.connect(history_path(logs)) as conn:
        conn.execute("PRAGMA user_version = 7")
    conn.close()

    async def refused(h: Host) -> Any:
        raise ConnectError(f"connection refused ({h.address}:22)")

    hosts = [Host(name=n, address="192.0.2.1") for n in ("gpu-b01", "gpu-b02")]
    code, report = await run_and_report(hosts, RunOptions(), as_json=False, log_dir=logs, connector=refused)
    assert code == 4  # unreachable, none failed
    assert {h.status for h in report.hosts.values()} == {HostStatus.UNREACHABLE}
    assert (logs / report.run_id / "summary.json").is_file()
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fleet: warning:")]
    assert len(warnings) == 1
    assert "run history not recorded" in warnings[0] and "newer fleet" in warnings[0]


def test_the_recorder_writes_a_run_from_its_own_thread_and_warns_once_when_it_cannot(tmp_path: Path) -> None:
    warnings: list[str] = []
    recorder = Recorder(tmp_path / HISTORY_FILE, "run-1", warnings.append)
    recorder.start_run("reset", ["gpu-b01", "gpu-b02"], {"mode": "reset"}, stamp(NOW), "0.1.0", tmp_path)
    recorder.host_ended(host("gpu-b01"))
    recorder.finish_run([host("gpu-b01"), host("gpu-b02", HostStatus.SKIPPED, "stopped", Reason.STOPPED)], 1)
    recorder.close()
    assert warnings == []
    with History.open(tmp_path / HISTORY_FILE) as history:
        record = history.get("run-1")
    assert record is not None
    assert record.run.exit_code == 1
    assert [(h.host, h.status) for h in record.hosts] == [("gpu-b01", "clean"), ("gpu-b02", "skipped")]

    nowhere = Recorder(tmp_path / "no" / "such" / "folder" / HISTORY_FILE, "run-2", warnings.append)
    nowhere.start_run("reset", ["gpu-b01"], {}, stamp(NOW), "0.1.0", tmp_path)
    nowhere.host_ended(host("gpu-b01"))
    nowhere.finish_run([host("gpu-b01")], 0)
    nowhere.close()
    assert len(warnings) == 1
    assert warnings[0].startswith("run history not recorded:") and "cannot open" in warnings[0]


def test_a_host_is_written_again_at_the_run_end_only_when_its_report_changed(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[tuple[str, str]] = []
    original = History.record_hosts

    def spy(self: History, run_id: str, ended: Sequence[tuple[HostReport, str]]) -> None:
        written.extend((report.name, report.status) for report, _ in ended)
        original(self, run_id, ended)

    monkeypatch.setattr(History, "record_hosts", spy)
    warnings: list[str] = []
    recorder = Recorder(tmp_path / HISTORY_FILE, "run-1", warnings.append)
    recorder.start_run("reset", ["gpu-b01", "gpu-b02", "gpu-b03"], {}, stamp(NOW), "0.1.0", tmp_path)
    recorder.host_ended(host("gpu-b01"))
    recorder.host_ended(host("gpu-b02"))
    released = host("gpu-b02", HostStatus.FAILED, "release failed", Reason.SLURM)  # changed after it ended
    never = host("gpu-b03", HostStatus.SKIPPED, "stopped", Reason.STOPPED)
    # an equal report, not the same object; with its start in the run, which only the final report has (no column)
    recorder.finish_run([host("gpu-b01", start_s=0.25), released, never], 1)
    recorder.close()
    assert warnings == []
    assert written == [("gpu-b01", "clean"), ("gpu-b02", "clean"), ("gpu-b02", "failed"), ("gpu-b03", "skipped")]
    with History.open(tmp_path / HISTORY_FILE) as history:
        record = history.get("run-1")
    assert record is not None
    assert [(h.host, h.status) for h in record.hosts] == [("gpu-b01", "clean"), ("gpu-b02", "failed"),
                                                          ("gpu-b03", "skipped")]


def test_the_writes_queued_while_the_recorder_gathers_are_one_transaction(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Hosts that end while the writer pauses after the first of them (`GATHER_S`) cost one commit together; the
    run's start was written at once, before any pause."""
    pausing, queued, committed, batches = threading.Event(), threading.Event(), threading.Event(), []
    paused: list[float] = []

    def pause(self: Recorder) -> None:  # the gathering pause, held until every write below is queued
        paused.append(self._gather_s)
        pausing.set()
        assert queued.wait(30)

    original = History.batch

    @contextmanager
    def counted(self: History) -> Iterator[None]:
        batches.append(1)
        with original(self):
            yield
        committed.set()

    monkeypatch.setattr(Recorder, "_pause", pause)
    monkeypatch.setattr(History, "batch", counted)
    warnings: list[str] = []
    recorder = Recorder(tmp_path / HISTORY_FILE, "run-1", warnings.append)
    recorder.start_run("reset", ["gpu-b01", "gpu-b02", "gpu-b03"], {}, stamp(NOW), "0.1.0", tmp_path)
    assert committed.wait(30) and not pausing.is_set()  # the run's start: written at once, no pause
    with History.open(tmp_path / HISTORY_FILE) as started:
        assert started.get("run-1") is not None
    recorder.host_ended(host("gpu-b01"))
    assert pausing.wait(30)  # the writer took the first host's write and pauses
    for name in ("gpu-b02", "gpu-b03"):
        recorder.host_ended(host(name))
    queued.set()
    recorder.finish_run([host(n) for n in ("gpu-b01", "gpu-b02", "gpu-b03")], 0)
    recorder.close()
    assert warnings == []
    assert paused[0] == GATHER_S
    assert len(batches) <= 3  # the start alone; the three hosts in one; the end in the same or the next
    with History.open(tmp_path / HISTORY_FILE) as history:
        record = history.get("run-1")
    assert record is not None and record.run.exit_code == 0
    assert [h.host for h in record.hosts] == ["gpu-b01", "gpu-b02", "gpu-b03"]


# --- two writers at once --------------------------------------------------------------------------------------

WRITER = """
import sys
from pathlib import Path
from fleet.history import History, now_stamp
from fleet.model.report import HostReport, HostStatus

path, run_id, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
with History.open(path) as history:
    history.start_run(run_id, "reset", [f"{run_id}-{i}" for i in range(count)], {}, now_stamp(), "0.1.0", "/logs")
    for i in range(count):  # a transaction a host, as a run writes them
        history.record_host(run_id, HostReport(name=f"{run_id}-{i}", status=HostStatus.CLEAN, duration_s=0.1))
    history.finish_run(run_id, now_stamp(), 0)
"""


def test_two_processes_writing_at_once_are_both_recorded_whole(tmp_path: Path) -> None:
    """Two fleet processes create, migrate and write one database at the same moment."""
    path, count = tmp_path / HISTORY_FILE, 300
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), run_id, str(count)],
                              stderr=subprocess.PIPE, text=True) for run_id in ("run-a", "run-b")]
    try:
        errors = [p.communicate(timeout=90)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], errors
    with History.open(path) as history:
        runs = {r.run_id: r for r in history.runs()}
        assert set(runs) == {"run-a", "run-b"}
        assert all(r.counts == {"clean": count} and r.exit_code == 0 for r in runs.values())
        assert len(history.host_history("run-a-299")) == 1


# --- retention ------------------------------------------------------------------------------------------------


def test_prune_removes_records_and_log_folders_older_than_n_days_and_nothing_newer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs, now = tmp_path / "logs", datetime.now(UTC)
    ages = {"old": 40, "older_than_30": 31, "younger": 29, "today": 0}
    ids = {name: new_run_id(now - timedelta(days=days)) for name, days in ages.items()}
    logs.mkdir()
    with History.open(history_path(logs)) as history:
        for name, days in ages.items():
            record_run(history, ids[name], now - timedelta(days=days), [host("gpu-b01")], exit_code=0)
    for run_id in ids.values():
        (logs / run_id).mkdir()
        (logs / run_id / "gpu-b01.jsonl").write_text("{}\n")
    unrecorded_old = new_run_id(now - timedelta(days=50))  # a run from before the history
    unrecorded_new = new_run_id(now - timedelta(days=1))
    for extra in (unrecorded_old, unrecorded_new, "notes"):
        (logs / extra).mkdir()
    assert main(["runs", "--keep-days", "30", "--log-dir", str(logs), "--json"]) == 0
    out, err = capsys.readouterr()
    document = json.loads(out)
    gone = sorted([ids["old"], ids["older_than_30"]])
    assert document["pruned"] == {"records": gone, "folders": sorted([*gone, unrecorded_old])}
    assert err.startswith("pruned runs older than 30 days: 2 records, 3 log folders (")
    assert [r["run_id"] for r in document["runs"]] == [ids["today"], ids["younger"]]
    assert sorted(p.name for p in logs.iterdir() if p.is_dir()) == sorted(
        [ids["younger"], ids["today"], unrecorded_new, "notes"])
    with History.open(history_path(logs)) as history:
        assert history.host_history("gpu-b01", since=now - timedelta(days=100))[-1].run_id == ids["younger"]
        assert history.prune(30, now) == []


def test_prune_by_the_store_returns_what_it_deleted(tmp_path: Path) -> None:
    with History.open(tmp_path / HISTORY_FILE) as history:
        record_run(history, "run-old", NOW - timedelta(days=8), [host("gpu-b01")], exit_code=0)
        record_run(history, "run-killed", NOW - timedelta(days=9), [host("gpu-b01")])  # never ended
        record_run(history, "run-new", NOW - timedelta(days=6), [host("gpu-b01")], exit_code=0)
        assert history.prune(7, NOW) == ["run-killed", "run-old"]
        assert [r.run_id for r in history.runs()] == ["run-new"]
        assert [h.run_id for h in history.host_history("gpu-b01")] == ["run-new"]


# --- real runs --------------------------------------------------------------------------------------------------


@pytest.fixture
async def half_hung_fleet(tmp_path: Path) -> AsyncIterator[SimFleet]:
    """gpu-b01 resets in seconds; gpu-b02's unit ignores SIGTERM with a long drain_timeout: it sits in drain."""
    stuck = UnitSpec(name="sglang.service", gpus=(0, 1), mib=30000, ignore_sigterm=True)
    specs = [NodeSpec(name="gpu-b01", linger_s=0.2), NodeSpec(name="gpu-b02", units=(stuck,), linger_s=0.2)]
    host_vars: dict[str, dict[str, object]] = {"gpu-b01": {"kill_grace": 2, "settle_timeout": 15},
                                               "gpu-b02": {"services": ["sglang.service"], "drain_timeout": 90,
                                                           "command_timeout": 5}}
    async with SimFleet(tmp_path / "sim", specs, host_vars=host_vars) as sim:
        yield sim


def _host_on_record(path: Path, name: str) -> str | None:
    """The run id in which `name` is on record, if any (read-only look, as `fleet runs` would)."""
    if not path.is_file():
        return None
    with History.open(path) as history:
        rows = history.host_history(name)
    return rows[0].run_id if rows else None


async def _on_record(path: Path, name: str, proc: Process) -> str:
    """Poll the history, as `fleet runs` would, until `name` is on record while `proc` runs; that run's id."""
    with anyio.fail_after(60):
        while True:
            run_id = await anyio.to_thread.run_sync(_host_on_record, path, name)
            assert proc.returncode is None, "fleet ended before the test could stop it"
            if run_id is not None:
                return run_id
            await anyio.sleep(0.2)


@asynccontextmanager
async def _reset_process(fleet: SimFleet, logs: Path) -> AsyncIterator[Process]:
    """`fleet reset` of the whole simulated fleet as a process of its own; SIGKILLed by its pid if still alive."""
    args = [sys.executable, "-m", "fleet", "reset", "-i", str(fleet.inventory_path), "-g", "sim", "-y",
            "--log-dir", str(logs)]
    proc = await anyio.open_process(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_run_killed_mid_way_leaves_its_finished_hosts_on_record(
    half_hung_fleet: SimFleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path / "logs"
    async with _reset_process(half_hung_fleet, logs) as proc:
        run_id = await _on_record(history_path(logs), "gpu-b01", proc)
        proc.kill()  # SIGKILL, by the pid this test started: no finally, no summary.json
        with anyio.fail_after(15):
            await proc.wait()
    assert not (logs / run_id / "summary.json").exists()
    with History.open(history_path(logs)) as history:
        record = history.get(run_id)
        assert history.last_run_id() == run_id
    assert record is not None
    assert (record.run.ended_at, record.run.exit_code) == (None, None)
    assert record.run.targets == ("gpu-b01", "gpu-b02")
    assert [(h.host, h.status) for h in record.hosts] == [("gpu-b01", "clean")]
    assert record.hosts[0].memory_after_mib == [0] * 8

    assert main(["runs", "--log-dir", str(logs)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[0] == run_id
    assert out[1].split()[6] == "-"  # exit: none on record
    assert out[1].endswith("unfinished (killed): 1 of 2 on record (1 clean)")  # its running.lock is free
    assert main(["runs", "--status", "unfinished", "--log-dir", str(logs)]) == 0
    assert run_id in capsys.readouterr().out
    assert main(["show", "last", "--log-dir", str(logs)]) == 1  # no end on record: not proven clean
    assert capsys.readouterr().out.splitlines() == [
        "gpu-b01 clean",
        f"reset {run_id} has no end on record (killed: its fleet process is gone, running.lock is free): 1 of 2"
        " hosts on record; not on record: gpu-b02",
        f"logs: {logs / run_id}",
    ]


async def test_an_interrupted_run_is_on_record_whole_with_its_exit_status(half_hung_fleet: SimFleet,
                                                                          tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    async with _reset_process(half_hung_fleet, logs) as proc:
        run_id = await _on_record(history_path(logs), "gpu-b01", proc)
        proc.send_signal(signal.SIGINT)
        with anyio.fail_after(30):
            await proc.wait()
    assert proc.returncode == 130
    with History.open(history_path(logs)) as history:
        record = history.get(run_id)
    assert record is not None
    assert record.run.exit_code == 130 and record.run.ended_at is not None
    assert [(h.host, h.status, h.error) for h in record.hosts] == [
        ("gpu-b01", "clean", None), ("gpu-b02", "failed", "interrupted during drain")]
    assert record.hosts[1].reason == "interrupted"


async def test_runs_and_show_answer_from_real_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logs = tmp_path / "logs"
    specs = [NodeSpec(name="gpu-b01", linger_s=0.2), NodeSpec(name="gpu-b02", linger_s=0.2, ecc_error_gpus=(3,))]
    # command_timeout 30: a command's bound is no part of this test, and four workers on two cores are slow
    host_vars = {n: {"kill_grace": 2, "settle_timeout": 15, "command_timeout": 30} for n in ("gpu-b01", "gpu-b02")}
    runs = []
    async with SimFleet(tmp_path / "sim", specs, host_vars=host_vars) as sim:
        for _ in range(2):
            runs.append(await anyio.run_process(
                [sys.executable, "-m", "fleet", "reset", "-i", str(sim.inventory_path), "-g", "sim", "-y",
                 "--log-dir", str(logs)], check=False))
    assert [r.returncode for r in runs] == [1, 1]
    first, last = (json.loads(p.read_text())["run_id"] for p in sorted(logs.glob("*/summary.json")))

    assert main(["runs", "--log-dir", str(logs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["RUN", "STARTED", "(UTC)", "TOOK", "COMMAND", "HOSTS", "EXIT", "OUTCOME"]
    assert [line.split()[0] for line in lines[1:]] == [last, first]
    assert all(line.split()[4:7] == ["reset", "2", "1"] and line.endswith("1 clean, 1 failed") for line in lines[1:])

    assert main(["runs", "--host", "gpu-b02", "--log-dir", str(logs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:3]] == [last, first]
    assert all("failed  health" in line and "gpu 3: 1 uncorrectable ECC error" in line for line in lines[1:3])
    assert lines[3] == "gpu-b02: 2 runs, 2 failed: health 2"
    assert main(["runs", "--host", "gpu-b01", "--json", "--log-dir", str(logs)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["tally"] == {"host": "gpu-b01", "runs": 2, "statuses": {"clean": 2}, "reasons": {}}
    assert [r["memory_after_mib"] for r in document["runs"]] == [[0] * 8] * 2
    assert main(["runs", "-g", "sim", "-i", str(sim.inventory_path), "--json", "--log-dir", str(logs)]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)["runs"]] == [last, first]
    assert main(["runs", "--since", "2099-01-01", "--log-dir", str(logs)]) == 0
    assert capsys.readouterr().out.startswith("no run on record")
    assert main(["runs", "--host", "gpu-b01", "--status", "failed", "--log-dir", str(logs)]) == 0
    assert capsys.readouterr().out == "gpu-b01: 0 runs\n"  # a known host, no run of that kind

    # show: the same summary as the run printed (its per-host lines too), summary.json itself, a host's log; the
    # run's own exit status either way (one host failed)
    assert main(["show", "last", "--log-dir", str(logs)]) == 1
    printed = runs[1].stderr.decode().splitlines()
    assert not [line for line in printed if line.startswith("fleet: warning")]
    assert capsys.readouterr().out.splitlines() == [line for line in printed if not line.startswith("fleet: ")]
    assert main(["show", first, "--json", "--log-dir", str(logs)]) == 1
    assert capsys.readouterr().out == (logs / first / "summary.json").read_text()
    assert main(["show", last, "--host", "gpu-b01", "--log-dir", str(logs)]) == 0
    shown = capsys.readouterr().out.splitlines()
    raw = (logs / last / "gpu-b01.jsonl").read_text()
    assert len(shown) == len(raw.splitlines())
    assert shown[0].split()[1:4] == ["info", "-", "host_start"]
    assert any(" verify " in line and "$ " in line and "nvidia-smi" in line for line in shown)
    assert "status=clean" in shown[-1] and "host_end" in shown[-1]
    assert main(["show", last, "--host", "gpu-b01", "--json", "--log-dir", str(logs)]) == 0
    assert json.loads(capsys.readouterr().out) == [json.loads(line) for line in raw.splitlines()]  # one document

    for bad in (["show", "20991231T000000Z-000000"], ["show", last, "--host", "gpu-b09"], ["show", "../logs"],
                ["runs", "--since", "yesterday"], ["runs", "--host", "gpu-b09"], ["runs", "--status", "done"]):
        assert main([*bad, "--log-dir", str(logs)]) == 2, bad
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1 and err.startswith("fleet: error: "), (bad, err)



def test_show_last_in_a_folder_with_no_run_is_a_usage_error(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "last", "--log-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"fleet: error: no run on record in {tmp_path}\n"
    assert main(["runs", "--log-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"no run on record in {history_path(tmp_path)}\n"
    assert not history_path(tmp_path).exists()  # reading never creates the database


# --- what is printed (pure) -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("7d", NOW - timedelta(days=7)),
    ("24h", NOW - timedelta(hours=24)),
    ("90m", NOW - timedelta(minutes=90)),
    ("1w2d", NOW - timedelta(days=9)),
    ("30s", NOW - timedelta(seconds=30)),
    ("2026-12-01", datetime(2026, 12, 1, tzinfo=UTC)),
    ("2026-12-01T10:00+02:00", datetime(2026, 12, 1, 8, tzinfo=UTC)),
])
def test_since_takes_a_duration_or_a_date(text: str, expected: datetime) -> None:
    assert parse_since(text, NOW) == expected


@pytest.mark.parametrize("text", ["", "yesterday", "7x", "d", "2026-13-01"])
def test_since_refuses_anything_else_in_one_line(text: str) -> None:
    with pytest.raises(UsageError, match=r"^--since takes a duration \(7d, 24h, 90m\) or a date"):
        parse_since(text, NOW)


def host_row(run_id: str, status: str, reason: str | None = None) -> HostRow:
    return HostRow(run_id=run_id, host="gpu-b07", status=status, reason=reason, error=None, duration_s=1.0, steps=[],
                   killed_count=0, killed=[], memory_before_mib=None, memory_after_mib=None, settle_s=None, health=[],
                   slurm=None, ended_at=None,
                   started_at=stamp(NOW), command="reset")


def test_the_tally_says_how_often_a_host_failed_and_why() -> None:
    rows = ([host_row(f"r{i}", "clean") for i in range(11)] + [host_row("m1", "failed", "memory_held")] * 2
            + [host_row("h1", "failed", "health")])
    assert tally_line(tally("gpu-b07", rows)) == "gpu-b07: 14 runs, 11 clean, 3 failed: memory_held 2, health 1"
    mixed = [host_row("a", "unreachable", "connect_timeout"), host_row("b", "failed", None)]
    assert tally_line(tally("gpu-b07", mixed)) == ("gpu-b07: 2 runs, 1 failed: unknown 1,"
                                                   " 1 unreachable: connect_timeout 1")
    assert tally_line(tally("gpu-b07", [])) == "gpu-b07: 0 runs"


def test_run_lines_show_an_unfinished_run_as_such() -> None:
    done = RunRow(run_id="20261202T110501Z-3f9c2a", command="reset", targets=("a", "b"), options={"mode": "plan"},
                  started_at=stamp(NOW),
                  ended_at=stamp(NOW + timedelta(seconds=7.9)), exit_code=0, fleet_version="0.1.0", log_dir="/logs",
                  counts={"planned": 2})
    killed = RunRow(run_id="20261202T120000Z-aaaaaa", command="reset", targets=("a", "b"), options={"mode": "reset"},
                    started_at=stamp(NOW), ended_at=None, exit_code=None,
                    fleet_version="0.1.0", log_dir="/logs", counts={"clean": 1})
    assert run_lines([killed, done]) == [
        "RUN                      STARTED (UTC)        TOOK  COMMAND          HOSTS  EXIT  OUTCOME",
        "20261202T120000Z-aaaaaa  2026-12-02 11:05:01  -     reset            2      -     unfinished: 1 of 2 on"
        " record (1 clean)",
        "20261202T110501Z-3f9c2a  2026-12-02 11:05:01  7.9s  reset --dry-run  2      0     2 planned",
    ]
    assert (took(0.04), took(125), took(7300)) == ("0.0s", "2m05s", "2h01m")
    going = [replace(killed, liveness=Liveness.KILLED.value), replace(killed, liveness=Liveness.RUNNING.value),
             replace(killed, liveness=Liveness.UNKNOWN.value)]
    assert [line.split("  ")[-1].strip() for line in run_lines(going, 200)[1:]] == [
        "unfinished (killed): 1 of 2 on record (1 clean)", "unfinished (running): 1 of 2 on record (1 clean)",
        "unfinished: 1 of 2 on record (1 clean)"]


@pytest.mark.parametrize(("lock", "summary", "expected"), [
    (RunLiveness.RUNNING, False, Liveness.RUNNING),  # its fleet holds running.lock
    (RunLiveness.OVER, False, Liveness.KILLED),  # the lock is free and no summary: it died before its end
    (RunLiveness.UNKNOWN, False, Liveness.UNKNOWN),  # no folder or no lock file here: fleet cannot tell
    (RunLiveness.OVER, True, Liveness.OVER),  # its summary is written: only the history's end is missing
    (RunLiveness.UNKNOWN, True, Liveness.OVER),
])
def test_a_run_with_no_end_on_record_is_running_killed_or_unknown(lock: RunLiveness, summary: bool,
                                                                   expected: Liveness) -> None:
    assert liveness(lock, summary) is expected


def test_runs_tell_a_killed_run_from_a_running_one_by_its_lock(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Real locks: one run's folder still held (its RunLogs open), one released as a SIGKILL releases it."""
    ids = {"running": "20261202T120000Z-aaaaaa", "killed": "20261202T110000Z-bbbbbb"}
    with History.open(history_path(tmp_path)) as history:
        for run_id in ids.values():
            history.start_run(run_id, "reset", ["a"], {"mode": "reset"}, stamp(NOW), "0.2.0", tmp_path)
    running, killed = RunLogs(tmp_path, ids["running"]), RunLogs(tmp_path, ids["killed"])
    running.create()
    killed.create()
    killed.close()  # the lock goes as it does when the process dies
    try:
        assert main(["runs", "--json", "--log-dir", str(tmp_path)]) == 0
        document = json.loads(capsys.readouterr().out)
    finally:
        running.close()
    assert {r["run_id"]: r["liveness"] for r in document["runs"]} == {ids["running"]: "running",
                                                                     ids["killed"]: "killed"}


def test_a_log_event_reads_as_one_line() -> None:
    command = {"host": "gpu-b01", "run_id": "r", "step": "drain", "argv": ["systemctl", "stop", "--no-block", "--",
               "sglang.service"], "exit_status": 0, "signal": None, "timed_out": False, "timeout_s": 10.0,
               "duration_s": 0.1, "stdout": "", "stderr": "", "event": "command", "level": "info",
               "timestamp": "2026-12-03T07:44:28.321436Z"}
    assert log_line(command) == ("07:44:28.321 info    drain  command        $ systemctl stop --no-block --"
                                 " sglang.service  -> exit 0 in 0.1 s")
    assert log_line({**command, "timed_out": True}).endswith("-> timed out in 0.1 s")
    bounded = {**command, "timed_out": True, "bound": "nvidia-smi's bound: 3 x command_timeout", "timeout_s": 6.0}
    assert log_line(bounded).endswith("-> timed out after 6.0 s (nvidia-smi's bound: 3 x command_timeout)")
    not_run = {**command, "exit_status": None, "note": "not run: nvidia-smi timed out after 6 s before it"}
    assert log_line(not_run).endswith("-> no exit status in 0.1 s (not run: nvidia-smi timed out after 6 s before it)")
    cut = {**command, "exit_status": None, "duration_s": 12.3, "ended": "interrupted by SIGINT"}
    assert log_line(cut).endswith("sglang.service  -> cut short after 12.3 s: interrupted by SIGINT")
    ran = {**command, "event": "batch", "batch": 2, "sections": 3, "argv": ["sh", "-c", "IFS= read -r tag ..."]}
    assert log_line(ran).endswith("batch          $ 3 commands in one (batch 2: each below)  -> exit 0 in 0.1 s")
    batch = {**cut, "event": "batch", "argv": ["sh", "-c", "..."], "asked": ["nvidia-smi --query-gpu", "journal"]}
    assert log_line(batch).endswith("batch          $ nvidia-smi --query-gpu; journal  -> cut short after 12.3 s:"
                                    " interrupted by SIGINT")
    end = {"host": "gpu-b01", "run_id": "r", "step": "drain", "status": "ok", "duration_s": 0.2,
           "detail": "sglang.service inactive", "error": None, "event": "step_end", "level": "info",
           "timestamp": "2026-12-03T07:44:28.419465Z"}
    assert log_line(end) == ('07:44:28.419 info    drain  step_end       status=ok duration_s=0.2'
                             ' detail="sglang.service inactive"')
    assert log_lines('not json\n{"event": "x", "long": "' + "y" * 500 + '"}\n')[0] == "not json"
    assert len(log_lines('{"event": "x", "long": "' + "y" * 500 + '"}')[0]) < 220


def test_a_summary_document_gives_back_the_run_s_own_summary_lines() -> None:
    plan = HostPlan(units=(("sglang.service", "active"),),
                    would_kill=(PlannedProcess(pid=39865, user="root", name="python3", mib=1523),),
                    gpu_memory_mib=(1523,))
    report = RunReport(run_id="run-1", command="reset", started_at=stamp(NOW), duration_s=7.9, hosts={
        "gpu-b01": HostReport(name="gpu-b01", status=HostStatus.PLANNED, duration_s=1.0, error=None,
                              steps=(StepResult(name=StepName.DRAIN, status=StepStatus.OK, duration_s=0.1,
                                                detail="would stop sglang.service"),),
                              plan=plan,
                              scheduler=SchedulerRecord(node="gpu-b01", by="slurm", state_before="IDLE",
                                                        plan="slurm IDLE: would drain it")),
        "gpu-b02": HostReport(name="gpu-b02", status=HostStatus.FAILED, duration_s=2.0, error="gpu 0 holds 1523 MiB",
                              reason=Reason.MEMORY_HELD),
        "gpu-b03": HostReport(name="gpu-b03", status=HostStatus.FAILED, duration_s=2.0, error="gpu 0 holds 4096 MiB",
                              reason=Reason.MEMORY_HELD),
    })
    document = json.loads(render.render(render.to_document(report)))
    again = run_from_document(document)
    assert render.human_lines(again) == render.human_lines(report)
    assert render.plan_lines(again) == render.plan_lines(report)
    assert render.plan_lines(again) == ["gpu-b01 (dry run):", "  slurm   slurm IDLE: would drain it",
                                        "  drain   would stop sglang.service"]


def test_a_run_id_says_when_the_run_started() -> None:
    assert run_id_time("20261202T110501Z-3f9c2a") == datetime(2026, 12, 2, 11, 5, 1, tzinfo=UTC)
    assert run_id_time("notes") is None
    assert run_id_time(new_run_id(NOW)) == NOW


def test_the_history_lives_next_to_the_run_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fleet runs` without --log-dir reads $FLEET_LOG_DIR's history, as a run writes it there."""
    monkeypatch.setenv("FLEET_LOG_DIR", str(tmp_path))
    with History.open(history_path(tmp_path)) as history:
        record_run(history, new_run_id(NOW), NOW, [host("gpu-b01")], exit_code=0)
    result = subprocess.run([sys.executable, "-m", "fleet", "runs", "--json"], capture_output=True, text=True,
                            timeout=60, check=False, env={**os.environ, "FLEET_LOG_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["history"] == str(tmp_path / HISTORY_FILE)


def test_a_hosts_log_as_json_is_one_list_even_with_a_line_cut_mid_write() -> None:
    from fleet.history.archive import log_events

    text = '{"event": "host_start", "host": "gpu-b01"}\n\n{"event": "command", "argv": ["nvid'
    assert log_events(text) == [{"event": "host_start", "host": "gpu-b01"},
                                {"event": "unreadable_line", "line": 3, "text": '{"event": "command", "argv": ["nvid'}]


def test_on_an_80_column_terminal_runs_fit_and_the_outcome_wraps_under_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fleet runs` (and `--host`) on COLUMNS=80: STARTED goes (the run id says it), the free-text column wraps
    within its own column; piped without COLUMNS, lines stay whole for grep and awk."""
    killed = RunRow(run_id="20261202T120000Z-aaaaaa", command="reset",
                    targets=tuple(f"gpu-b{i:02}" for i in range(1, 513)),
                    options={"mode": "reset"}, started_at=stamp(NOW), ended_at=None, exit_code=None,
                    fleet_version="0.2.0", log_dir="/logs", counts={"clean": 500, "failed": 7})
    lines = run_lines([killed], width=80)
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0].split() == ["RUN", "TOOK", "COMMAND", "HOSTS", "EXIT", "OUTCOME"]
    indent = lines[0].index("OUTCOME")
    assert lines[1].startswith("20261202T120000Z-aaaaaa") and all(line[:indent].strip() == "" for line in lines[2:])
    assert " ".join(line[indent:] for line in lines[1:]) == outcome(killed)
    assert run_lines([killed]) == run_lines([killed], width=None) and len(run_lines([killed])) == 2
    monkeypatch.setenv("COLUMNS", "80")
    assert terminal_columns() == 80
    monkeypatch.delenv("COLUMNS")
    assert terminal_columns() is None  # pytest captures stdout: no terminal
