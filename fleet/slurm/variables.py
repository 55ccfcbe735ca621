"""Slurm's host variables (`VARIABLES`), written under `slurm:` in the inventory: `slurm: {node: gpu01}`.

The inventory checks them as each field's `Var` says and hands them to the host (`Host.variables_of`); the table
in docs/operating.md lists them as `slurm.node`. A light module: the inventory imports it, never Slurm's client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fleet.inventory import validate
from fleet.inventory.host import Host, Var
from fleet.slurm import NAME


@dataclass(frozen=True, kw_only=True)
class SlurmVariables:
    """A host as Slurm knows it."""

    node: Annotated[
        str | None,
        Var(help="the host's node name in Slurm (`--slurm`)", check=validate.host_name, shown="the host name",
            old="slurm_node"),
    ] = None


VARIABLES = SlurmVariables


def node_name(host: Host) -> str:
    """The host's node in Slurm: its `slurm.node`, else its name."""
    return host.variables_of(NAME, SlurmVariables).node or host.name
