"""Waiting for conditions, never for wall-clock guesses: a predicate polled until it holds or a bound passes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return False
    return state != "Z"


async def eventually(predicate: Callable[[], bool], within: float) -> bool:
    """Whether predicate became true within `within` seconds."""
    with anyio.move_on_after(within):
        while not predicate():  # noqa: ASYNC110 - polls /proc and files: there is no event to await
            await anyio.sleep(0.02)
    return predicate()


async def gone_within(pid: int, seconds: float) -> bool:
    return await eventually(lambda: not alive(pid), seconds)


def complete_line(path: Path) -> str | None:
    text = path.read_text() if path.exists() else ""
    return text if text.endswith("\n") else None


async def line_within(path: Path, seconds: float) -> str:
    """The first line written to path (a pid file), waiting up to `seconds`."""
    assert await eventually(lambda: complete_line(path) is not None, seconds), f"{path} never written"
    return complete_line(path) or ""


async def until(done: Callable[[], bool], what: str, within: float = 90.0) -> None:
    """Wait until `done()` holds; fail the test naming `what` once `within` seconds passed without it."""
    if not await eventually(done, within):
        pytest.fail(f"never: {what}")
