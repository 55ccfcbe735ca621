"""A chain of real processes, each the parent of the next, for lineage tests.

`CHAIN` is a Python program: `python -c CHAIN LEVELS [DEVICE]` forks LEVELS times, each parent waiting for
its child (no shell in between that could exec its last command away: every level is a process of its
own), so the leaf is LEVELS generations below the first process. The leaf opens DEVICE when given, prints
its pid and sleeps; when it ends, every level above it ends in turn.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

CHAIN = """
import os, sys, time
levels = int(sys.argv[1])
for _ in range(levels):
    child = os.fork()
    if child:
        os.waitpid(child, 0)
        os._exit(0)
held = os.open(sys.argv[2], os.O_RDONLY) if len(sys.argv) > 2 else None
print(os.getpid(), flush=True)
time.sleep(600)
"""


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def lineage_of(pid: int, top: int) -> list[int]:
    """pid's ancestors up to `top` (included), nearest first, read from /proc here."""
    chain = [parent_of(pid)]
    while chain[-1] != top:
        chain.append(parent_of(chain[-1]))
    return chain


@dataclass(frozen=True)
class Chain:
    top: int
    leaf: int
    levels: list[int]  # the leaf's ancestors up to the top, nearest first


@contextmanager
def deep_chain(levels: int) -> Iterator[Chain]:
    """Start a chain LEVELS deep; yield it; end it by the leaf's recorded pid (the levels above follow it, the
    first one is waited for)."""
    proc = subprocess.Popen([sys.executable, "-c", CHAIN, str(levels)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    leaf: int | None = None
    try:
        leaf = int(proc.stdout.readline())
        yield Chain(proc.pid, leaf, lineage_of(leaf, proc.pid))
    finally:
        if leaf is not None:
            with suppress(ProcessLookupError):
                os.kill(leaf, signal.SIGKILL)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
