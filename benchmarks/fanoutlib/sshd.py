"""Real OpenSSH sshd daemons on loopback: one daemon per 16 addresses (sshd's limit on ListenAddress), all on one
port, one host key, one client key, a known_hosts made for the run; every daemon and its sessions killed by pid.

    daemons = Daemons(root, addresses(64))
    daemons.start()                 # client_key, known_hosts, the daemons; waits until every address listens
    ... connect to (address, daemons.port) with daemons.key, checked against daemons.known_hosts ...
    daemons.stop()

`environments` (address -> variables): each address gets its own authorized_keys file (`Match LocalAddress`)
whose `environment=` options set those variables for every command run there (the fan-out's simulated nodes
put their fake nvidia-smi and systemctl first on PATH this way); `commands` (address -> a forced command, with
an environment) runs every session of that address through it (the fan-out's nodes: into the node's own PID
namespace, `pidns.py`). Without environments one authorized_keys file serves
every address. Either way HOME is an empty folder of the run's: bash started by sshd sources ~/.bashrc even for
`ssh host cmd`, and this machine's root dotfiles (pyenv init: ~0.2 s of CPU a command) are not part of a node.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from .common import ADDRESSES_PER_SSHD, SSHD
from .procs import descendants, kill_pids, process_table, reaped_cpu_s

SSHD_CONFIG = """\
Port {port}
{listen}
HostKey {host_key}
PidFile {dir}/sshd.pid
AuthorizedKeysFile {authorized}
PermitUserEnvironment yes
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
PrintMotd no
X11Forwarding no
MaxStartups {max_startups}
MaxSessions 1000
LogLevel ERROR
{matches}
"""
# Unauthenticated connections a daemon accepts before it drops new ones (start:rate:full): far above the 16 hosts
# a daemon serves, so that no connection is ever refused by the testbed itself.
MAX_STARTUPS = "10000:30:10000"


def addresses(count: int) -> list[str]:
    """127.0.0.2 upwards, skipping .0 and .255 last octets."""
    out: list[str] = []
    address = ipaddress.IPv4Address("127.0.0.2")
    while len(out) < count:
        if address.packed[3] not in (0, 255):
            out.append(str(address))
        address += 1
    return out


def free_port(addrs: list[str]) -> int:
    """A TCP port free on every address."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            for address in addrs:
                with socket.socket() as s:
                    s.bind((address, port))
            return int(port)
        except OSError:
            continue
    raise RuntimeError("no port free on every address")


def listening(port: int) -> set[str]:
    """IPv4 addresses with a socket in LISTEN on port (/proc/net/tcp)."""
    found = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split()
            local, state = parts[1], parts[3]
            hexaddr, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:
                found.add(socket.inet_ntoa(bytes.fromhex(hexaddr)[::-1]))
    return found


def keygen(path: Path, comment: str) -> str:
    """A new ed25519 key pair at path; its public line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


class Daemons:
    """sshd daemons serving `addrs` on one port (see the module docstring)."""

    def __init__(self, root: Path, addrs: list[str],
                 environments: Mapping[str, Mapping[str, str]] | None = None,
                 commands: Mapping[str, str] | None = None) -> None:
        self.root = root
        self.addrs = addrs
        self.environments = environments
        self.commands = commands or {}  # address -> a forced command (`command=`) run instead of the client's
        self.key = root / "client_key"
        self.known_hosts = root / "known_hosts"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.port = 0

    def start(self) -> None:
        SSHD.exists() or sys.exit(f"{SSHD} not found: apt-get install openssh-server")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
        public = keygen(self.key, "fleet-bench")
        host_key = self.root / "ssh_host_ed25519_key"
        key_type, key_b64 = keygen(host_key, "fleet-bench-host").split()[:2]
        self.port = free_port(self.addrs)
        self.known_hosts.write_text("".join(f"[{a}]:{self.port} {key_type} {key_b64}\n" for a in self.addrs))
        keys_dir = self.root / "authorized"
        keys_dir.mkdir()
        home = self.root / "home"
        home.mkdir()
        (keys_dir / "all").write_text(f'environment="HOME={home}" {public}\n')
        for first in range(0, len(self.addrs), ADDRESSES_PER_SSHD):
            self._start_one(self.addrs[first:first + ADDRESSES_PER_SSHD], first // ADDRESSES_PER_SSHD, host_key,
                            public, keys_dir)
        self._wait_listening()

    def _start_one(self, addrs: list[str], number: int, host_key: Path, public: str, keys_dir: Path) -> None:
        """The daemon for `addrs`: its config (and, with environments, an authorized_keys file an address), started."""
        directory = self.root / "sshd" / f"{number:04d}"
        directory.mkdir(parents=True)
        matches = []
        own = {a: self.environments[a] for a in addrs} if self.environments is not None else {}
        for address, environment in own.items():
            options = ",".join(f'environment="{k}={v}"' for k, v in environment.items())
            if address in self.commands:
                options += ',command="' + self.commands[address].replace('"', '\\"') + '"'
            (keys_dir / address).write_text(f"{options} {public}\n")
            matches.append(f"Match LocalAddress {address}\n    AuthorizedKeysFile {keys_dir / address}")
        config = directory / "sshd_config"
        config.write_text(SSHD_CONFIG.format(
            port=self.port, dir=directory, host_key=host_key, authorized=keys_dir / "all",
            max_startups=MAX_STARTUPS, listen="\n".join(f"ListenAddress {a}" for a in addrs),
            matches="\n".join(matches)))
        with (directory / "sshd.log").open("wb") as err:
            proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stderr=err, stdin=subprocess.DEVNULL)
        self.procs.append(proc)

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + 30 + len(self.procs) / 10
        while (missing := set(self.addrs) - listening(self.port)) and time.monotonic() < deadline:
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"sshd exited: {dead[:3]}; see {self.root / 'sshd'}/*/sshd.log")
            time.sleep(0.1)
        if missing:
            raise RuntimeError(f"sshd not listening on {len(missing)} addresses, e.g. {sorted(missing)[:3]}")

    def sessions(self, table: dict[int, int] | None = None) -> list[int]:
        """Every process the daemons started (connections, their commands), by pid."""
        table = process_table() if table is None else table
        return [pid for proc in self.procs for pid in descendants(proc.pid, table)]

    def cpu_s(self) -> float:
        """CPU seconds of the daemons and of every session they have reaped (one still running is not in it)."""
        return sum(reaped_cpu_s(proc.pid) for proc in self.procs)

    def settled(self, within_s: float = 30.0) -> bool:
        """Wait (bounded) until no session is left: then `cpu_s` holds every session's CPU."""
        deadline = time.monotonic() + within_s
        while self.sessions() and time.monotonic() < deadline:
            time.sleep(0.2)
        return not self.sessions()

    def stop(self) -> None:
        """Kill every daemon and everything it started, by pid."""
        kill_pids(self.sessions())
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self.procs.clear()
