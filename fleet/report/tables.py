"""Terminal tables (rich), kept apart from the CLI wiring."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from fleet.inventory.host import Host
from fleet.report.models import RunReport, StepName, StepStatus


def inventory_table(hosts: Sequence[Host]) -> None:
    table = Table("host", "address", "user", "groups", "gpus", "services", "become", box=None)
    for h in hosts:
        table.add_row(
            h.name, f"{h.address}:{h.port}" if h.connection == "ssh" else "local", h.user or "",
            ",".join(h.groups), "" if h.gpus is None else str(h.gpus), ",".join(h.services), "yes" if h.become else "",
        )
    Console(soft_wrap=True).print(table)


def report_table(report: RunReport) -> None:
    """Per host: status, each step's time, what was killed, the error: for the demo and small runs."""
    table = Table("host", "status", *[s.value for s in StepName], "killed", "error", box=None)
    for name, host in report.hosts.items():
        times = [f"{s.duration_s:.1f}s" if s.status is StepStatus.OK else s.status.value for s in host.steps]
        killed = ", ".join(f"{k.name}:{k.pid} ({k.signal})" for k in host.killed)
        table.add_row(name, host.status.value, *times, killed, host.error or "")
    Console(stderr=True, soft_wrap=True).print(table)
