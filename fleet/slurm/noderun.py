"""The node side of `--via srun`: `fleet node-run`, one task per node of the job step, resets its own node.

It reads the controller's document on stdin (every task gets the same one: `srun --input=all`):

    {"fleet_version": V, "run_id": R, "options": {...}, "hosts": {SLURM_NODE: {"name": HOST, "vars": {...}}}}

picks its own entry by `$SLURMD_NODENAME`, runs the usual reset of that one host with
`connection: local`, and writes JSON messages on stdout, framed in short lines
(`fleet.slurm.frames`: srun keeps only short lines whole):

    {"log": {...}}                          every event of the host's log, as it happens
    {"report": {...}, "fleet_version": V}   the host's outcome, last

A controller of another fleet version gets a failed report that says so, and nothing is touched.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import anyio
import structlog

from fleet.engine.graph import run_hosts
from fleet.engine.interrupts import Interrupts
from fleet.engine.options import RunOptions
from fleet.engine.walk import Mode
from fleet.inventory.host import Connection, Host
from fleet.inventory.load import host_from_vars
from fleet.model.codec import host_to_document
from fleet.model.report import HostReport, HostStatus, Reason
from fleet.runlog.folder import RunLogs
from fleet.slurm.frames import frames
from fleet.version import __version__

NODE_VARIABLE = "SLURMD_NODENAME"


class Lines:
    """Where the node's messages go (stdout), framed; one message's frames written at once."""

    def __init__(self, out: IO[str], node: str) -> None:
        self.out, self.node = out, node
        self.sent = 0

    def emit(self, **fields: Any) -> None:
        self.sent += 1
        self.out.write("".join(f"{line}\n" for line in frames(self.node, self.sent, fields)))
        self.out.flush()

    def report(self, report: HostReport) -> None:
        self.emit(report=host_to_document(report), fleet_version=__version__)


class LineLogs(RunLogs):
    """RunLogs whose host logger writes each event as a `log` line on stdout instead of a file."""

    def __init__(self, run_id: str, lines: Lines) -> None:
        super().__init__(Path("-"), run_id)
        self._lines = lines

    def create(self) -> None:
        return None

    def host_logger(self, host: str) -> Any:
        def relay(_: Any, __: str, event: MutableMapping[str, Any]) -> str:
            self._lines.emit(log=dict(event))
            return ""

        return structlog.wrap_logger(
            structlog.ReturnLogger(),
            processors=[
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.dict_tracebacks,
                relay,
            ],
            host=host,
            run_id=self.run_id,
        )


def step_event(host: str, run_id: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """The node's first log event, before it touches anything: the job step it runs in and the GPUs Slurm gave
    it (`SLURM_STEP_GPUS`; none on a cluster without GPU gres)."""
    return {"event": "slurm_step", "level": "info", "timestamp": datetime.now(UTC).isoformat(),
            "host": host, "run_id": run_id, "job": environ.get("SLURM_JOB_ID"),
            "job_step": environ.get("SLURM_STEP_ID"),
            "gpus": environ.get("SLURM_STEP_GPUS") or environ.get("CUDA_VISIBLE_DEVICES")}


def host_of(name: str, variables: dict[str, Any]) -> Host:
    """The host the controller resolved (its variables as `fleet inventory --json` prints them), run locally."""
    return replace(host_from_vars(name, variables), connection=Connection.LOCAL)


def _failed(lines: Lines, name: str, error: str, reason: Reason) -> int:
    lines.report(HostReport(name=name, status=HostStatus.FAILED, error=error, reason=reason))
    return 1


async def node_run(document: dict[str, Any], node: str, out: IO[str]) -> int:
    """Reset this node as the controller's document says; 0 when it ended clean."""
    lines = Lines(out, node)
    theirs = document.get("fleet_version")
    entry = (document.get("hosts") or {}).get(node)
    name = entry["name"] if isinstance(entry, dict) and "name" in entry else node
    if theirs != __version__:
        return _failed(lines, name, f"fleet on {node} is {__version__}, the controller's is {theirs}: install the"
                                    " same version on both (nothing was touched)", Reason.VERSION)
    if entry is None:
        return _failed(lines, name, f"the controller sent no host for Slurm node {node} (nothing was touched)",
                       Reason.SLURM)
    options = document.get("options") or {}
    run_options = RunOptions(
        mode=Mode.RESET, deadline_s=options.get("deadline_s"),
        stop_units=bool(options.get("stop_units")), gpu_reset=bool(options.get("gpu_reset")),
        restore_settings=bool(options.get("restore_settings")),
    )
    try:
        host = host_of(name, entry["vars"])
    except (KeyError, TypeError, ValueError) as exc:
        return _failed(lines, name, f"the controller's variables for {name} do not fit this fleet: {exc}",
                       Reason.VERSION)
    lines.emit(log=step_event(name, str(document.get("run_id")), os.environ))
    interrupts = Interrupts()  # this process is the node's command: its signals are its own to handle
    async with anyio.create_task_group() as signals:
        await signals.start(interrupts.watch)
        report, _ = await run_hosts([host], run_options, LineLogs(str(document.get("run_id")), lines),
                                    interrupts=interrupts)
        signals.cancel_scope.cancel()
    outcome = report.hosts[name]
    lines.report(outcome)
    return 0 if outcome.status is HostStatus.CLEAN else 1


def main() -> int:
    """`fleet node-run`: the document on stdin, this node's name from Slurm's environment."""
    node = os.environ.get(NODE_VARIABLE, "")
    if not node:
        print(f"fleet node-run: ${NODE_VARIABLE} is not set: run me through srun (--via srun)", file=sys.stderr)
        return 2
    try:
        document = json.loads(sys.stdin.read())
    except ValueError as exc:
        print(f"fleet node-run: stdin is not the controller's JSON document: {exc}", file=sys.stderr)
        return 2
    return anyio.run(node_run, document, node, sys.stdout)
