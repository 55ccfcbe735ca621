"""A simulated node's own /proc: a PID namespace per node, as every real node has its own process table.

Without it, 512 simulated nodes share one /proc: each node's holder scan (`find /proc/*/fd`) walks the
processes of all 512 nodes (about 5,000), so the testbed's cost grows with the square of the fleet and a
512-node run measures the testbed, not the tool. With it, each node's scan sees its own workers only.

    ns = NodeNamespace(root)   # `unshare --pid --fork --mount-proc` around a reaping init (nsinit.py)
    ns.start()
    ns.run(["python3", "-m", ...])         # a command inside (nsenter), as sshd sessions are
    ns.forced_command()                     # the authorized_keys command= that puts a session inside
    ns.stop()                               # SIGKILL the namespace's init: the kernel ends everything in it

Everything is recorded by pid: `unshare` (our child) and the init (its child, pid 1 inside). Stopping kills
the init by its pid; the kernel then kills every process of the namespace, and `unshare`, having reaped the
init, exits and is reaped.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

NSINIT = Path(__file__).with_name("nsinit.py")
START_TIMEOUT_S = 30.0


def _only_child(pid: int) -> int:
    """The one child of `pid` (unshare --fork has exactly one: the namespace's init)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    if len(children) != 1:
        raise RuntimeError(f"unshare {pid} has children {children}, expected one")
    return int(children[0])


class NodeNamespace:
    """One PID and mount namespace (its own /proc) whose init reaps orphans; see the module docstring."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.unshare: subprocess.Popen[bytes] | None = None
        self.init_pid = 0

    def start(self) -> None:
        ready = self.root / "nsinit.ready"
        ready.unlink(missing_ok=True)
        with (self.root / "nsinit.log").open("ab") as log:  # unshare's own complaints when its init is killed
            self.unshare = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, str(NSINIT), str(ready)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.exists():
            if self.unshare.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.root}: the node's PID namespace did not start (unshare: util-linux)")
            time.sleep(0.02)
        self.init_pid = _only_child(self.unshare.pid)  # the init's pid as this machine sees it

    def enter(self) -> list[str]:
        """The argv prefix that runs a command inside: its processes, /proc and pids are the node's."""
        return ["nsenter", "-t", str(self.init_pid), "-p", "-m", "--"]

    def run(self, argv: Sequence[str], env: dict[str, str] | None = None, timeout: float = 120.0) -> str:
        done = subprocess.run([*self.enter(), *argv], capture_output=True, text=True, env=env, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"{self.root}: {shlex.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def forced_command(self) -> str:
        """An sshd forced command running the client's command inside, with the shell sshd would have used."""
        return f'exec {shlex.join(self.enter())} /bin/sh -c "$SSH_ORIGINAL_COMMAND"'

    def stop(self) -> None:
        """SIGKILL the init: the kernel ends every process of the namespace, the init reaps them and is reaped by
        unshare, which then exits; wait for that (unshare killed too if it lingers). Idempotent."""
        if self.init_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init_pid, signal.SIGKILL)
        if self.unshare is not None:
            try:
                self.unshare.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.unshare.kill()
                self.unshare.wait(timeout=30)
        self.unshare, self.init_pid = None, 0
