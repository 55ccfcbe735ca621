"""The testbed: N simulated 8-GPU nodes on loopback addresses behind real OpenSSH sshd daemons."""

from __future__ import annotations

import concurrent.futures
import contextlib
import subprocess
import sys
from pathlib import Path
from typing import Any

from .common import ALL_GPUS, REPO, SIM_NODE_VAR, UNIT
from .pidns import NodeNamespace
from .procs import reap_children
from .sshd import Daemons, addresses

# 2 cores serve all N nodes: generous bounds, so a slow box is not mistaken for a failing node (`--fleet-bounds
# bench`, the default); `--fleet-bounds defaults` writes none, so fleet runs at its own defaults.
BENCH_BOUNDS = {"connect_timeout": 120, "command_timeout": 120, "drain_timeout": 120, "settle_timeout": 120}
NSNODE = Path(__file__).with_name("nsnode.py")


def node_spec(name: str, linger_s: float, protected_daemon: bool) -> Any:
    """A busy 8-GPU node: its serving unit's worker holds 70,000 MiB on every GPU."""
    from fleet.sim.node import NodeSpec, UnitSpec
    unit = UnitSpec(name=UNIT, gpus=ALL_GPUS, mib=70_000, process_name="sglang")
    return NodeSpec(name=name, units=(unit,), linger_s=linger_s, protected_daemon=protected_daemon)


class Testbed:
    """N simulated nodes, ceil(N/16) sshd daemons on one port, one client key, the inventory.

    `own_proc` (the default): each node lives in its own PID namespace with its own /proc (pidns.py), and
    every SSH session to its address runs there, as on real nodes; without it all nodes share this machine's
    process table and each node's holder scan walks every node's processes."""

    def __init__(self, root: Path, count: int, *, linger_s: float, protected_daemon: bool,
                 bounds: str = "bench", own_proc: bool = True) -> None:
        self.root = root
        self.own_proc = own_proc
        self.namespaces: dict[str, NodeNamespace] = {}
        self.bounds = bounds  # "bench": 120 s bounds (BENCH_BOUNDS); "defaults": fleet's own defaults
        self.count = count
        self.linger_s = linger_s
        self.protected_daemon = protected_daemon
        self.names = [f"n{i:04d}" for i in range(1, count + 1)]
        self.addrs = dict(zip(self.names, addresses(count), strict=True))
        self.nodes: dict[str, Any] = {}
        self.daemons: Daemons | None = None
        self.sshds: list[subprocess.Popen[bytes]] = []
        self.port = 0
        self.key = root / "client_key"
        self.known_hosts = root / "known_hosts"
        self.inventory = root / "inventory.yaml"

    # ---------------------------------------------------------- nodes

    def start_nodes(self) -> None:
        from fleet.sim.node import SimNode
        for name in self.names:
            self.nodes[name] = SimNode(self.root / "nodes" / name, node_spec(name, self.linger_s,
                                                                             self.protected_daemon))

        def up(node: Any) -> None:
            node.setup()
            if self.own_proc:
                namespace = self.namespaces[node.spec.name] = NodeNamespace(node.root)
                namespace.start()
                self._inside(node, "start")
            else:
                node.start()

        self._each(up)

    def restart_units(self) -> None:
        """Make every node busy again: its unit running, its worker holding all 8 GPUs."""
        def busy(node: Any) -> None:
            if self.own_proc:
                self._inside(node, "busy")
            elif node.unit_state(UNIT) != "active":
                node.start_unit(UNIT)

        self._each(busy)
        reap_children()

    def _inside(self, node: Any, action: str) -> None:
        """nsnode.py ACTION run in the node's namespace (its pids are the namespace's, as the node's tools see)."""
        argv = [sys.executable, str(NSNODE), str(node.root), node.spec.name, str(self.linger_s),
                "1" if self.protected_daemon else "0", action]
        self.namespaces[node.spec.name].run(argv, env={**node.env(), "PYTHONPATH": str(REPO)})

    def _unit_stopped(self, node: Any) -> bool:
        """The unit is not active. With own_proc its recorded pids are the namespace's, so the state the
        simulated systemctl wrote is read as it is (a supervisor that died is not counted as stopped)."""
        if not self.own_proc:
            return bool(node.unit_state(UNIT) != "active")
        from fleet.sim import state
        recorded = state.read_json(state.unit_path(node.root, UNIT))
        return recorded is None or recorded["ActiveState"] in ("inactive", "failed")

    def verify(self, owners: dict[str, str]) -> int:
        """Nodes where the run's lock command wrote `owners[name]` and the unit is no longer active:
        proof that the tool's first and its drain commands ran there."""
        from fleet.reset.lock import owner_file
        ok = 0
        for name, owner in owners.items():
            node = self.nodes[name]
            with contextlib.suppress(OSError):
                written = Path(owner_file(node.lock_file)).read_text().strip()
                ok += written == owner and self._unit_stopped(node)
        return ok

    def stop_nodes(self) -> None:
        if self.own_proc:
            for namespace in self.namespaces.values():
                namespace.stop()
            self.namespaces.clear()
        else:
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
        """The sshd daemons (`fanoutlib.sshd`); each address's commands see its node's PATH and folder."""
        environments = {}
        for name, node in self.nodes.items():
            env = node.env()
            # HOME: the node's own (see fanoutlib.sshd)
            environments[self.addrs[name]] = {"PATH": env["PATH"], "PYTHONPATH": env["PYTHONPATH"],
                                              SIM_NODE_VAR: str(node.root), "HOME": str(node.root)}
        commands = ({self.addrs[name]: namespace.forced_command() for name, namespace in self.namespaces.items()}
                    if self.own_proc else None)
        self.daemons = Daemons(self.root, list(self.addrs.values()), environments, commands)
        self.daemons.start()
        self.port, self.key, self.known_hosts = self.daemons.port, self.daemons.key, self.daemons.known_hosts
        self.sshds = self.daemons.procs

    def stop_sshd(self) -> None:
        """Kill every sshd daemon and everything it started (connections, their commands), by pid."""
        if self.daemons is not None:
            self.daemons.stop()

    # ---------------------------------------------------------- inventory

    def write_inventory(self) -> None:
        import yaml
        defaults = {
            "user": "root", "port": self.port, "identity_file": str(self.key), "known_hosts": str(self.known_hosts),
            "gpus": 8, "services": [UNIT], **(BENCH_BOUNDS if self.bounds == "bench" else {}),
        }
        hosts = {name: {"address": self.addrs[name], "devices": [node.devices_glob], "simulated": True,
                        "nvidia_smi": node.nvidia_smi_path, "lock_file": node.lock_file}  # its lock: in its root
                 for name, node in self.nodes.items()}
        self.inventory.write_text(yaml.safe_dump({"defaults": defaults, "hosts": hosts}, sort_keys=False))
