"""Simulated GPU nodes behind the real OpenSSH sshd: a started node and the Host fleet reaches it by, one run of
it, and what its log says."""

from __future__ import annotations

import getpass
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.engine.graph import run_hosts
from fleet.engine.options import RunOptions
from fleet.engine.walk import Mode
from fleet.inventory.host import Host
from fleet.model.report import HostReport
from fleet.runlog.folder import RunLogs
from fleet.sim.node import NodeSpec, SimNode, UnitSpec
from support.keys import ClientKey
from support.sim_fleet import ALL
from support.sshd import Sshd

NAME = "gpu-s01"


MakeHost = Callable[..., tuple[SimNode, Host]]


@pytest.fixture
def make_host(tmp_path: Path, sshd: Sshd, client_key: ClientKey) -> Iterator[MakeHost]:
    """A started simulated node reached through sshd, and the host fleet resets; every node stopped after."""
    nodes: list[SimNode] = []

    def make(spec: NodeSpec, before_start: Callable[[SimNode], None] = lambda _: None,
             **host_vars: Any) -> tuple[SimNode, Host]:
        node = SimNode(tmp_path / spec.name, spec)
        nodes.append(node)
        node.setup()
        before_start(node)
        node.start()
        env = node.env()
        sshd.authorize(client_key.public_line, environment={"PATH": env["PATH"], "PYTHONPATH": env["PYTHONPATH"]})
        host = Host(
            name=spec.name, address="127.0.0.1", port=sshd.port, user=getpass.getuser(),
            identity_file=str(client_key.path), known_hosts=str(sshd.known_hosts), gpus=8,
            services=tuple(u.name for u in spec.units), devices=(node.devices_glob,), nvidia_smi=node.nvidia_smi_path,
            drain_timeout=5, kill_grace=2, settle_timeout=15, connect_timeout=5, lock_file=node.lock_file,
            **host_vars,
        )
        return node, host

    yield make
    for node in nodes:
        node.stop()


RUNS = iter(range(1000))


async def run(host: Host, tmp_path: Path, mode: Mode = Mode.RESET,
              **options: Any) -> tuple[HostReport, list[dict[str, Any]]]:
    """One run of one host; its report and its log's events. `options`: more `RunOptions`."""
    logs = RunLogs(tmp_path / "logs", f"health-{mode.value}-{next(RUNS)}")
    logs.create()
    try:
        report, _ = await run_hosts([host], RunOptions(mode=mode, **options), logs)
    finally:
        logs.close()
    events = [json.loads(line) for line in (tmp_path / "logs" / logs.run_id / f"{host.name}.jsonl").read_text()
              .splitlines()]
    return report.hosts[host.name], events


def serving(name: str = NAME, **spec: Any) -> NodeSpec:
    return NodeSpec(name=name, units=(UnitSpec(name="sglang.service", gpus=ALL, mib=30000, process_name="sglang"),),
                    linger_s=0.5, **spec)


def kernel_reads(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The kernel-log reads a host's log shows (each a section of a batch)."""
    return [e for e in events if e["event"] == "command" and "fleet-kernel-log" in e["argv"]]
