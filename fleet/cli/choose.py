"""Which hosts a command works on: HOST patterns, `-g`, `--limit` and `--exclude` over the inventory, or hosts
named outright (`-w HOSTLIST`, a Slurm `--partition`'s nodes, a past run's `--rerun-failed` hosts) with or without
one; and the scheduler around the run (`--slurm`, or the inventory's `scheduler:`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import anyio

from fleet.inventory.host import Host
from fleet.inventory.load import Inventory, inventory_path, load_inventory
from fleet.inventory.targeting import named, select, select_with
from fleet.model.errors import UsageError


@dataclass(frozen=True)
class Targets:
    """What the command line chose: the hosts, the inventory they came from (if any), and the scheduler around the
    run (`fleet.engine.schedulers`: `--slurm`, or the inventory's `scheduler:`), None without one."""

    hosts: list[Host]
    inventory: Inventory | None
    scheduler: str | None


def choose_targets(
    hosts: list[str] | None, inventory: str | None, group: list[str] | None, limit: str | None, exclude: str | None,
    *, nodes: str | None = None, partition: str | None = None, slurm: bool = False,
    rerun: list[str] | None = None,
) -> Targets:
    outright = nodes is not None or partition is not None or rerun is not None
    inv = chosen_inventory(inventory, required=not outright)
    scheduler = "slurm" if slurm else inv.scheduler if inv is not None else None
    if partition is not None and scheduler != "slurm":
        raise UsageError("--partition needs --slurm (or `scheduler: slurm` in the inventory)")
    if not outright:
        assert inv is not None
        return Targets(select(inv, patterns=hosts or [], groups=group or [], limit=limit, exclude=exclude), inv,
                       scheduler)
    extra = named(nodes) if nodes is not None else list(rerun or [])
    if partition is not None:
        extra += partition_hosts(partition, inv)
    chosen = select_with(inv, extra, patterns=hosts or [], groups=group or [], limit=limit, exclude=exclude,
                         origin="-w" if nodes is not None else "--rerun-failed" if rerun else "--partition")
    return Targets(chosen, inv, scheduler)


def chosen_inventory(cli_value: str | None, *, required: bool) -> Inventory | None:
    if not required and cli_value is None and not os.environ.get("FLEET_INVENTORY", "").strip():
        return None
    return load_inventory(inventory_path(cli_value))


def partition_hosts(partition: str, inv: Inventory | None) -> list[str]:
    """The host names of a Slurm partition's nodes: the inventory host whose slurm_node it is, else the node name."""
    from fleet.slurm.control import Slurm, SlurmError

    try:
        nodes = anyio.run(Slurm().partition, partition)
    except SlurmError as exc:
        raise UsageError(f"--partition {partition}: {exc}") from None
    by_node = {h.slurm_node or h.name: h.name for h in (inv.hosts.values() if inv else ())}
    return [by_node.get(node, node) for node in nodes]


def provenance(chosen: Targets) -> Inventory:
    """Where the hosts' variables came from, for error messages: the inventory, else the built-in defaults."""
    return chosen.inventory or Inventory(path=Path("built-in defaults"), hosts={}, groups={})
