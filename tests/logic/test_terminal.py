"""`fleet.terminal`: writes to a terminal or pipe that went away never raise, and the stream is silenced; over
real pipes and a real pty whose master is closed (a hung-up terminal)."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fleet import terminal


@contextmanager
def fds(*opened: int) -> Iterator[None]:
    try:
        yield
    finally:
        for fd in opened:
            try:
                os.close(fd)
            except OSError:
                continue


def test_a_pipe_whose_reader_left_is_gone_and_a_write_there_is_silenced() -> None:
    reader, writer = os.pipe()
    with fds(reader, writer), os.fdopen(os.dup(writer), "w") as stream:
        assert not terminal.gone(writer)
        os.close(reader)
        assert terminal.gone(writer)
        terminal.write(stream, "lost\n")  # EPIPE: silenced, not raised
        assert os.path.samestat(os.fstat(stream.fileno()), os.stat(os.devnull))
        terminal.write(stream, "and quiet after\n")


def test_a_hung_up_terminal_is_gone_and_a_write_there_is_silenced() -> None:
    master, slave = os.openpty()
    with fds(master, slave), os.fdopen(os.dup(slave), "w") as stream:
        assert not terminal.gone(slave)
        os.close(master)  # the window closed: the kernel hangs the terminal up
        assert terminal.gone(slave)
        try:
            os.write(slave, b"x")
            raise AssertionError("a write to a hung-up terminal succeeded")
        except OSError:
            pass  # EIO, as the operator's closed terminal answers
        terminal.write(stream, "lost\n")
        assert os.path.samestat(os.fstat(stream.fileno()), os.stat(os.devnull))


def test_a_file_a_live_terminal_and_dev_null_are_not_gone(tmp_path: Path) -> None:
    master, slave = os.openpty()
    with fds(master, slave), (tmp_path / "log").open("w") as log, open(os.devnull, "w") as null:
        assert not any(terminal.gone(fd) for fd in (slave, log.fileno(), null.fileno()))


def test_a_capture_with_no_file_descriptor_is_left_as_it_is() -> None:
    class Broken(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError

    terminal.write(Broken(), "lost\n")
