"""Run the real OpenSSH sshd on 127.0.0.1 for integration tests.

Its own host key, config, authorized_keys and pid file live in a temp dir;
`authorize()` adds a client key, optionally with `environment="..."` options
(PermitUserEnvironment is on) so PATH can point at a simulated node's bin.
`stop()` kills sshd and every process it started, by pid.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from fleet.sim.ports import free_ports

SSHD = Path("/usr/sbin/sshd")
START_TIMEOUT_S = 10.0

_CONFIG = """\
ListenAddress 127.0.0.1
Port {port}
HostKey {dir}/ssh_host_ed25519_key
PidFile {dir}/sshd.pid
AuthorizedKeysFile {dir}/authorized_keys
PermitUserEnvironment yes
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
MaxStartups 200:30:400
MaxSessions 200
LogLevel VERBOSE
"""


@dataclass
class Sshd:
    """A running sshd: where it listens and the files a client needs."""

    dir: Path
    port: int
    process: subprocess.Popen[bytes]

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def log(self) -> Path:
        return self.dir / "sshd.log"

    def authorize(self, public_key: str, environment: Mapping[str, str] | None = None) -> None:
        """Accept public_key (one OpenSSH line), with environment options if given. HOME is an empty folder of
        this sshd's unless given: bash started by sshd sources ~/.bashrc even for a command, and this machine's
        root dotfiles (pyenv's rehash and its lock) are no part of a test."""
        wanted = {"HOME": str(self.dir / "home"), **(environment or {})}
        options = ",".join(f'environment="{k}={v}"' for k, v in wanted.items())
        line = f"{options} {public_key.strip()}" if options else public_key.strip()
        with (self.dir / "authorized_keys").open("a") as f:
            f.write(line + "\n")

    def stop(self) -> None:
        """Kill sshd and everything it started (connections, their commands), by pid."""
        for pid in _descendants(self.process.pid):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.kill()
        self.process.wait(timeout=10)


def start_sshd(directory: Path) -> Sshd:
    """Start `sshd -D -e` in directory; return once it answers with its banner."""
    directory.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
    key = directory / "ssh_host_ed25519_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (directory / "authorized_keys").touch(mode=0o600)
    (directory / "home").mkdir(mode=0o755, exist_ok=True)
    port = _free_port()
    host_key = (directory / "ssh_host_ed25519_key.pub").read_text().split()
    (directory / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}\n")
    config = directory / "sshd_config"
    config.write_text(_CONFIG.format(port=port, dir=directory))
    with (directory / "sshd.log").open("wb") as log:
        process = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stderr=log)
    sshd = Sshd(directory, port, process)
    try:
        _wait_for_banner(sshd)
    except BaseException:
        sshd.stop()
        raise
    return sshd


def _free_port() -> int:
    """Below the ephemeral range (`fleet.sim.ports`): no test beside this one can be handed it before sshd binds."""
    (port,) = free_ports(1)
    return port


def _wait_for_banner(sshd: Sshd) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if sshd.process.poll() is not None:
            raise RuntimeError(f"sshd exited {sshd.process.returncode}: {sshd.log.read_text()}")
        with suppress(OSError), socket.create_connection(("127.0.0.1", sshd.port), timeout=1) as s:
            if s.recv(64).startswith(b"SSH-2.0"):
                return
        time.sleep(0.05)
    raise RuntimeError(f"sshd did not answer within {START_TIMEOUT_S:g} s: {sshd.log.read_text()}")


def _descendants(root: int) -> list[int]:
    """Pids below root in the process tree (from /proc ppid fields)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        with suppress(OSError, ValueError, IndexError):
            ppid = int(Path(entry, "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found.extend(kids)
        todo.extend(kids)
    return found
