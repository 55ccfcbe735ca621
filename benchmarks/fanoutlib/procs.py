"""Process bookkeeping over /proc: the process table, a tree's descendants, reaping and killing by pid,
the child subreaper, the machine's busy CPU, MemAvailable and a process's PSS."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections import defaultdict

PR_SET_CHILD_SUBREAPER = 36


def set_subreaper() -> None:
    """Orphaned descendants are re-parented to this process (so they can be reaped, counted, killed)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def process_table() -> dict[int, int]:
    """pid -> ppid for every live process (one /proc scan)."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if fields[0] != b"Z":
                table[int(entry.name)] = int(fields[1])
    return table


def alive(pid: int) -> bool:
    """The pid is a live process (not a zombie): what a test checks after a benchmark ended what it started."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def descendants(root: int, table: dict[int, int] | None = None) -> list[int]:
    table = process_table() if table is None else table
    children: dict[int, list[int]] = defaultdict(list)
    for pid, ppid in table.items():
        children[ppid].append(pid)
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found.extend(kids)
        todo.extend(kids)
    return found


def reaped_cpu_s(pid: int) -> float:
    """CPU seconds of a process and of every descendant it has reaped (user+sys, /proc/<pid>/stat); 0 when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


def reap_children() -> None:
    """Reap every child that has exited. This process is a subreaper: the workers of a stopped unit come
    back to it, and left as zombies they would pile up by N a run (pids, and a longer /proc for every
    node's holder scan). Popen objects whose child is reaped here read returncode 0, which is fine."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def kill_pids(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all cores; idle and iowait excluded)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def mem_available_mb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return 0


def read_pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except OSError:
        return 0
