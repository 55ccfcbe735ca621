"""The real Slurm cluster for integration tests (marker `slurm`; see `fleet.sim.slurmcluster`).

The `slurm_cluster` fixture (conftest.py) is a `StartCluster`: call it with node names and loopback
addresses (`loopback_nodes(4)`: sim1..sim4 on 127.0.0.2..5) to get a started cluster under the
test's tmp_path; every cluster it started is stopped at teardown, also when the test failed.
`leftovers(cluster)` lists, independently of the cluster's own bookkeeping, what of it still runs.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Protocol

from fleet.sim.slurmcluster import MARKER_VAR, SlurmCluster


class StartCluster(Protocol):
    """The `slurm_cluster` fixture: start a cluster of these nodes (stopped at teardown)."""

    def __call__(
        self,
        nodes: Mapping[str, str],
        *,
        partitions: Mapping[str, Sequence[str]] | None = None,
        task_env: Mapping[str, Mapping[str, str]] | None = None,
        gpus: Mapping[str, int] | None = None,
    ) -> SlurmCluster: ...


def loopback_nodes(count: int, prefix: str = "sim", first: str = "127.0.0.2") -> dict[str, str]:
    """{"sim1": "127.0.0.2", "sim2": "127.0.0.3", ...}: count nodes, each on its own address."""
    start = ipaddress.IPv4Address(first)
    return {f"{prefix}{i + 1}": str(start + i) for i in range(count)}


def live(pid: int) -> bool:
    """pid is a process that runs (a zombie has ended: it only waits for its parent to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cmdline(pid: int) -> list[str]:
    with suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").rstrip("\0").split("\0")
    return []


def environ(pid: int) -> dict[str, str]:
    with suppress(OSError):
        entries = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
        return dict(e.split("=", 1) for e in entries if "=" in e)
    return {}


def slurmstepds(cluster: SlurmCluster) -> list[int]:
    """Live slurmstepd processes of this cluster: slurmstepd run with its cwd or an open file under ROOT."""
    found = []
    for pid in _pids():
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
            paths = [os.readlink(f"/proc/{pid}/cwd")] + [os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        if Path(exe).name.startswith("slurmstepd") and any(Path(p).is_relative_to(cluster.root) for p in paths):
            found.append(pid)
    return [pid for pid in found if live(pid)]


def tasks(cluster: SlurmCluster) -> list[int]:
    """Live processes carrying the cluster's marker: its daemons (before stop), slurmstepds, tasks."""
    return [pid for pid in _pids() if environ(pid).get(MARKER_VAR) == cluster.token and live(pid)]


def leftovers(cluster: SlurmCluster) -> list[str]:
    """What of this cluster still runs: its daemons' pids, its slurmstepds, its marked processes."""
    daemons = [pid for pid in cluster.pids.values() if live(pid) and environ(pid).get(MARKER_VAR) == cluster.token]
    pids = sorted({*daemons, *slurmstepds(cluster), *tasks(cluster)})
    return [f"{pid}: {' '.join(cmdline(pid))}" for pid in pids]


def port_free(port: int) -> bool:
    """Nothing listens on TCP port (any address): a server could bind it now, as Slurm's daemons do."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
            s.listen()
        except OSError:
            return False
        return True


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and int(p.name) != os.getpid()]
