"""`fleet demo` run as a process by a test: its simulated workers, found under the demo's own temporary folder
(the test's TMPDIR), and ended by their pids when the demo could not end them itself (a demo the test had to
SIGKILL)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path


def demo_workers(root: Path) -> list[int]:
    """Pids of live processes started under `root` (the demo's temporary folder): a read-only look at /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.fsencode(root) in (entry / "cmdline").read_bytes() \
                    and (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def end_workers(root: Path) -> list[int]:
    """SIGKILL each live process started under `root`, by its pid; the pids it found (empty: the demo ended them)."""
    left = demo_workers(root)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


@contextlib.contextmanager
def demo_env(tmp_path: Path, base: dict[str, str] | None = None) -> Iterator[dict[str, str]]:
    """An environment (`base`, else this process's) whose TMPDIR is a fresh folder under `tmp_path`, for a demo the
    test runs; on leaving, workers the demo left there are ended by pid and the test fails naming them."""
    scratch = tmp_path / "demo-tmp"
    scratch.mkdir()
    try:
        yield {**(os.environ if base is None else base), "TMPDIR": str(scratch)}
    finally:
        left = end_workers(scratch)
        assert left == [], f"the demo left simulated workers running: pids {left}"
