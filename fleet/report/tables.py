"""Terminal tables (rich), kept apart from the CLI wiring."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from fleet import terminal
from fleet.inventory.host import Host
from fleet.text import terminal_safe
from fleet.transport.plugs import where


def inventory_table(hosts: Sequence[Host]) -> None:
    """The targets a line each, within the terminal's width (80 columns when piped): a cell too wide for it is cut
    with an ellipsis, never wrapped over lines (`fleet inventory --json` has every value whole)."""
    table = Table(box=None)
    table.add_column("host", no_wrap=True, min_width=max((len(h.name) for h in hosts), default=4))
    for column in ("address", "user", "groups", "gpus", "services", "become"):
        table.add_column(column, no_wrap=True, overflow="ellipsis", min_width=min(len(column), 5))
    for h in hosts:
        table.add_row(*cells(
            h.name, where(h), h.user or "",
            ",".join(h.groups), "" if h.gpus is None else str(h.gpus), ",".join(h.services), "yes" if h.become else "",
        ))
    Console().print(table)


def cells(*values: str) -> list[Text]:
    """A row's cells as plain text (never rich markup: a process's name may read `[blink]`), each `terminal_safe`."""
    return [Text(terminal_safe(value)) for value in values]


class Quiet(Console):
    """rich's Console, but a reader that left (EPIPE) silences the stream where rich would exit the process."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        terminal.lost(self.file)
