"""fleet's plugs, by name: the workload managers (`scheduler:`, `--scheduler`) and the transports (a host's
`connection:`). Each registry names modules, not objects: a plug's code is only imported when something asks for
it (the SSH transport's asyncssh, a scheduler's controller), and the inventory checks a name against a registry
without importing any. Adding a plug is a module and one row here (`docs/architecture.md`, "Extending fleet").
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from typing import NamedTuple


class Scheduled(NamedTuple):
    """Where a scheduler's two sides live: `plug`, the module that provides its `PLUG` (`fleet.engine.schedulers`:
    the lifecycle around a run, on this machine); `jobs`, the module that provides its `JOBS` (`fleet.node.jobs`:
    how a node shows its jobs, which fleet never kills, whatever the run's scheduler); `via`, the word `--via`
    takes for its fan-out (the run through the scheduler itself, its `Plug.run_via`), when it has one; `variables`,
    the module that provides its `VARIABLES`, when it reads host variables of its own: a frozen dataclass whose
    fields, each annotated with a `fleet.inventory.host.Var`, an inventory writes under the scheduler's name
    (`slurm: {node: gpu01}`, as nornir keeps a plug's options under `connection_options[name]`), read back with
    `Host.variables_of`."""

    plug: str
    jobs: str
    via: str | None = None
    variables: str | None = None


# scheduler name -> its modules
SCHEDULERS: dict[str, Scheduled] = {
    "slurm": Scheduled(plug="fleet.slurm.plug", jobs="fleet.slurm.jobs", via="srun",
                       variables="fleet.slurm.variables"),
}
# transport name (a host's `connection:`) -> the module that provides its `TRANSPORT` (`fleet.transport.plugs`)
TRANSPORTS: dict[str, str] = {
    "ssh": "fleet.transport.ssh_plug",
    "local": "fleet.transport.local",
}


# `--via`'s word for fleet's own fan-out, over each host's transport
OWN_FAN_OUT = "ssh"


def fan_outs() -> dict[str, str]:
    """`--via`'s words: fleet's own fan-out (to None), and each scheduler's that can run the reset itself (to its
    name), in the registry's order."""
    return {OWN_FAN_OUT: "", **{row.via: name for name, row in SCHEDULERS.items() if row.via}}


def known(registry: Mapping[str, object], what: str, name: str) -> str:
    """`name`, when the registry has it; else ValueError naming what it knows."""
    if name not in registry:
        raise ValueError(f"no {what} {name!r} (known: {', '.join(sorted(registry))})")
    return name


def provided(module: str, attribute: str) -> object:
    """What a plug's module provides (its `PLUG`, `JOBS`, `VARIABLES` or `TRANSPORT`), the module imported on first
    use."""
    return getattr(import_module(module), attribute)
