"""Processes that keep a device file open where a scan of /proc/PID/fd alone would not see it: a thread with a file
table of its own, a process whose leader thread exited while another thread keeps the file, a mapping that outlived
its fd. Each is a real process (as this user, or as another through a prefix such as setpriv's), ended by its pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from support.processes import NOBODY

# The exit system call (the calling thread alone, not exit_group) and unshare's CLONE_FILES, by machine.
_PRELUDE = (
    "import ctypes, mmap, os, platform, sys, threading, time\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "SYS_EXIT = {'x86_64': 60, 'aarch64': 93}[platform.machine()]\n"
    "CLONE_FILES = 0x400\n"
    "path = sys.argv[1]\n"
)
WAYS = {
    # a thread unshares its file table, then opens the device in it: the leader's table never has it
    "own_table": _PRELUDE + (
        "def hold():\n"
        "    assert libc.unshare(CLONE_FILES) == 0, ctypes.get_errno()\n"
        "    fd = os.open(path, os.O_RDONLY)\n"
        "    print(flush=True)\n"
        "    time.sleep(300)\n"
        "threading.Thread(target=hold).start()\n"
        "time.sleep(300)\n"
    ),
    # the device opened, then the leader thread exits: its /proc/PID/fd is gone, another thread keeps the file
    "leader_gone": _PRELUDE + (
        "fd = os.open(path, os.O_RDONLY)\n"
        "threading.Thread(target=time.sleep, args=(300,)).start()\n"
        "print(flush=True)\n"
        "libc.syscall(SYS_EXIT, 0)\n"
    ),
    # the device mapped, then its fd closed: only the mapping holds it (mmap(2) itself: Python's mmap keeps a dup)
    "mapped": _PRELUDE + (
        "fd = os.open(path, os.O_RDONLY)\n"
        "libc.mmap.restype = ctypes.c_void_p\n"
        "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, "
        "ctypes.c_long]\n"
        "at = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)\n"
        "assert at not in (None, ctypes.c_void_p(-1).value)\n"
        "os.close(fd)\n"
        "print(flush=True)\n"
        "time.sleep(300)\n"
    ),
    # the device bind-mounted on a file elsewhere, in a mount namespace of its own, and opened there: the link reads
    # that other path. `userns`: the user's own user namespace, as an unprivileged user can; `root`: where user
    # namespaces are off, root mounts it in a mount namespace of its own, then becomes nobody
    "elsewhere": _PRELUDE + (
        "target, how = sys.argv[2], sys.argv[3]\n"
        "CLONE_NEWUSER, CLONE_NEWNS, MS_BIND, MS_REC, MS_PRIVATE = 0x10000000, 0x20000, 4096, 16384, 1 << 18\n"
        "if how == 'userns':\n"
        "    assert libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0, ctypes.get_errno()\n"
        "else:\n"
        "    assert libc.unshare(CLONE_NEWNS) == 0, ctypes.get_errno()\n"
        "    assert libc.mount(b'none', b'/', None, MS_REC | MS_PRIVATE, None) == 0, ctypes.get_errno()\n"
        "assert libc.mount(path.encode(), target.encode(), None, MS_BIND, None) == 0, ctypes.get_errno()\n"
        "if how != 'userns':\n"
        "    os.setgroups([])\n"
        "    os.setresgid(65534, 65534, 65534)\n"
        "    os.setresuid(65534, 65534, 65534)\n"
        "fd = os.open(target, os.O_RDONLY)\n"
        "print(flush=True)\n"
        "time.sleep(300)\n"
    ),
}
# The ways a process keeps the device where a leader's fd table does not show it (the bind mount is another matter:
# a path no glob matches)
TABLE_WAYS = ("own_table", "leader_gone", "mapped")


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b") ", 1)[1].split()[0].decode()


class HiddenHolders:
    """Start a process per way, each holding `path`; each still running at the end is SIGKILLed by its pid."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def hold(self, way: str, path: Path, prefix: Sequence[str] = (), args: Sequence[str] = ()) -> int:
        if path.stat().st_size < 4096:
            path.write_bytes(b"\0" * 4096)  # room for the mapping
        child = subprocess.Popen([*prefix, sys.executable, "-c", WAYS[way], str(path), *args],
                                 stdout=subprocess.PIPE, cwd="/")
        self.started.append(child)
        assert child.stdout is not None
        assert child.stdout.readline() == b"\n", f"{way}: the holder did not start"
        deadline = time.monotonic() + 10
        while way == "leader_gone" and _state(child.pid) != "Z":  # its leader thread exits after saying so
            assert time.monotonic() < deadline, "the leader thread did not exit"
            time.sleep(0.01)
        return child.pid

    def elsewhere(self, path: Path, target: Path) -> int:
        """A process of nobody's that holds `path` through a bind mount on `target` (a file nobody may mount on), in
        a mount namespace of its own: its user namespace where an unprivileged user may make one, else root's."""
        userns = subprocess.run([*NOBODY, "unshare", "--user", "--map-root-user", "--mount", "true"],
                                capture_output=True, check=False).returncode == 0
        return self.hold("elsewhere", path, NOBODY if userns else (), (str(target), "userns" if userns else "root"))

    def alive(self, pid: int) -> bool:
        child = next(c for c in self.started if c.pid == pid)
        return child.poll() is None

    def end(self) -> None:
        for child in self.started:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
            child.wait()
            if child.stdout is not None:
                child.stdout.close()


@pytest.fixture
def hidden_holders() -> Iterator[HiddenHolders]:
    kids = HiddenHolders()
    yield kids
    kids.end()
