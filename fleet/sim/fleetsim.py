"""A simulated fleet: many SimNodes, each behind its own SSH server and address.

`async with SimFleet(tmp, specs) as sim:` sets up and starts every node
(concurrently), serves node N on 127.0.0.(1+N) with its own host key, and
writes what a real fleet's operator would have: a client key, a known_hosts
file and an inventory in the CONTRACT's shape. Leaving the block (also on
error or cancellation) stops every server and every node, killing each
process a node recorded. Files stay under the caller's directory, which the
caller removes.
"""

from __future__ import annotations

import getpass
import ipaddress
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import anyio
import yaml

from fleet.sim.node import NodeSpec, SimNode
from fleet.sim.server import SimServer
from fleet.transport.ssh.asyncssh_quiet import asyncssh

# Seconds allowed for stopping every server and node on exit.
STOP_TIMEOUT_S = 30.0


class SimFleet:
    """Serve many simulated nodes over SSH; see the module docstring."""

    def __init__(
        self,
        root: Path,
        specs: Sequence[NodeSpec],
        *,
        first_address: str = "127.0.0.2",
        groups: Mapping[str, Sequence[str]] | None = None,
        host_vars: Mapping[str, Mapping[str, object]] | None = None,
    ) -> None:
        self.root = root.absolute()
        self.specs = {spec.name: spec for spec in specs}
        if len(self.specs) != len(specs):
            raise ValueError("node names must be unique")
        unknown = set(host_vars or {}) - set(self.specs)
        if unknown:
            raise ValueError(f"host_vars for unknown nodes: {sorted(unknown)}")
        first = ipaddress.IPv4Address(first_address)
        self._addresses = {name: str(first + i) for i, name in enumerate(self.specs)}
        self._groups = dict(groups or {})
        self._host_vars = dict(host_vars or {})
        self.inventory_path = self.root / "inventory.yaml"
        self.client_key_path = self.root / "client_key"
        self.known_hosts_path = self.root / "known_hosts"
        self.nodes: dict[str, SimNode] = {}
        self.servers: dict[str, SimServer] = {}
        self._host_key_lines: dict[str, str] = {}

    async def __aenter__(self) -> SimFleet:
        try:
            await self._start()
        except BaseException:
            await self._stop()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stop()

    def address(self, name: str) -> str:
        return self._addresses[name]

    def port(self, name: str) -> int:
        return self.servers[name].port

    async def stop_server(self, name: str) -> None:
        """Stop serving node `name`: its port refuses connections from now on."""
        await self.servers[name].stop()

    async def stall_server(self, name: str) -> None:
        """Node `name` accepts TCP from now on and never answers."""
        await self.servers[name].stall()

    def corrupt_host_key(self, name: str) -> None:
        """Rewrite name's known_hosts line with some other key: clients must refuse it."""
        other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
        self._host_key_lines[name] = other
        self._write_known_hosts()

    async def _start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        client_key = self._write_client_key()
        for name, spec in self.specs.items():
            self.nodes[name] = SimNode(self.root / "nodes" / name, spec)
        async with anyio.create_task_group() as tg:
            for node in self.nodes.values():
                tg.start_soon(anyio.to_thread.run_sync, _bring_up, node)
        for name, node in self.nodes.items():
            self.servers[name] = server = SimServer(node.root, node.env(), client_key)
            await server.start(self.address(name), 0)
            self._host_key_lines[name] = server.host_key_line
        self._write_known_hosts()
        self._write_inventory()

    async def _stop(self) -> None:
        """Stop every server, then every node (threads): shielded, bounded."""
        with anyio.move_on_after(STOP_TIMEOUT_S, shield=True):
            async with anyio.create_task_group() as tg:
                for server in self.servers.values():
                    tg.start_soon(server.stop)
            async with anyio.create_task_group() as tg:
                for node in self.nodes.values():
                    tg.start_soon(anyio.to_thread.run_sync, node.stop)

    def _write_client_key(self) -> asyncssh.SSHKey:
        key = asyncssh.generate_private_key("ssh-ed25519")
        fd = os.open(self.client_key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.export_private_key("openssh"))
        return key

    def _write_known_hosts(self) -> None:
        lines = [f"[{self.address(n)}]:{self.port(n)} {key}\n" for n, key in self._host_key_lines.items()]
        self.known_hosts_path.write_text("".join(lines))

    def _write_inventory(self) -> None:
        groups: dict[str, object] = {"sim": {"hosts": list(self.specs)}}
        groups.update({name: {"hosts": list(hosts)} for name, hosts in self._groups.items()})
        hosts = {name: self._host_entry(name) for name in self.specs}
        text = yaml.safe_dump({"groups": groups, "hosts": hosts}, sort_keys=False)
        self.inventory_path.write_text(text)

    def _host_entry(self, name: str) -> dict[str, object]:
        spec, node = self.specs[name], self.nodes[name]
        entry: dict[str, object] = {
            "address": self.address(name),
            "port": self.port(name),
            "user": getpass.getuser(),
            "identity_file": str(self.client_key_path),
            "known_hosts": str(self.known_hosts_path),
            "devices": [node.devices_glob],
            "nvidia_smi": node.nvidia_smi_path,
            "lock_file": node.lock_file,
            "simulated": True,
            "gpus": spec.gpus,
            "services": [unit.name for unit in spec.units],
        }
        entry.update(self._host_vars.get(name, {}))
        return entry


def _bring_up(node: SimNode) -> None:
    """Blocking: lay out the node's files, start its units, wait until registered."""
    node.setup()
    node.start()
