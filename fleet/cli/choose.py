"""Which hosts a command works on: HOST patterns, `-g`, `--limit` and `--exclude` over the inventory, or hosts
named outright (`-w HOSTLIST`, a scheduler's `--partition`'s nodes, a past run's `--rerun-failed` hosts) with or
without one; and the scheduler around the run (`--scheduler NAME`, its alias `--slurm`, or the inventory's
`scheduler:`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fleet.engine import schedulers
from fleet.inventory.host import Host
from fleet.inventory.load import Inventory, inventory_source, load_inventory
from fleet.inventory.nodesets import fold
from fleet.inventory.targeting import named, select, select_with, unlisted
from fleet.model.errors import UsageError
from fleet.terminal import say


@dataclass(frozen=True)
class Targets:
    """What the command line chose: the hosts, the inventory they came from (if any), and the scheduler around the
    run (`fleet.engine.schedulers`: `--scheduler`, `--slurm`, or the inventory's `scheduler:`), None without one."""

    hosts: list[Host]
    inventory: Inventory | None
    scheduler: str | None


def choose_targets(
    hosts: list[str] | None, inventory: str | None, group: list[str] | None, limit: str | None, exclude: str | None,
    *, nodes: str | None = None, partition: str | None = None, slurm: bool = False, scheduler: str | None = None,
    rerun: list[str] | None = None, missing_ok: bool = False,
) -> Targets:
    outright = nodes is not None or partition is not None or rerun is not None
    inv = chosen_inventory(inventory, required=not outright)
    scheduler = chosen_scheduler(scheduler, slurm) or (inv.scheduler if inv is not None else None)
    if partition is not None and (scheduler is None or schedulers.plug(scheduler).targets is None):
        raise UsageError("--partition needs --slurm (or `scheduler: slurm` in the inventory)")
    if not outright:
        assert inv is not None
        targets = Targets(select(inv, patterns=hosts or [], groups=group or [], limit=limit, exclude=exclude,
                                 missing_ok=missing_ok), inv, scheduler)
        if missing_ok and (left := unlisted(inv, hosts or [])):
            say(f"fleet: left out {fold(left)}: not in {inv.named} (--missing-ok)")
        return targets
    extra = named(nodes) if nodes is not None else list(rerun or [])
    if partition is not None:
        assert scheduler is not None
        extra += partition_hosts(scheduler, partition, inv)
    chosen = select_with(inv, extra, patterns=hosts or [], groups=group or [], limit=limit, exclude=exclude,
                         origin="-w" if nodes is not None else "--rerun-failed" if rerun else "--partition",
                         missing_ok=missing_ok)
    return Targets(chosen, inv, scheduler)


def chosen_inventory(cli_value: str | None, *, required: bool) -> Inventory | None:
    """The inventory `-i` or `$FLEET_INVENTORY` names (None when neither does and none is required); what it
    writes in an old spelling is said on stderr, a line each."""
    if not required and cli_value is None and not os.environ.get("FLEET_INVENTORY", "").strip():
        return None
    inventory = load_inventory(*inventory_source(cli_value))
    for note in inventory.notes:
        say(f"fleet: warning: {note}")
    return inventory


def chosen_scheduler(name: str | None, slurm: bool) -> str | None:
    """The scheduler the command line names: `--scheduler NAME` (one the registry knows), `--slurm` its alias for
    `--scheduler slurm`; None when it names none."""
    if name is not None and name not in schedulers.names():
        raise UsageError(f"--scheduler: no scheduler {name!r} (known: {', '.join(schedulers.names())})")
    if slurm and name not in (None, "slurm"):
        raise UsageError(f"--slurm is --scheduler slurm: not with --scheduler {name}")
    return "slurm" if slurm else name


def partition_hosts(scheduler: str, partition: str, inv: Inventory | None) -> list[str]:
    """The host names of a scheduler's partition's nodes (`Plug.targets`; Slurm's: the inventory host whose
    `slurm.node` it is, else the node name)."""
    targets = schedulers.plug(scheduler).targets
    assert targets is not None
    return targets(partition, inv)


def provenance(chosen: Targets) -> Inventory:
    """Where the hosts' variables came from, for error messages: the inventory, else the built-in defaults."""
    return chosen.inventory or Inventory(path=Path("built-in defaults"), hosts={}, groups={})
