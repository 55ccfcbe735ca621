"""The seam between fleet's logic and the wire.

Everything above this module sees `Transport.run(argv, timeout=...)` and a
`CommandResult`. A non-zero exit is data; exceptions (see `fleet.errors`)
mean "no answer". Every command is bounded twice: on the node by coreutils'
`timeout` (so nothing it started outlives it there) and on the client by a
deadline a little after that.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
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


class Transport(Protocol):
    """One session to one host, reused for all of its commands."""

    async def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        """Run argv bounded by `timeout` seconds; raise CommandTimeout past it."""
        ...

    async def close(self) -> None:
        """End the session; safe to call twice."""
        ...


def bounded_argv(argv: Sequence[str], timeout: float, *, become: bool = False) -> list[str]:
    """The argv actually run on the node: `[sudo -n] timeout -k K T argv...`."""
    if not argv:
        raise ValueError("empty argv")
    wrapped = ["timeout", "-k", f"{REMOTE_KILL_AFTER_S:g}", f"{max(timeout, 0.1):.1f}", *argv]
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
