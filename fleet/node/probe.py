"""A probe is data: the argv to run on a node, what its exit status means, whether it needs root, how to read it.

Like a pyinfra fact, a probe is written once with everything known about its command, and
`fleet.node.node.Node` runs it: through `sudo -n` when `needs_root` and the host has `become`, bounded by
the step's budget, logged, its exit status checked against `ok_exits` and its stdout parsed. Nothing
inspects an argv after the fact to guess any of this.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from fleet.model.errors import StepFailed
from fleet.node.probes.parse import ProbeParseError
from fleet.transport.base import CommandResult, killed

T = TypeVar("T")

# Every exit status is an answer (the parser reads what the command printed).
ANY_EXIT: frozenset[int] | None = None
ZERO = frozenset({0})


def first_line(text: str, limit: int = 160) -> str:
    """The first non-blank line of a command's output, stripped and bounded; `(no output)` when there is none."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:limit]
    return "(no output)"


def last_line(text: str, limit: int = 160) -> str:
    """The last non-blank line, stripped and bounded: what a program that says one thing before it exits said,
    after whatever the login printed first (sshd's `Could not chdir to home directory`, a motd)."""
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()[:limit]
    return "(no output)"


def _text(stdout: str) -> str:
    return stdout


@dataclass(frozen=True, kw_only=True)
class Probe(Generic[T]):
    """One command on a node and everything fleet knows about it before it runs.

    `what` names it in errors (`systemctl show sglang.service exited 1: ...`); `reads` names its output
    when that cannot be parsed (default: `what`). `ok_exits` are the exit statuses that are answers
    (`ANY_EXIT`: all of them); any other fails the step. `hang`, when set, is what a command timeout
    means for this probe (`{s}` is the deadline in seconds, `{bound}` what set it): the step fails with it,
    status `timeout`. `explain`, when set, turns a failed result into the step's one-line error. `driver`: it
    asks the GPU driver (nvidia-smi), so its bound is nvidia-smi's, not command_timeout (`fleet.node.bounds`).
    """

    argv: tuple[str, ...]
    what: str
    parse: Callable[[str], T]
    needs_root: bool = False
    ok_exits: frozenset[int] | None = ZERO
    reads: str | None = None
    hang: str | None = None
    explain: Callable[[CommandResult], str] | None = None
    driver: bool = False

    def answered(self, result: CommandResult) -> bool:
        """Whether the exit status is an answer; a command killed by SIGKILL before its bound (137, the OOM killer)
        never is: what it printed may stop anywhere."""
        if killed(result):
            return False
        return self.ok_exits is None or result.exit_status in self.ok_exits

    def failure(self, result: CommandResult) -> str:
        """The one line a step fails with when this probe's exit status is not an answer."""
        if killed(result):  # only ever one its bound did not end (that is a timeout, not a result)
            return f"{self.what} was killed by signal 9 before its bound (out of memory?)"
        if self.explain is not None:
            return self.explain(result)
        return f"{self.what} exited {result.exit_status}: {first_line(result.stderr)}"

    def unreadable(self, reason: object) -> str:
        return f"unreadable {self.reads or self.what}: {reason}"

    def read(self, result: CommandResult) -> T:
        """Parse what the command printed; output the parser cannot read fails the step."""
        try:
            return self.parse(result.stdout)
        except ProbeParseError as exc:
            raise StepFailed(self.unreadable(exc)) from exc


def action(argv: list[str] | tuple[str, ...], what: str, *, needs_root: bool = False,
           ok_exits: frozenset[int] | None = ZERO) -> Probe[str]:
    """A command run for its effect (stop, kill, signal): its stdout is kept as text."""
    return Probe(argv=tuple(argv), what=what, parse=_text, needs_root=needs_root, ok_exits=ok_exits)
