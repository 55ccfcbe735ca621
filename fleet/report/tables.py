"""Terminal tables (rich), kept apart from the CLI wiring."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from fleet import terminal
from fleet.inventory.host import Host
from fleet.model.report import RunReport, StepName, StepStatus
from fleet.transport.plugs import where


def inventory_table(hosts: Sequence[Host]) -> None:
    table = Table("host", "address", "user", "groups", "gpus", "services", "become", box=None)
    for h in hosts:
        table.add_row(
            h.name, where(h), h.user or "",
            ",".join(h.groups), "" if h.gpus is None else str(h.gpus), ",".join(h.services), "yes" if h.become else "",
        )
    Console(soft_wrap=True).print(table)




def report_table(report: RunReport) -> None:
    """Per host: status, each step's time, what was killed, Slurm's state after (with Slurm), the error: for the
    demo and small runs."""
    slurm = any(h.scheduler is not None for h in report.hosts.values())
    table = Table("host", "status", *[s.value for s in StepName], "killed", *(["slurm"] if slurm else []), "error",
                  box=None)
    for name, host in report.hosts.items():
        times = [f"{s.duration_s:.1f}s" if s.status is StepStatus.OK else s.status.value for s in host.steps]
        killed = ", ".join(f"{k.name}:{k.pid} ({k.signal})" for k in host.killed)
        after = [(host.scheduler.state_after or "?") if host.scheduler else ""] if slurm else []
        table.add_row(name, host.status.value, *times, killed, *after, host.error or "")
    console = Quiet(stderr=True, soft_wrap=True)
    try:
        console.print(table)
    except OSError:  # the terminal hung up (EIO): the report is on disk
        terminal.lost(console.file)


class Quiet(Console):
    """rich's Console, but a reader that left (EPIPE) silences the stream where rich would exit the process."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        terminal.lost(self.file)
