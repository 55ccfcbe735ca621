"""The testbed: N simulated 8-GPU nodes on loopback addresses behind real OpenSSH sshd daemons."""

from __future__ import annotations

import concurrent.futures
import contextlib
import ipaddress
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .common import ADDRESSES_PER_SSHD, ALL_GPUS, SIM_NODE_VAR, SSHD, UNIT
from .procs import descendants, kill_pids, process_table, reap_children

# 2 cores serve all N nodes: generous bounds, so a slow box is not mistaken for a failing node (`--fleet-bounds
# bench`, the default); `--fleet-bounds defaults` writes none, so fleet runs at its own defaults.
BENCH_BOUNDS = {"connect_timeout": 120, "command_timeout": 120, "drain_timeout": 120, "settle_timeout": 120}

SSHD_CONFIG = """\
Port {port}
{listen}
HostKey {dir}/ssh_host_ed25519_key
PidFile {dir}/sshd.pid
AuthorizedKeysFile none
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
MaxStartups 1000:30:2000
MaxSessions 1000
LogLevel ERROR
{matches}
"""


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


class Testbed:
    """N simulated nodes, ceil(N/16) sshd daemons on one port, one client key, the inventory."""

    def __init__(self, root: Path, count: int, *, linger_s: float, protected_daemon: bool,
                 bounds: str = "bench") -> None:
        self.root = root
        self.bounds = bounds  # "bench": 120 s bounds (BENCH_BOUNDS); "defaults": fleet's own defaults
        self.count = count
        self.linger_s = linger_s
        self.protected_daemon = protected_daemon
        self.names = [f"n{i:04d}" for i in range(1, count + 1)]
        self.addrs = dict(zip(self.names, addresses(count), strict=True))
        self.nodes: dict[str, Any] = {}
        self.sshds: list[subprocess.Popen[bytes]] = []
        self.port = 0
        self.key = root / "client_key"
        self.known_hosts = root / "known_hosts"
        self.inventory = root / "inventory.yaml"

    # ---------------------------------------------------------- nodes

    def _spec(self, name: str) -> Any:
        from fleet.sim.node import NodeSpec, UnitSpec
        unit = UnitSpec(UNIT, gpus=ALL_GPUS, mib=70_000, process_name="sglang")
        return NodeSpec(name=name, units=(unit,), linger_s=self.linger_s, protected_daemon=self.protected_daemon)

    def start_nodes(self) -> None:
        from fleet.sim.node import SimNode
        for name in self.names:
            self.nodes[name] = SimNode(self.root / "nodes" / name, self._spec(name))

        def up(node: Any) -> None:
            node.setup()
            node.start()

        self._each(up)

    def restart_units(self) -> None:
        """Make every node busy again: its unit running, its worker holding all 8 GPUs."""
        def busy(node: Any) -> None:
            if node.unit_state(UNIT) != "active":
                node.start_unit(UNIT)

        self._each(busy)
        reap_children()

    def verify(self, owners: dict[str, str]) -> int:
        """Nodes where the run's lock command wrote `owners[name]` and the unit is no longer active:
        proof that the tool's first and its drain commands ran there."""
        from fleet.reset.lock import owner_file
        ok = 0
        for name, owner in owners.items():
            node = self.nodes[name]
            with contextlib.suppress(OSError):
                written = Path(owner_file(node.lock_file)).read_text().strip()
                ok += written == owner and node.unit_state(UNIT) != "active"
        return ok

    def stop_nodes(self) -> None:
        self._each(lambda node: node.stop(), check=False)

    def _each(self, fn: Any, check: bool = True) -> None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            futures = [pool.submit(fn, node) for node in self.nodes.values()]
            for future in futures:
                exc = future.exception()
                if exc is not None and check:
                    raise exc

    # ---------------------------------------------------------- sshd

    def start_sshd(self) -> None:
        SSHD.exists() or sys.exit(f"{SSHD} not found: apt-get install openssh-server")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fanout", "-f", str(self.key)],
                       check=True)
        public = (self.key.with_suffix(".pub")).read_text().strip()
        keys_dir = self.root / "authorized"
        keys_dir.mkdir()
        addrs = list(self.addrs.values())
        self.port = free_port(addrs)
        known: list[str] = []
        for first in range(0, self.count, ADDRESSES_PER_SSHD):
            known.extend(self._start_one_sshd(first, public, keys_dir))
        self.known_hosts.write_text("\n".join(known) + "\n")
        self._wait_listening(addrs)

    def _start_one_sshd(self, first: int, public: str, keys_dir: Path) -> list[str]:
        """The daemon for the 16 hosts from index `first`: its host key, one authorized_keys file per address,
        its config; started. Returns the hosts' known_hosts lines."""
        names = self.names[first:first + ADDRESSES_PER_SSHD]
        directory = self.root / "sshd" / f"{first // ADDRESSES_PER_SSHD:03d}"
        directory.mkdir(parents=True)
        host_key = directory / "ssh_host_ed25519_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
        key_type, key_b64 = host_key.with_suffix(".pub").read_text().split()[:2]
        matches, known = [], []
        for name in names:
            address, node = self.addrs[name], self.nodes[name]
            env = node.env()
            # HOME: bash started by sshd sources ~/.bashrc even for `ssh host cmd`; this machine's
            # root dotfiles (pyenv init: ~0.2 s of CPU a command) are not part of a GPU node
            environment = {"PATH": env["PATH"], "PYTHONPATH": env["PYTHONPATH"], SIM_NODE_VAR: str(node.root),
                           "HOME": str(node.root)}
            options = ",".join(f'environment="{k}={v}"' for k, v in environment.items())
            (keys_dir / address).write_text(f"{options} {public}\n")
            matches.append(f"Match LocalAddress {address}\n    AuthorizedKeysFile {keys_dir / address}")
            known.append(f"[{address}]:{self.port} {key_type} {key_b64}")
        config = directory / "sshd_config"
        config.write_text(SSHD_CONFIG.format(
            port=self.port, dir=directory, listen="\n".join(f"ListenAddress {self.addrs[n]}" for n in names),
            matches="\n".join(matches)))
        with (directory / "sshd.log").open("wb") as err:
            self.sshds.append(subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stderr=err,
                                               stdin=subprocess.DEVNULL))
        return known

    def _wait_listening(self, addrs: list[str]) -> None:
        deadline = time.monotonic() + 30
        while (missing := set(addrs) - listening(self.port)) and time.monotonic() < deadline:
            dead = [p.args for p in self.sshds if p.poll() is not None]
            if dead:
                raise RuntimeError(f"sshd exited: {dead}; see {self.root / 'sshd'}/*/sshd.log")
            time.sleep(0.1)
        if missing:
            raise RuntimeError(f"sshd not listening on {len(missing)} addresses, e.g. {sorted(missing)[:3]}")

    def stop_sshd(self) -> None:
        """Kill every sshd daemon and everything it started (connections, their commands), by pid."""
        table = process_table()
        for proc in self.sshds:
            kill_pids(descendants(proc.pid, table))
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        for proc in self.sshds:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self.sshds.clear()

    # ---------------------------------------------------------- inventory

    def write_inventory(self) -> None:
        import yaml
        defaults = {
            "user": "root", "port": self.port, "identity_file": str(self.key), "known_hosts": str(self.known_hosts),
            "gpus": 8, "services": [UNIT], **(BENCH_BOUNDS if self.bounds == "bench" else {}),
        }
        hosts = {name: {"address": self.addrs[name], "devices": [node.devices_glob],
                        "nvidia_smi": node.nvidia_smi_path, "lock_file": node.lock_file}
                 for name, node in self.nodes.items()}
        self.inventory.write_text(yaml.safe_dump({"defaults": defaults, "hosts": hosts}, sort_keys=False))
