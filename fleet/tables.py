"""Terminal tables (rich), kept apart from the CLI wiring."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from fleet.models import Host


def inventory_table(hosts: Sequence[Host]) -> None:
    table = Table("host", "address", "user", "groups", "gpus", "services", "become", box=None)
    for h in hosts:
        table.add_row(
            h.name, f"{h.address}:{h.port}" if h.connection == "ssh" else "local", h.user or "",
            ",".join(h.groups), "" if h.gpus is None else str(h.gpus), ",".join(h.services), "yes" if h.become else "",
        )
    Console(soft_wrap=True).print(table)
