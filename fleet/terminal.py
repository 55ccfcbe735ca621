"""The operator's terminal may go away mid-run (a closed window, a lost SSH session to the admin node, a `tee`
ended with it): what fleet writes there must never end the run or keep its report from being written.

A write to a hung-up terminal fails with EIO, one to a pipe nobody reads any more with EPIPE. `say` and `write`
never raise for that: the stream is `silence`d (its file descriptor pointed at /dev/null, so later writes,
rich's included, and the interpreter's last flush go nowhere quietly) and the text is lost, as it would have
been. `let_go`, on SIGHUP, silences at once every standard stream that is gone, before anything else writes.
"""

from __future__ import annotations

import os
import select
import sys
from contextlib import suppress
from typing import IO

from fleet.text import terminal_safe_lines

OUTPUTS = (1, 2)  # stdout, stderr
GONE = select.POLLERR | select.POLLHUP  # a hung-up terminal reports both, a pipe with no reader POLLERR


def gone(fd: int) -> bool:
    """Whether writes to `fd` can reach no one: a hung-up terminal, a pipe or socket whose reader left."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(revents & (GONE | select.POLLNVAL) for _, revents in poller.poll(0))


def silence(fd: int) -> None:
    """Point `fd` at /dev/null: whatever is still written there (or flushed at exit) goes nowhere, quietly."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def let_go() -> list[int]:
    """Silence every standard output that is gone (the terminal hung up); the ones silenced."""
    dead = [fd for fd in OUTPUTS if gone(fd)]
    for fd in dead:
        silence(fd)
    return dead


def lost(stream: IO[str]) -> None:
    """`stream` failed a write (EIO, EPIPE): silence its file descriptor, where it has one (a test's capture has
    none)."""
    with suppress(OSError, ValueError):
        silence(stream.fileno())


def write(stream: IO[str], text: str) -> None:
    """Write and flush; a stream that is gone (EIO, EPIPE) is silenced and the text lost, never raised. Bytes that
    are not UTF-8 (a folder's name) are written as `\\xNN`, never a UnicodeEncodeError, and no character of it but
    its line breaks acts on the terminal (`fleet.text.terminal_safe_lines`: what a node said may be in it)."""
    try:
        stream.write(terminal_safe_lines(text))
        stream.flush()
    except OSError:
        lost(stream)


def say(line: str) -> None:
    """One line on stderr, for the operator."""
    write(sys.stderr, line + "\n")
