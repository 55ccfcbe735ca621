"""Runs over scripted nodes (fleet.transport.scripted): a one-GPU node's answers, a host, and a run of the graph
with a RunFolder under tmp_path."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import anyio

from fleet.engine.graph import run_hosts
from fleet.engine.interrupts import Interrupts
from fleet.engine.options import RunOptions, RunState
from fleet.inventory.host import Host
from fleet.model.errors import ConnectError
from fleet.model.report import RunReport
from fleet.node.probes import smi
from fleet.reset import lock
from fleet.runlog.folder import RunLogs
from fleet.transport.scripted import Answer, Reply, ScriptedTransport
from support import scripted_node

GPU = "0, GPU-aaaa, 00000000:18:00.0, NVIDIA H100 80GB HBM3, {mib}, 81559, 0, Disabled\n"
# The host's reset lock, taken at once.
LOCK = (("sh", "-c", lock.LOCK_SH), Reply(stdout="locked\n"))


def node_script(*, settle_mib: int = 0, smi_delay: float = 0.0,
                holders_after_kill: str = "") -> list[tuple[tuple[str, ...], Answer]]:
    """A one-GPU node: one unit that stops, one stray holder that dies on SIGTERM."""
    scans = iter(["root\t/proc/100/task/100/fd/3\t/dev/nvidia0\n", holders_after_kill])
    return [
        (("systemctl", "stop"), Reply()),
        (("systemctl", "show"), Reply(stdout="ActiveState=inactive\nSubState=dead\nMainPID=0\n")),
        (scripted_node.SCAN, lambda argv: Reply(stdout=scripted_node.scan(next(scans, "")))),
        (("ps", "-ww"), Reply(stdout=scripted_node.ps("  100     1 root     python3\n"))),
        ((*scripted_node.EXE, "-c", "%N", "--", "/proc/100/exe"),
         scripted_node.exe_reply({100: "/usr/bin/python3.11"})),
        (("sh", "-c"), scripted_node.signal()),
        (("nvidia-smi", "--query-gpu=index,uuid,memory.used,mig.mode.current"),
         Reply(stdout=f"0, GPU-aaaa, {settle_mib}, Disabled\n", delay_s=smi_delay)),
        (("nvidia-smi", "--query-gpu=" + ",".join(smi.VERIFY_FIELDS)), Reply(stdout=GPU.format(mib=settle_mib),
                                                                            delay_s=smi_delay)),
        (("nvidia-smi", "--query-compute-apps="), Reply(stdout="")),
        *scripted_node.HEALTH,
        LOCK,  # for a script without the ("sh", "-c") entry above, which answers it too
        (scripted_node.LINEAGE, scripted_node.lineage),
        (("grep",), Reply(stdout="")),  # cgroups: no process in a unit
    ]


def make_host(name: str = "gpu-01", **kw: object) -> Host:
    base: dict[str, object] = {"services": ("sglang.service",), "gpus": 1, "command_timeout": 1.0,
                               "settle_timeout": 1.0, "kill_grace": 0.5}
    base.update(kw)
    return Host(name=name, address="127.0.0.1", **base)  # type: ignore[arg-type]  # base: Host's fields, any type


async def run(hosts: Sequence[Host], scripts: Mapping[str, ScriptedTransport], tmp_path: Path,
              **options: object) -> tuple[RunReport, RunState]:
    async def connector(host: Host) -> ScriptedTransport:
        if host.name not in scripts:
            raise ConnectError(f"connection refused ({host.address}:22)")
        return scripts[host.name]

    logs = RunLogs(tmp_path, "run-1")
    logs.create()
    # options: RunOptions' fields, as each test gives them; `handle_signals`: this process's SIGINT, SIGTERM and
    # SIGHUP cut the run (as the command line's do)
    interrupts = Interrupts() if options.pop("handle_signals", False) else None
    async with anyio.create_task_group() as signals:
        if interrupts is not None:
            await signals.start(interrupts.watch)
        report, state = await run_hosts(hosts, RunOptions(**options), logs, connector=connector,  # type: ignore[arg-type]
                                        interrupts=interrupts)
        signals.cancel_scope.cancel()
    logs.close()
    return report, state
