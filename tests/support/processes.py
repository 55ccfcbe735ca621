"""Real processes for the probes' tests: children started and ended by pid, who a process is (as the node records
it), and signal.sh run here as the node runs it."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import anyio
import pytest

from fleet.node.probes.procs import Identity, parse_verdicts, signal_argv

# A child that blocks SIGTERM (a TERM sent to it stays pending), says so, and waits.
BLOCKS_TERM = (
    "import signal, time; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}); "
    "print(flush=True); time.sleep(120)"
)
NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
# A child whose leader thread exits (the exit system call, not exit_group) while another of its threads sleeps on:
# the process lives on with a zombie leader. It says when it is ready, and ends its leader on a line on stdin.
LEADERLESS = (
    "import ctypes, platform, sys, threading, time; "
    "threading.Thread(target=time.sleep, args=(120,)).start(); print(flush=True); sys.stdin.readline(); "
    "ctypes.CDLL(None).syscall({'x86_64': 60, 'aarch64': 93}[platform.machine()], 0)"
)


def start_time(pid: int) -> int:
    """Field 22 of /proc/PID/stat (clock ticks since boot), read after the comm's last ") "."""
    return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b") ", 1)[1].split()[19])  # comm: any bytes


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b") ", 1)[1].split()[0].decode()


def owner(pid: int) -> str:
    return pwd.getpwuid(os.stat(f"/proc/{pid}/fd").st_uid).pw_name


def identity_of(pid: int) -> Identity:
    """Who a live process is, as the node would record it: start time, executable, owner of its fd table."""
    return Identity(pid=pid, start=start_time(pid), exe=os.fsencode(os.readlink(f"/proc/{pid}/exe")), user=owner(pid))


def term_pending(pid: int) -> bool:
    """Whether a SIGTERM waits, blocked, on the process (its shared pending set)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("ShdPnd:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    raise AssertionError(f"no ShdPnd in /proc/{pid}/status")


def run_signal(name: str, targets: Sequence[Identity], prefix: Sequence[str] = ()) -> dict[int, str]:
    """Run signal.sh here (as `prefix` says: another user), the way the node runs it; its verdicts."""
    done = subprocess.run([*prefix, *signal_argv(name, targets)], capture_output=True, text=True, check=False,
                          timeout=30, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return parse_verdicts(done.stdout)


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


class Children:
    """Children of this test; each still running at the end is killed by its pid and reaped."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def blocking_term(self) -> subprocess.Popen[bytes]:
        child = self.track(subprocess.Popen([sys.executable, "-c", BLOCKS_TERM], stdout=subprocess.PIPE))
        assert child.stdout is not None
        child.stdout.readline()  # SIGTERM is blocked from here on
        return child

    def leaderless(self) -> tuple[subprocess.Popen[bytes], Identity]:
        """A child whose leader thread has exited while another thread lives on, and who it was before."""
        child = self.track(subprocess.Popen([sys.executable, "-c", LEADERLESS], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE))
        assert child.stdin is not None and child.stdout is not None
        child.stdout.readline()
        who = identity_of(child.pid)
        child.stdin.write(b"\n")
        child.stdin.flush()
        deadline = time.monotonic() + 10
        while state(child.pid) != "Z":
            assert time.monotonic() < deadline, "the leader thread did not exit"
            time.sleep(0.01)
        return child, who

    def plain(self, argv: Sequence[str] = ("sleep", "120")) -> subprocess.Popen[bytes]:
        return self.track(subprocess.Popen(list(argv)))

    def zombie(self) -> tuple[subprocess.Popen[bytes], Identity]:
        """A child that died and is not reaped (no wait until the end), and who it was while alive."""
        child = self.plain()
        who = identity_of(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while state(child.pid) != "Z":
            assert time.monotonic() < deadline, "the child did not turn into a zombie"
            time.sleep(0.01)
        return child, who

    def track(self, child: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        self.started.append(child)
        return child

    def end(self) -> None:
        for child in self.started:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
            child.wait()
            for stream in (child.stdin, child.stdout):
                if stream is not None:
                    stream.close()


@pytest.fixture
def children() -> Iterator[Children]:
    kids = Children()
    yield kids
    kids.end()


@pytest.fixture
def named_child() -> Iterator[Callable[[str], int]]:
    """Start a child that renames itself (/proc/self/comm) and sleeps; each is killed after the test."""
    children: list[subprocess.Popen[bytes]] = []

    def start(comm: str, env: dict[str, str] | None = None) -> int:
        code = "import sys, time; open('/proc/self/comm', 'w').write(sys.argv[1]); print(flush=True); time.sleep(60)"
        child = subprocess.Popen([sys.executable, "-c", code, comm], stdout=subprocess.PIPE, env=env)
        children.append(child)
        assert child.stdout is not None
        child.stdout.readline()  # renamed
        return child.pid

    yield start
    for child in children:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def lock_held(path: str) -> bool:
    """Whether some process holds an flock on path (asked with a non-blocking flock of our own)."""
    return subprocess.run(["flock", "-n", "-E", "75", path, "true"], check=False).returncode == 75


async def lock_freed(path: str, within: float) -> bool:
    """Whether the flock on path is free within `within` seconds: a killed holder lets it go as the kernel ends it,
    after the signal, not with it."""
    with anyio.move_on_after(within):
        while lock_held(path):  # noqa: ASYNC110 - polls the lock file: there is no event to await
            await anyio.sleep(0.05)
    return not lock_held(path)


def descendants(pid: int) -> list[int]:
    """pid's live descendants, from /proc (children of every thread, recursively)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            for child in map(int, (task / "children").read_text().split()):
                found += [child, *descendants(child)]
    return found


def comm(pid: int) -> str | None:
    """The process's comm (its executable's name, cut at 15 bytes), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().rstrip("\n")
    except OSError:
        return None
