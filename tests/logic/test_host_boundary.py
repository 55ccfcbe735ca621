"""The host boundary of the task graph: whatever one host raises (but a cancel) is that host's outcome, in one
line, and every other host and the report complete (scripted transports, no sockets)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.scripted_run import make_host, node_script

from fleet.engine.graph import run_hosts
from fleet.engine.options import RunOptions
from fleet.inventory.host import Host
from fleet.model.errors import ConnectionLost, SessionSilent
from fleet.model.report import HostStatus, Reason, RunReport
from fleet.runlog.folder import RunLogs
from fleet.transport.base import Note
from fleet.transport.scripted import Reply, ScriptedTransport


@pytest.fixture(autouse=True)
def quick_respawn_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scripted node never respawns anything: one look after the kill is enough here."""
    monkeypatch.setattr("fleet.reset.kill.RESPAWN_SCANS_S", (0.0,))


Connector = Callable[[Host], Awaitable[ScriptedTransport]]


async def run(connector: Connector, hosts: Sequence[Host], tmp_path: Path) -> RunReport:
    logs = RunLogs(tmp_path, "run-1")
    logs.create()
    try:
        report, _ = await run_hosts(hosts, RunOptions(), logs, connector=connector)
    finally:
        logs.close()
    return report


def events(tmp_path: Path, host: str, event: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in (tmp_path / "run-1" / f"{host}.jsonl").read_text().splitlines()]
    return [e for e in lines if e["event"] == event]


def connect_from(transports: Mapping[str, ScriptedTransport]) -> Connector:
    async def connector(host: Host) -> ScriptedTransport:
        return transports[host.name]

    return connector


async def test_a_connector_that_raises_fails_that_host_only(tmp_path: Path) -> None:
    clean = {name: ScriptedTransport(script=node_script()) for name in ("gpu-01", "gpu-03")}

    async def connector(host: Host) -> ScriptedTransport:
        if host.name == "gpu-02":
            raise ValueError("bad value\nand a second line")
        return clean[host.name]

    report = await run(connector, [make_host("gpu-01"), make_host("gpu-02"), make_host("gpu-03")], tmp_path)

    assert list(report.hosts) == ["gpu-01", "gpu-02", "gpu-03"]
    assert report.hosts["gpu-02"].status is HostStatus.FAILED
    assert report.hosts["gpu-02"].error == "internal error during connect: ValueError: bad value"
    assert report.hosts["gpu-02"].reason is Reason.INTERNAL
    for name, transport in clean.items():
        assert report.hosts[name].status is HostStatus.CLEAN, report.hosts[name].error
        assert transport.closed and transport.open_commands == 0
    (logged,) = events(tmp_path, "gpu-02", "internal_error")
    assert logged["step"] == "connect" and "ValueError: bad value" in json.dumps(logged["exception"])
    assert [e["status"] for e in events(tmp_path, "gpu-02", "host_end")] == ["failed"]


async def test_a_host_whose_log_cannot_start_fails_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Even logging the start is inside the boundary: the host fails in one line, the others run."""
    host_logger = RunLogs.host_logger

    def refuse_one(self: RunLogs, host: str) -> Any:
        if host == "gpu-02":
            raise OSError(24, "Too many open files")
        return host_logger(self, host)

    monkeypatch.setattr(RunLogs, "host_logger", refuse_one)
    transports = {"gpu-01": ScriptedTransport(script=node_script()), "gpu-02": ScriptedTransport(script=node_script())}
    report = await run(connect_from(transports), [make_host("gpu-01"), make_host("gpu-02")], tmp_path)
    assert report.hosts["gpu-01"].status is HostStatus.CLEAN
    assert report.hosts["gpu-02"].status is HostStatus.FAILED
    assert report.hosts["gpu-02"].error == "internal error during connect: OSError: [Errno 24] Too many open files"
    assert transports["gpu-02"].ran == []


def raises(exc: Exception) -> Callable[[Sequence[str]], Reply]:
    def answer(argv: Sequence[str]) -> Reply:
        raise exc

    return answer


async def test_a_silent_session_ends_the_host_at_once_in_one_line(tmp_path: Path) -> None:
    """SessionSilent reads `... went silent during drain`; nothing else is tried there (not even verify)."""
    silent = ScriptedTransport(script=[(("systemctl", "show"), raises(SessionSilent("gpu-01"))), *node_script()])
    report = await run(connect_from({"gpu-01": silent}), [make_host("gpu-01")], tmp_path)
    assert report.hosts["gpu-01"].status is HostStatus.FAILED
    assert report.hosts["gpu-01"].error == "ssh session to gpu-01 went silent during drain"
    assert report.hosts["gpu-01"].reason is Reason.SILENT_SESSION
    assert silent.ran[-1][:2] == ("systemctl", "show")
    assert silent.closed and silent.open_commands == 0


async def test_other_transport_errors_keep_their_words(tmp_path: Path) -> None:
    lost = ScriptedTransport(script=[(("systemctl", "show"), raises(ConnectionLost("session to gpu-01 dropped: EOF"))),
                                     *node_script()])
    report = await run(connect_from({"gpu-01": lost}), [make_host("gpu-01")], tmp_path)
    assert report.hosts["gpu-01"].error == "session to gpu-01 dropped: EOF (during drain)"
    assert report.hosts["gpu-01"].reason is Reason.CONNECTION_LOST


@dataclass(kw_only=True)
class NotedTransport(ScriptedTransport):
    """A scripted transport that saw something while connecting."""

    notes: tuple[Note, ...] = ()


async def test_what_connecting_saw_is_logged_once_per_host(tmp_path: Path) -> None:
    note = Note("known_hosts_skipped", {"path": "/etc/ssh/ssh_known_hosts", "lines": [3, 7]})
    transports = {name: NotedTransport(script=node_script(), notes=(note,)) for name in ("gpu-01", "gpu-02")}
    report = await run(connect_from(transports), [make_host("gpu-01"), make_host("gpu-02")], tmp_path)
    for name in transports:
        assert report.hosts[name].status is HostStatus.CLEAN
        (logged,) = events(tmp_path, name, "known_hosts_skipped")
        assert (logged["level"], logged["path"], logged["lines"]) == ("warning", "/etc/ssh/ssh_known_hosts", [3, 7])


class FailingClose(ScriptedTransport):
    async def close(self) -> None:
        raise RuntimeError("close went wrong")


async def test_a_close_that_fails_is_logged_and_the_outcome_stands(tmp_path: Path) -> None:
    report = await run(connect_from({"gpu-01": FailingClose(script=node_script())}), [make_host("gpu-01")], tmp_path)
    assert report.hosts["gpu-01"].status is HostStatus.CLEAN
    assert len(events(tmp_path, "gpu-01", "close_error")) == 1
