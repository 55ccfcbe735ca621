"""Several commands in one remote command: the read-only facts (and the few actions) a step needs at once.

A batch is one bounded command on the node (`batch.sh` beside this file: POSIX sh) that runs each argv in
turn, each under its own `timeout`, and frames what each printed on stdout and stderr with a tag that is
random for the batch. The tag goes on the command's stdin (`batch_input`), never in its argv: any user on the
node may read another's /proc/PID/cmdline, and a process that knew the tag could print a frame. So a batch
costs one SSH channel instead of N, and each section still is what the command alone would have been: its
own exit status, its own two streams, its own bound. A section whose frame is missing, cut or doubled (the
batch was ended, its output clipped, the tag met inside a section) is no answer, never an empty one; a section
that timed out ends the batch (the rest are not run, as a step stops at its first hung command).

Pure: the argv to run (`batch_argv`), its stdin (`batch_input`), its bound (`batch_timeout`) and reading its
output back (`sections`); for fakes, the other way round (`unbatch`, `tag_of`, `frame`). `fleet.node.node.Node.batch`
runs probes through it.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

from fleet.transport.base import KILLED, REMOTE_KILL_AFTER_S

# The program, its comment lines dropped (they cost bytes on every batch).
PROGRAM = "\n".join(
    line for line in (resources.files("fleet.transport") / "batch.sh").read_text().splitlines()
    if line.strip() and not line.lstrip().startswith("#")
)
# Seconds the batch's own bound adds to its sections' (the shell, the frames).
BATCH_MARGIN_S = 1.0
_TAG = re.compile(r"^[0-9a-f]{16}$")


@dataclass(frozen=True, kw_only=True)
class Section:
    """What one section of a batch did: as a command of its own would have; `ran_s`, how long it ran on the node
    (None where the node could not say)."""

    exit_status: int
    stdout: str
    stderr: str
    ran_s: float | None = field(default=None, compare=False)  # a measurement: not part of what it answered


def bound_word(bound: float) -> str:
    """A section's bound as batch.sh is given it (`timeout`'s seconds, one decimal)."""
    return f"{max(bound, 0.1):.1f}"


def bound_fired(exit_status: int, ran_s: float | None, bound: float) -> bool:
    """Whether a section's own `timeout` ended it, as batch.sh decides it too: 124, or 137 once it ran its bound
    (SIGTERM ignored, SIGKILL a second later). A 137 before the bound is a SIGKILL from elsewhere (the kernel's
    OOM killer), not a hang; one whose run time is unknown counts as the bound's."""
    if exit_status == 124:
        return True
    return exit_status == KILLED and (ran_s is None or ran_s >= float(bound_word(bound)))


def new_tag() -> str:
    return secrets.token_hex(8)


def batch_argv(parts: Sequence[tuple[float, Sequence[str]]]) -> tuple[str, ...]:
    """`sh -c PROGRAM fleet-batch T1 LINE1 ...`: each part (its bound in seconds, its argv) quoted once.
    No tag: it goes on stdin (`batch_input`)."""
    words: list[str] = []
    for bound, argv in parts:
        if not argv:
            raise ValueError("empty argv in a batch")
        words += [bound_word(bound), _joined(tuple(argv))]
    return ("sh", "-c", PROGRAM, "fleet-batch", *words)


@lru_cache(maxsize=512)
def _joined(argv: tuple[str, ...]) -> str:
    """shlex.join, remembered: every host's batches run the same lines (shlex is slow)."""
    return shlex.join(argv)


def batch_input(tag: str) -> str:
    """What the batch reads on its stdin: the tag, one line."""
    if not _TAG.match(tag):
        raise ValueError(f"bad batch tag {tag!r}")
    return tag + "\n"


def batch_timeout(bounds: Sequence[float]) -> float:
    """The batch's own bound: every section's, with its kill grace, one after the other, and a margin."""
    return sum(max(b, 0.1) + REMOTE_KILL_AFTER_S for b in bounds) + BATCH_MARGIN_S


def sections(tag: str, count: int, stdout: str, stderr: str) -> list[Section | None]:
    """Each of the `count` sections as the batch framed it; None for one whose frame is missing, cut or doubled."""
    return [_section(*said) if said is not None else None for said in answers(tag, count, stdout, stderr)]


def _section(exit_status: int, stdout: str, stderr: str, ran_s: float | None) -> Section:
    return Section(exit_status=exit_status, stdout=stdout, stderr=stderr, ran_s=ran_s)


Said = tuple[int, str, str, float | None]  # a Section's fields, in its order


def answers(tag: str, count: int, stdout: str, stderr: str) -> list[Said | None]:
    """`sections` as plain tuples (exit status, stdout, stderr, seconds run): what `fleet.node.node.Node` reads a
    batch with, a result made once a section.

    One pass over each stream with plain string search (no pattern a batch: this runs for every command)."""
    outs, errs = _frames(stdout, tag, count, with_status=True), _frames(stderr, tag, count, with_status=False)
    return [(out[1], out[0], err[0], out[2]) if out is not None and err is not None else None
            for out, err in zip(outs, errs, strict=True)]


def opened(tag: str, index: int, stdout: str) -> bool:
    """Whether section `index` began (its head is on stdout), closed or not: one a batch cut mid-way was running."""
    head = f"{tag} {index}\n"
    return stdout.startswith(head) or f"\n{head}" in stdout


def _status(text: str) -> tuple[int, float | None] | None:
    """"STATUS RAN" (RAN in centiseconds, or empty) or "STATUS" as a close carries it; None for anything else."""
    status, _, ran = text.partition(" ")
    if not status.isdigit() or not (ran == "" or ran.isdigit()):
        return None
    return int(status), (int(ran) / 100 if ran else None)


def _frames(stream: str, tag: str, count: int, *, with_status: bool) -> list[tuple[str, int, float | None] | None]:
    """(text, status, seconds run) of sections 0..count-1 in one stream, in order; None from the first one not
    framed whole.

    Section 0 opens with "TAG 0\n" at the stream's start or a line's (what came before it was written before
    the batch ran: sshd's "Could not chdir to home directory", a login shell's rc file); section I > 0 opens
    exactly where the previous section's close ends. Each closes with "\nTAG I STATUS RAN\n" on stdout (RAN:
    centiseconds, or empty), "\nTAG I\n" on stderr. Nothing may stand between two frames or after the last, and
    a section's text that holds the tag anywhere (a doubled or forged frame) is no answer: from there on, None.
    A stream where the tag stands more often than the frames read account for (and the head of a section cut
    short) had a frame forged somewhere: none of its sections is an answer."""
    whole = _whole(stream.split(tag), count, with_status=with_status) if tag else None
    return whole if whole is not None else _each_frame(stream, tag, count, with_status=with_status)


def _each_frame(stream: str, tag: str, count: int, *, with_status: bool) -> list[tuple[str, int, float | None] | None]:
    """`_frames`, a frame at a time: how far the stream is framed, and whether a frame was forged."""
    found: list[tuple[str, int, float | None] | None] = []
    first = f"{tag} 0\n"
    at = 0 if stream.startswith(first) else stream.find("\n" + first) + 1  # 0 when there is none: no frame
    for index in range(count):
        head = f"{tag} {index}\n"
        if not stream.startswith(head, at):
            break
        start = at + len(head)
        close = f"\n{tag} {index} " if with_status else f"\n{tag} {index}\n"
        closed = stream.find(close, start)
        if closed < 0 or stream.find(tag, start, closed) >= 0:
            break
        after = closed + len(close)
        status, ran = 0, None
        if with_status:
            end = stream.find("\n", after)
            closing = _status(stream[after:end]) if end >= 0 else None
            if closing is None:
                break
            (status, ran), after = closing, end + 1
        found.append((stream[start:closed], status, ran))
        at = after
    if found and at < len(stream) and not stream.startswith(f"{tag} {len(found)}\n", at):
        found.pop()  # what follows the last close is no frame: that close may have been one, forged
    cut = stream.startswith(f"{tag} {len(found)}\n", at)  # the head of a section that never closed
    if stream.count(tag) != 2 * len(found) + cut:
        return [None] * count  # the tag stands where no frame of ours does: a frame was forged
    return found + [None] * (count - len(found))


def _whole(parts: list[str], count: int, *, with_status: bool) -> list[tuple[str, int, float | None] | None] | None:
    """`_frames` of a stream framed whole (every section, nothing after the last close), from the stream cut where
    the tag stands: before the first, nothing or a line's end; then each section's head and text, and its close.
    None for any other stream (`_frames` then reads it frame by frame, and says which sections it can)."""
    if len(parts) != 2 * count + 1 or (parts[0] and parts[0][-1] != "\n"):
        return None
    found: list[tuple[str, int, float | None] | None] = []
    for (head, opening), body, close in zip(_marks(count), parts[1::2], parts[2::2], strict=True):
        if len(body) <= len(head) or not body.startswith(head) or body[-1] != "\n":
            return None
        status, ran = 0, None
        if with_status:
            said = close[len(opening):-1] if close.startswith(opening) and close.find("\n") == len(close) - 1 else ""
            closing = _status(said) if said else None
            if closing is None:
                return None
            status, ran = closing
        elif close != head:
            return None
        found.append((body[len(head):-1], status, ran))
    return found


@lru_cache(maxsize=64)
def _marks(count: int) -> tuple[tuple[str, str], ...]:
    """Each of `count` sections' head after the tag (" I\n", its close on stderr too) and how its close on stdout
    opens (" I ", its status and run time after it): made once for every batch of as many sections."""
    return tuple((f" {index}\n", f" {index} ") for index in range(count))


# --- the node's side, for fakes (the scripted transport, the in-process simulated node) ----------------------


def unbatch(argv: Sequence[str]) -> list[tuple[float, list[str]]] | None:
    """[(bound, argv), ...] when argv is a batch `batch_argv` built; None for any other command."""
    if len(argv) < 4 or tuple(argv[:4]) != ("sh", "-c", PROGRAM, "fleet-batch"):
        return None
    words = list(argv[4:])
    return [(float(words[i]), list(_split(words[i + 1]))) for i in range(0, len(words) - 1, 2)]


def tag_of(stdin: str | None) -> str | None:
    """The tag a batch's stdin carries (`batch_input`); None when there is none (batch.sh then runs nothing)."""
    line = (stdin or "").split("\n", 1)[0]
    return line if _TAG.match(line) else None


@lru_cache(maxsize=4096)
def _split(line: str) -> tuple[str, ...]:
    """shlex.split, remembered: fakes answer the same lines for every host (shlex is slow)."""
    return tuple(shlex.split(line))


def frame(tag: str, answers: Sequence[tuple[int, str, str]]) -> tuple[str, str]:
    """What batch.sh prints for sections that answered (exit status, stdout, stderr), in order; without the run
    time (a node that cannot say it: a 137 then counts as its bound's)."""
    out, err = _between_tags(tuple(answers))
    return tag.join(out), tag.join(err)


@lru_cache(maxsize=256)
def _between_tags(answers: tuple[tuple[int, str, str], ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The frames of `answers` on stdout and on stderr, cut where the tag stands (the tag joins them again):
    remembered, as fakes answer the same sections for every host, each with its own tag."""
    out, err = [""], [""]
    for i, (status, stdout, stderr) in enumerate(answers):
        out += [f" {i}\n{stdout}\n", f" {i} {status}\n"]
        err += [f" {i}\n{stderr}\n", f" {i}\n"]
    return tuple(out), tuple(err)
