"""The seam between fleet's logic and the wire.

Everything above this module sees `Transport.run(argv, timeout=...)` and a
`CommandResult`. A non-zero exit is data; exceptions (see `fleet.errors`)
mean "no answer". Every command is bounded twice: on the node by coreutils'
`timeout` (so nothing it started outlives it there) and on the client by a
deadline a little after that.

`Transport.hold` is for the one long-lived command, the host's reset lock:
it starts a bounded command with its stdin open and returns a `Held` once the
command printed its first line. The command ends when `Held.release()` closes
its stdin (EOF), when its session ends (the client died: the channel closes,
stdin ends too), or at its own remote bound at the latest.

`privileged` says whether a command needs root; only those go through
`sudo -n` on a `become` host (see `fleet.probes.needs_root`).
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

# Seconds between the remote `timeout`'s SIGTERM and its SIGKILL.
REMOTE_KILL_AFTER_S = 1.0
# Extra seconds the client waits past the remote bound before it gives up.
CLIENT_GRACE_S = 2.0
# Exit statuses coreutils' `timeout` uses when it had to end the command.
TIMEOUT_EXIT_STATUSES = frozenset({124, 137})
# Output kept per stream in logs and results (bytes of text, not lines).
OUTPUT_LIMIT = 64 * 1024
# Seconds a held command gets to end after its stdin closed, before it is killed.
RELEASE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class CommandResult:
    """What one remote command did: exit status or signal, both streams apart."""

    argv: tuple[str, ...]
    exit_status: int | None
    stdout: str
    stderr: str
    duration_s: float
    signal: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


Release = Callable[[], Awaitable[CommandResult | None]]


class Held:
    """A command started by `Transport.hold`: its first stdout line, and how to end it.

    `result` is set when the command ended without a whole first line: it
    holds nothing then, and `release()` just returns that result. Otherwise
    the command runs until `release()`, which closes its stdin, waits for it
    (bounded by RELEASE_TIMEOUT_S, shielded, killing it past that) and returns
    how it ended, or None when it had to be killed.
    """

    def __init__(self, first_line: str, result: CommandResult | None = None, release: Release | None = None) -> None:
        self.first_line = first_line
        self.result = result
        self._release = release
        self._released = release is None
        self._final = result

    @property
    def running(self) -> bool:
        """Whether the command is still holding (started, not ended, not released)."""
        return not self._released

    async def release(self) -> CommandResult | None:
        """End the command (see the class docstring) and say how it ended; idempotent."""
        if not self._released and self._release is not None:
            self._released = True
            self._final = await self._release()
        return self._final


class Transport(Protocol):
    """One session to one host, reused for all of its commands."""

    async def run(self, argv: Sequence[str], *, timeout: float, privileged: bool = False) -> CommandResult:
        """Run argv bounded by `timeout` seconds; raise CommandTimeout past it."""
        ...

    async def hold(self, argv: Sequence[str], *, timeout: float, privileged: bool = False) -> Held:
        """Start argv (bounded by `timeout` on the node) with stdin open; return at its first line or end."""
        ...

    async def close(self) -> None:
        """End the session; safe to call twice."""
        ...


def bounded_argv(argv: Sequence[str], timeout: float, *, become: bool = False, mark: str | None = None) -> list[str]:
    """The argv actually run on the node: `[sudo -n] [env FLEET_CMD=token] timeout -k K T argv...`.

    `mark` is an `env` assignment that tags the command's processes so an interrupted
    command can be found and ended (see `fleet.probes.reap`); inside sudo, which resets the environment.
    """
    if not argv:
        raise ValueError("empty argv")
    wrapped = ["timeout", "-k", f"{REMOTE_KILL_AFTER_S:g}", f"{max(timeout, 0.1):.1f}", *argv]
    if mark is not None:
        wrapped = ["env", mark, *wrapped]
    return ["sudo", "-n", *wrapped] if become else wrapped


def command_line(argv: Sequence[str]) -> str:
    """Quote argv once, for a remote shell: every element stays one word."""
    return shlex.join(argv)


def client_deadline(timeout: float) -> float:
    return timeout + REMOTE_KILL_AFTER_S + CLIENT_GRACE_S


def clip(text: str, limit: int = OUTPUT_LIMIT) -> str:
    """Bound output kept in memory and logs; say how much was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters cut]"
