"""The seam between fleet's logic and the wire.

Everything above this module sees `Transport.run(argv, timeout=...)` and a
`CommandResult`. A non-zero exit is data; exceptions (see `fleet.model.errors`)
mean "no answer". Every command is bounded twice: on the node by coreutils'
`timeout` (so nothing it started outlives it there) and on the client by a
deadline a little after that.

`Transport.open_command` is for the one long-lived command, the host's reset lock:
it starts a bounded command with its stdin open and returns a `OpenCommand` once the
command printed its first line. The command ends when `OpenCommand.release()` closes
its stdin (EOF), when its session ends (the client died: the channel closes,
stdin ends too), or at its own remote bound at the latest.

`Transport.run` may give a command its whole stdin (`stdin`): a batch's frame tag goes there, never in the
argv, which any user on the node may read (/proc/PID/cmdline).

`privileged` says whether a command needs root; only those go through
`sudo -n` on a `become` host (see `Probe.needs_root` in `fleet.node.probe`),
and sudo itself runs inside the remote `timeout` too (see `bounded_argv`).

A transport may have `notes`: what it saw while connecting that the host's log
should say once (`Note`, read with `notes_of`), such as known_hosts lines it skipped.

The SSH and local transports build their results with `make_result` and
interpret them with `finish`, so a timeout or a refused sudo means the same on both.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from fleet.inventory.host import Host
from fleet.model.errors import AuthError, CommandTimeout
from fleet.model.outcomes import CommandResult as CommandResult

# Seconds between the remote `timeout`'s SIGTERM and its SIGKILL.
REMOTE_KILL_AFTER_S = 1.0
# Extra seconds the client waits past the remote bound before it gives up.
CLIENT_GRACE_S = 2.0
# Exit statuses coreutils' `timeout` uses when it had to end the command: 124 (SIGTERM ended it), 137 (it ignored
# SIGTERM and `-k`'s SIGKILL ended it). A 137 before the bound is a SIGKILL from elsewhere (the OOM killer): the
# command was killed, it did not hang (`bound_reached`).
TIMEOUT_EXIT_STATUSES = frozenset({124, 137})
KILLED = 137  # 128 + SIGKILL
# Characters of output a CommandResult keeps per stream.
OUTPUT_LIMIT = 1024 * 1024  # `nvidia-smi -q` of 8 GPUs is 150-250 KB; logs keep 4 KiB of it
# Seconds a held command gets to end after its stdin closed, before it is killed.
RELEASE_TIMEOUT_S = 5.0
# What `sudo -n` says on stderr when it would have to ask for a password.
SUDO_WANTS_PASSWORD = ("a password is required", "a terminal is required")


Release = Callable[[], Awaitable[CommandResult | None]]


@dataclass(frozen=True)
class Note:
    """One thing a transport saw while connecting, for the host's log: an event name and its fields."""

    event: str
    fields: Mapping[str, object] = field(default_factory=dict)


def notes_of(transport: object) -> tuple[Note, ...]:
    """The notes a transport has for the host's log (its `notes` attribute); none when it has no such attribute."""
    notes = getattr(transport, "notes", ())
    return tuple(n for n in notes if isinstance(n, Note))


class OpenCommand:
    """A command started by `Transport.open_command`: its first stdout line, and how to end it.

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
        """Whether the command is still open (started, not ended, not released)."""
        return not self._released

    async def release(self) -> CommandResult | None:
        """End the command (see the class docstring) and say how it ended; idempotent."""
        if not self._released and self._release is not None:
            self._released = True
            self._final = await self._release()
        return self._final


class Transport(Protocol):
    """One session to one host, reused for all of its commands."""

    async def run(self, argv: Sequence[str], *, timeout: float, privileged: bool = False,
                  stdin: str | None = None) -> CommandResult:
        """Run argv bounded by `timeout` seconds; raise CommandTimeout past it. `stdin`: what the command reads
        on its stdin, then EOF (none: an empty stdin); what only the command may know goes there, never in argv."""
        ...

    async def open_command(self, argv: Sequence[str], *, timeout: float, privileged: bool = False) -> OpenCommand:
        """Start argv (bounded by `timeout` on the node) with stdin open; return at its first line or end."""
        ...

    async def close(self) -> None:
        """End the session; safe to call twice."""
        ...


def bounded_argv(argv: Sequence[str], timeout: float, *, become: bool = False, mark: str | None = None) -> list[str]:
    """The argv actually run on the node.

    Without become: `[env FLEET_CMD=token] timeout -k K T argv...`. With become:
    `timeout -k K T sudo -n [env FLEET_CMD=token] timeout -k K T argv...`: the outer
    `timeout` bounds sudo itself (a hung NSS or LDAP lookup), the inner one, as root,
    bounds the command. `mark` is an `env` assignment that tags the command's processes
    so an interrupted command can be found and ended (see `fleet.transport.reap`);
    inside sudo, which resets the environment.
    """
    if not argv:
        raise ValueError("empty argv")
    bound = ["timeout", "-k", f"{REMOTE_KILL_AFTER_S:g}", f"{max(timeout, 0.1):.1f}"]
    wrapped = [*bound, *argv]
    if mark is not None:
        wrapped = ["env", mark, *wrapped]
    return [*bound, "sudo", "-n", *wrapped] if become else wrapped


def command_line(argv: Sequence[str]) -> str:
    """Quote argv once, for a remote shell: every element stays one word."""
    return shlex.join(argv)


def client_deadline(timeout: float) -> float:
    return timeout + REMOTE_KILL_AFTER_S + CLIENT_GRACE_S


def clip(text: str, limit: int, dropped: int = 0) -> str:
    """At most `limit` characters of text, a cut marked with how many characters were cut (`dropped`: those that
    arrived past what was kept, never kept)."""
    total = len(text) + dropped
    if total <= limit:
        return text
    return text[:limit] + f"... [{total - limit} characters cut]"


class Kept:
    """One output stream as it arrives, bounded: its first OUTPUT_LIMIT characters kept, the rest counted and
    dropped, so that a node costs the controller at most that much a stream whatever it prints. A stream that
    was cut reads with the cut marked (`clip`), which no probe reads as an answer."""

    def __init__(self, limit: int = OUTPUT_LIMIT) -> None:
        self._parts: list[str] = []
        self._room = limit
        self.dropped = 0

    def add(self, chunk: str) -> None:
        keep = chunk[: self._room]
        if keep:
            self._parts.append(keep)
            self._room -= len(keep)
        self.dropped += len(chunk) - len(keep)

    @property
    def text(self) -> str:
        return "".join(self._parts)


def signal_label(name: str | None) -> str | None:
    """`KILL` or `SIGKILL` -> `SIGKILL`; None stays None."""
    if not name:
        return None
    return name if name.startswith("SIG") else f"SIG{name}"


def make_result(
    argv: Sequence[str], status: int | None, signal_name: str | None, out: str | Kept, err: str | Kept,
    started: float
) -> CommandResult:
    """A CommandResult with both streams clipped to OUTPUT_LIMIT (what a `Kept` dropped counted in the cut) and the
    duration measured."""
    return CommandResult(
        argv=tuple(argv),
        exit_status=status,
        stdout=_clipped(out),
        stderr=_clipped(err),
        duration_s=round(time.monotonic() - started, 3),
        signal=signal_label(signal_name),
    )


def _clipped(stream: str | Kept) -> str:
    if isinstance(stream, Kept):
        return clip(stream.text, OUTPUT_LIMIT, stream.dropped)
    return clip(stream, OUTPUT_LIMIT)


def killed(result: CommandResult) -> bool:
    """Whether SIGKILL ended the command: exit 137 (through a shell), or the signal itself (`timeout` passes its
    command's death on, and kills itself after `-k`)."""
    return result.exit_status == KILLED or result.signal == "SIGKILL"


def bound_reached(result: CommandResult, timeout: float) -> bool:
    """Whether the node's `timeout` ended the command: 124, or SIGKILL after `timeout` seconds (measured here, so
    never shorter than on the node). A SIGKILL sooner is one from elsewhere (the OOM killer): an answer the probe
    reads as "killed by signal 9", never a hang."""
    if killed(result):
        return result.duration_s >= timeout
    return result.exit_status in TIMEOUT_EXIT_STATUSES


def finish(result: CommandResult, host: Host, timeout: float, *, become: bool) -> CommandResult:
    """Raise for what the node's bounds say was no answer, or a sudo that wants a password; else the result.

    `become`: whether this command went through `sudo -n`. This is the one place
    a refused sudo becomes an AuthError, for every transport.
    """
    if bound_reached(result, timeout):
        raise CommandTimeout(result, timeout)
    if become and result.exit_status != 0 and any(s in result.stderr for s in SUDO_WANTS_PASSWORD):
        command = result.argv[0] if result.argv else "?"
        raise AuthError(
            f"sudo -n on {host.name} needs a password for {command}: "
            "allow it in sudoers (NOPASSWD) or run as root"
        )
    return result
