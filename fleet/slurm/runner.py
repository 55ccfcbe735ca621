"""The one seam every Slurm command runs through: `scontrol`, `squeue`, `sinfo`, `scancel` and `srun` alike.

A `Runner` runs a short command to its end (`run`: a `CommandResult`, stdout and stderr apart, bounded by the
remote `timeout` and a client deadline: `fleet.transport.base`) or starts a streamed one (`start`: `--via srun`'s
step, whose stdin takes the controller's document and whose stdout is read line by line while it runs, stderr
apart, bounded by `timeout` around it). `LocalRunner` runs them on this machine; a test swaps the runner
(`Slurm(runner)`) to answer them without Slurm.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from subprocess import PIPE
from typing import Protocol

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream, Process

from fleet.inventory.host import Connection, Host
from fleet.transport.base import CommandResult, Transport, bounded_argv
from fleet.transport.local import LocalTransport
from fleet.transport.sessions import signal_session

# Where the commands run: this machine, as the user running fleet.
CONTROLLER = Host(name="slurm", address="localhost", connection=Connection.LOCAL)


class Stream:
    """A started command: its stdin, stdout and stderr (apart), how it ended, and how to end it early."""

    def __init__(self, process: Process) -> None:
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        self.process = process
        self.stdin: ByteSendStream = process.stdin
        self.stdout: ByteReceiveStream = process.stdout
        self.stderr: ByteReceiveStream = process.stderr

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def wait(self) -> int:
        return await self.process.wait()

    def kill(self) -> None:
        """SIGKILL every process of the command's session (srun and what it started here)."""
        signal_session(self.process.pid, signal.SIGKILL)


class Runner(Protocol):
    """Where Slurm's commands run (see the module docstring)."""

    async def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        """Run argv to its end within `timeout` seconds; CommandTimeout past it."""
        ...

    async def start(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str]) -> Stream:
        """Start argv (bounded by `timeout` around it) in its own session with `env`, its streams piped."""
        ...

    async def close(self) -> None:
        """Nothing of the runner's stays open; safe to call twice."""
        ...


class LocalRunner:
    """Slurm's commands as processes on this machine: short ones through `transport` (the local one unless given:
    a test scripts the answers), streamed ones in a session of their own."""

    def __init__(self, transport: Transport | None = None) -> None:
        self.transport = transport or LocalTransport(CONTROLLER)

    async def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        return await self.transport.run(argv, timeout=timeout)

    async def start(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str]) -> Stream:
        with anyio.CancelScope(shield=True):  # a cancel never orphans it: the caller ends what it started
            process = await anyio.open_process(bounded_argv(argv, timeout), stdin=PIPE, stdout=PIPE, stderr=PIPE,
                                               start_new_session=True, env=dict(env))
        return Stream(process)

    async def close(self) -> None:
        await self.transport.close()
