"""A scripted Transport for logic tests: no processes, no sockets, milliseconds.

A script maps an argv prefix to an answer (a CommandResult-like tuple, a callable,
or a delay that simulates a hang). Unmatched commands fail loudly, so a test
states every command the logic may run.

`open_command` answers from the same script: a reply with exit status 0 and a first
stdout line is a command that now holds (until `release()`); any other reply is
a command that ended at once. `ran` records every argv as the logic asked for
it, `sent` as it would go on the wire (`fleet.transport.base.bounded_argv`:
`timeout -k K T argv...`, or `timeout -k K T sudo -n timeout -k K T argv...` for
privileged commands on a `become` transport).

A batch (`fleet.transport.batch`) is answered section by section from the same script, as batch.sh would:
its tag read from the stdin the logic gave (none: nothing runs, exit 2, as batch.sh); each section in `ran`,
beside the batch's wire line in `sent`; a section slower than its bound ends with
`timeout`'s 124 and ends the batch, a batch slower than its own bound with a CommandTimeout carrying the
sections done.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import anyio

from fleet.model.errors import CommandTimeout
from fleet.transport import batch
from fleet.transport.base import TIMEOUT_EXIT_STATUSES, CommandResult, OpenCommand, bounded_argv


@dataclass(frozen=True, kw_only=True)
class Reply:
    stdout: str = ""
    stderr: str = ""
    exit_status: int = 0
    delay_s: float = 0.0  # longer than the timeout: the command "hangs"


Answer = Reply | Callable[[Sequence[str]], Reply]
_TIMED_OUT = min(TIMEOUT_EXIT_STATUSES)  # what a section batch.sh's `timeout` ended exits with


def _matches(prefix: Sequence[str], argv: Sequence[str]) -> bool:
    """Element-wise prefix match; a script element ending in "=" matches any value after it."""
    if len(argv) < len(prefix):
        return False
    return not prefix or all(a == p or (p.endswith("=") and a.startswith(p))
                             for p, a in zip(prefix, argv, strict=False))


@dataclass(kw_only=True)
class ScriptedTransport:
    """Answers commands from a script of (argv prefix, answer) pairs; the first match wins."""

    script: list[tuple[tuple[str, ...], Answer]]
    become: bool = False
    ran: list[tuple[str, ...]] = field(default_factory=list)
    sent: list[tuple[str, ...]] = field(default_factory=list)
    open_commands: int = 0  # held commands not released yet
    closed: bool = False

    def _answer(self, argv: Sequence[str], timeout: float, privileged: bool) -> Reply:
        self.sent.append(tuple(bounded_argv(argv, timeout, become=self.become and privileged)))
        return self._lookup(argv)

    def _lookup(self, argv: Sequence[str]) -> Reply:
        self.ran.append(tuple(argv))
        for prefix, answer in self.script:
            if not prefix or _matches(prefix, argv):  # an empty prefix answers every command
                return answer(argv) if callable(answer) else answer
        raise AssertionError(f"unscripted command: {list(argv)}")

    async def run(self, argv: Sequence[str], *, timeout: float, privileged: bool = False,
                  stdin: str | None = None) -> CommandResult:
        batched = batch.unbatch(argv)
        if batched is not None:
            tag = batch.tag_of(stdin)
            if tag is None:  # as batch.sh: no tag on stdin, nothing run
                self.sent.append(tuple(bounded_argv(argv, timeout, become=self.become and privileged)))
                return CommandResult(argv=tuple(argv), exit_status=2, stdout="", stderr="", duration_s=0.0)
            return await self._run_batch(argv, tag, batched, timeout=timeout, privileged=privileged)
        reply = self._answer(argv, timeout, privileged)
        if reply.delay_s > timeout:
            await anyio.sleep(timeout)
            raise CommandTimeout(CommandResult(argv=tuple(argv), exit_status=None, stdout=reply.stdout,
                                               stderr=reply.stderr, duration_s=timeout), timeout)
        if reply.delay_s:
            await anyio.sleep(reply.delay_s)
        return CommandResult(argv=tuple(argv), exit_status=reply.exit_status, stdout=reply.stdout, stderr=reply.stderr,
                             duration_s=reply.delay_s)

    async def _run_batch(self, argv: Sequence[str], tag: str, parts: Sequence[tuple[float, Sequence[str]]], *,
                         timeout: float, privileged: bool) -> CommandResult:
        wire = tuple(bounded_argv(argv, timeout, become=self.become and privileged))
        done: list[tuple[int, str, str]] = []
        left = timeout
        for bound, part in parts:
            self.sent.append(wire)
            reply = self._lookup(part)
            took = min(reply.delay_s, bound)
            if took > left:
                await anyio.sleep(left)
                out, err = batch.frame(tag, done)
                raise CommandTimeout(CommandResult(argv=tuple(argv), exit_status=None, stdout=out, stderr=err,
                                                   duration_s=timeout), timeout)
            if took:
                await anyio.sleep(took)
            left -= took
            hung = reply.delay_s > bound
            done.append((_TIMED_OUT if hung else reply.exit_status, reply.stdout, reply.stderr))
            if hung:
                break  # as batch.sh: the rest are not run
        out, err = batch.frame(tag, done)
        return CommandResult(argv=tuple(argv), exit_status=0, stdout=out, stderr=err, duration_s=timeout - left)

    async def open_command(self, argv: Sequence[str], *, timeout: float, privileged: bool = False) -> OpenCommand:
        reply = self._answer(argv, timeout, privileged)
        if reply.delay_s:
            await anyio.sleep(min(reply.delay_s, timeout))
        first = reply.stdout.split("\n", 1)[0]
        if reply.exit_status == 0 and first:
            self.open_commands += 1
            return OpenCommand(first, release=lambda: self._release(argv, reply))
        ended = CommandResult(argv=tuple(argv), exit_status=reply.exit_status, stdout=reply.stdout, stderr=reply.stderr,
                              duration_s=reply.delay_s)
        return OpenCommand(first, ended)

    async def _release(self, argv: Sequence[str], reply: Reply) -> CommandResult:
        self.open_commands -= 1
        return CommandResult(argv=tuple(argv), exit_status=0, stdout=reply.stdout, stderr=reply.stderr,
                             duration_s=reply.delay_s)

    async def close(self) -> None:
        self.closed = True
