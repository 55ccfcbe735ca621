"""Terminal tables (rich), kept apart from the CLI wiring."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from fleet import terminal
from fleet.inventory.host import Host
from fleet.model.report import RunReport, StepName, StepStatus
from fleet.text import shown
from fleet.transport.plugs import where


def inventory_table(hosts: Sequence[Host]) -> None:
    table = Table("host", "address", "user", "groups", "gpus", "services", "become", box=None)
    for h in hosts:
        table.add_row(*cells(
            h.name, where(h), h.user or "",
            ",".join(h.groups), "" if h.gpus is None else str(h.gpus), ",".join(h.services), "yes" if h.become else "",
        ))
    Console(soft_wrap=True).print(table)




def report_table(report: RunReport) -> None:
    """Per host: status, each step's time, what was killed, the node's state after in its scheduler (with one,
    the column named after it: `slurm`), the error: for the demo and small runs."""
    scheduled = sorted({h.scheduler.by for h in report.hosts.values() if h.scheduler is not None})
    column = ["/".join(scheduled)] if scheduled else []
    table = Table("host", "status", *[s.value for s in StepName], "killed", *column, "error", box=None)
    for name, host in report.hosts.items():
        times = [f"{s.duration_s:.1f}s" if s.status is StepStatus.OK else s.status.value for s in host.steps]
        killed = ", ".join(f"{k.name}:{k.pid} ({k.signal})" for k in host.killed)
        after = [(host.scheduler.state_after or "?") if host.scheduler else ""] if scheduled else []
        table.add_row(*cells(name, host.status.value, *times, killed, *after, host.error or ""))
    console = Quiet(stderr=True, soft_wrap=True)
    try:
        console.print(table)
    except OSError:  # the terminal hung up (EIO): the report is on disk
        terminal.lost(console.file)


def cells(*values: str) -> list[Text]:
    """A row's cells as plain text (never rich markup: a process's name may read `[blink]`), each `shown`."""
    return [Text(shown(value)) for value in values]


class Quiet(Console):
    """rich's Console, but a reader that left (EPIPE) silences the stream where rich would exit the process."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        terminal.lost(self.file)
