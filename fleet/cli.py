"""The command line: typer wiring only, over the importable core (`fleet.run`, `fleet.graph`, `fleet.inventory`)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import anyio
import typer

from fleet import __version__
from fleet.errors import UsageError
from fleet.graph import RunOptions, SlurmOptions
from fleet.inventory.files import check_files
from fleet.inventory.host import Host
from fleet.inventory.load import Inventory, host_vars, inventory_path, load_inventory
from fleet.inventory.targeting import named, select, select_with
from fleet.report import render as reporting
from fleet.reset.host import Mode
from fleet.run import run_and_report
from fleet.waves import parse_amount, parse_duration

app = typer.Typer(
    name="fleet",
    help="Make racks of GPU nodes clean again, many at once, and prove it.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

HostsArg = Annotated[
    list[str] | None, typer.Argument(help="Host names or node-set patterns.", show_default=False, metavar="HOST")
]
InventoryOpt = Annotated[
    str | None, typer.Option("-i", "--inventory", metavar="PATH", help="Inventory file (else $FLEET_INVENTORY).")
]
GroupOpt = Annotated[
    list[str] | None, typer.Option("-g", "--group", metavar="NAME", help="Target a group (repeatable, union).")
]
LimitOpt = Annotated[
    str | None, typer.Option("-l", "--limit", metavar="PATTERN", help="Intersect with these hosts/patterns.")
]
ExcludeOpt = Annotated[str | None, typer.Option("--exclude", metavar="PATTERN", help="Remove these hosts/patterns.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON document on stdout; humans read stderr.")]
ConcurrencyOpt = Annotated[
    int | None,
    typer.Option("-j", "--concurrency", min=1, metavar="N", help="At most N hosts with remote work in flight."),
]
NodesOpt = Annotated[
    str | None,
    typer.Option("-w", "--nodes", metavar="HOSTLIST",
                 help="Target these hosts (node sets: gpu-c[01-64]), listed in the inventory or not."),
]
SlurmOpt = Annotated[
    bool, typer.Option("--slurm", help="Drain in Slurm before, resume after (or `scheduler: slurm` in the inventory).")
]
PartitionOpt = Annotated[
    str | None, typer.Option("--partition", metavar="NAME", help="With --slurm: target the partition's nodes.")
]
LogDirOpt = Annotated[
    Path | None, typer.Option("--log-dir", metavar="DIR", help="Log folder (else $FLEET_LOG_DIR, else XDG state).")
]


def _version(value: bool) -> None:
    if value:
        print(f"fleet {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print fleet's version and exit."),
    ] = False,
) -> None:
    """Make racks of GPU nodes clean again, many at once, and prove it."""


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Targets:
    """What the command line chose: the hosts, the inventory they came from (if any), and whether Slurm is on."""

    hosts: list[Host]
    inventory: Inventory | None
    slurm: bool


def _targets(
    hosts: list[str] | None, inventory: str | None, group: list[str] | None, limit: str | None, exclude: str | None,
    *, nodes: str | None = None, partition: str | None = None, slurm: bool = False,
) -> Targets:
    outright = nodes is not None or partition is not None
    inv = _inventory(inventory, required=not outright)
    slurm = slurm or (inv is not None and inv.scheduler == "slurm")
    if partition is not None and not slurm:
        raise UsageError("--partition needs --slurm (or `scheduler: slurm` in the inventory)")
    if not outright:
        assert inv is not None
        return Targets(select(inv, patterns=hosts or [], groups=group or [], limit=limit, exclude=exclude), inv, slurm)
    extra = named(nodes) if nodes is not None else []
    if partition is not None:
        extra += _partition_hosts(partition, inv)
    chosen = select_with(inv, extra, patterns=hosts or [], groups=group or [], limit=limit, exclude=exclude,
                         origin="--partition" if nodes is None else "-w")
    return Targets(chosen, inv, slurm)


def _inventory(cli_value: str | None, *, required: bool) -> Inventory | None:
    if not required and cli_value is None and not os.environ.get("FLEET_INVENTORY", "").strip():
        return None
    return load_inventory(inventory_path(cli_value))


def _partition_hosts(partition: str, inv: Inventory | None) -> list[str]:
    """The host names of a Slurm partition's nodes: the inventory host whose slurm_node it is, else the node name."""
    from fleet.slurm.control import Slurm, SlurmError

    try:
        nodes = anyio.run(Slurm().partition, partition)
    except SlurmError as exc:
        raise UsageError(f"--partition {partition}: {exc}") from None
    by_node = {h.slurm_node or h.name: h.name for h in (inv.hosts.values() if inv else ())}
    return [by_node.get(node, node) for node in nodes]


def _confirm(targets: list[Host], yes: bool, dry_run: bool) -> None:
    if yes or dry_run or len(targets) <= 1:
        return
    names = reporting.fold([h.name for h in targets])
    if not sys.stdin.isatty():
        raise UsageError(f"refusing to reset {len(targets)} hosts ({names}) without -y: stdin is not a terminal")
    groups = sorted({g for h in targets for g in h.groups})
    prompt = f"Reset {len(targets)} hosts {names}" + (f" (groups: {', '.join(groups)})" if groups else "") + "?"
    sys.stderr.write(f"{prompt} [y/N] ")  # all of it on stderr: stdout stays for --json
    sys.stderr.flush()
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        _err("fleet: nothing done")
        raise typer.Exit(1)


def execute(targets: list[Host], options: RunOptions, *, as_json: bool, log_dir: Path | None) -> int:
    code, _ = anyio.run(partial(run_and_report, targets, options, as_json=as_json, log_dir=log_dir))
    return code


@app.command()
def reset(
    hosts: HostsArg = None,
    inventory: InventoryOpt = None,
    group: GroupOpt = None,
    limit: LimitOpt = None,
    exclude: ExcludeOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Touch nothing; print the plan per host.")] = False,
    yes: Annotated[bool, typer.Option("-y", "--yes", help="Do not ask before resetting several hosts.")] = False,
    concurrency: ConcurrencyOpt = None,
    batch: Annotated[
        str | None, typer.Option("--batch", metavar="N|P%", help="Rolling waves of N hosts or P% of them.")
    ] = None,
    max_fail: Annotated[
        str | None,
        typer.Option(
            "--max-fail",
            metavar="N|P%",
            help="Once more than N (or P%) hosts failed or are unreachable, start no more.",
        ),
    ] = None,
    canary: Annotated[
        int, typer.Option("--canary", min=0, metavar="N", help="Reset N hosts first; stop if any fails.")
    ] = 0,
    deadline: Annotated[
        str | None, typer.Option("--deadline", metavar="DURATION", help="Bound the whole run: 90s, 10m, 1h30m.")
    ] = None,
    stop_units: Annotated[
        bool,
        typer.Option("--stop-units", help="Stop the systemd unit of a holder that respawns after the kill."),
    ] = False,
    gpu_reset: Annotated[
        bool,
        typer.Option("--gpu-reset", help="Reset (nvidia-smi -r) GPUs whose memory never comes back, then verify."),
    ] = False,
    nodes: NodesOpt = None,
    slurm: SlurmOpt = False,
    drain_wait: Annotated[
        str, typer.Option("--drain-wait", metavar="DURATION", help="With Slurm: how long a node's jobs may take"
                          " to end before the host is skipped (0: do not wait).")
    ] = "10m",
    partition: PartitionOpt = None,
    via: Annotated[
        str, typer.Option("--via", metavar="ssh|srun", help="Fan out over SSH (default), or as one Slurm job step"
                          " in which every node resets itself.")
    ] = "ssh",
    as_json: JsonOpt = False,
    log_dir: LogDirOpt = None,
) -> None:
    """Drain -> kill -> settle -> verify on every target."""
    if via not in ("ssh", "srun"):
        raise UsageError(f"--via takes ssh or srun, not {via!r}")
    chosen = _targets(hosts, inventory, group, limit, exclude, nodes=nodes, partition=partition,
                      slurm=slurm or via == "srun")
    options = RunOptions(
        mode=Mode.PLAN if dry_run else Mode.RESET,
        concurrency=concurrency,
        handle_signals=True,
        batch=parse_amount(batch, "--batch") if batch else None,
        max_fail=parse_amount(max_fail, "--max-fail") if max_fail else None,
        canary=canary,
        deadline_s=parse_duration(deadline) if deadline else None,
        stop_units=stop_units,
        gpu_reset=gpu_reset,
        slurm=SlurmOptions(parse_duration(drain_wait, "--drain-wait", zero=True), via_srun=via == "srun")
        if chosen.slurm else None,
    )
    if via != "srun":  # with srun, no SSH: each node runs its own commands
        check_files(_provenance(chosen), chosen.hosts)  # a missing key or known_hosts: exit 2 before anything
    _confirm(chosen.hosts, yes, dry_run)
    raise typer.Exit(execute(chosen.hosts, options, as_json=as_json, log_dir=log_dir))


def _provenance(chosen: Targets) -> Inventory:
    """Where the hosts' variables came from, for error messages: the inventory, else the built-in defaults."""
    return chosen.inventory or Inventory(path=Path("built-in defaults"), hosts={}, groups={})


@app.command()
def check(
    hosts: HostsArg = None,
    inventory: InventoryOpt = None,
    group: GroupOpt = None,
    limit: LimitOpt = None,
    exclude: ExcludeOpt = None,
    as_json: JsonOpt = False,
    concurrency: ConcurrencyOpt = None,
    nodes: NodesOpt = None,
    slurm: SlurmOpt = False,
    partition: PartitionOpt = None,
    log_dir: LogDirOpt = None,
) -> None:
    """Verify only, read-only; exit 0 when every host is clean. With Slurm, each node's state is reported."""
    chosen = _targets(hosts, inventory, group, limit, exclude, nodes=nodes, partition=partition, slurm=slurm)
    check_files(_provenance(chosen), chosen.hosts)  # a missing key or known_hosts: exit 2 before anything connects
    options = RunOptions(mode=Mode.CHECK, concurrency=concurrency, handle_signals=True,
                         slurm=SlurmOptions() if chosen.slurm else None)
    raise typer.Exit(execute(chosen.hosts, options, as_json=as_json, log_dir=log_dir))


@app.command("inventory")
def inventory_cmd(
    hosts: HostsArg = None,
    inventory: InventoryOpt = None,
    group: GroupOpt = None,
    limit: LimitOpt = None,
    exclude: ExcludeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The resolved targets and their variables."""
    chosen = _targets(hosts, inventory, group, limit, exclude)
    inv, targets = chosen.inventory, chosen.hosts
    assert inv is not None
    if as_json:
        document: dict[str, Any] = {"inventory": str(inv.path), "hosts": {h.name: host_vars(h) for h in targets}}
        sys.stdout.write(reporting.render(document))
        return
    from fleet.report.tables import inventory_table

    inventory_table(targets)


@app.command()
def demo(
    nodes: Annotated[int, typer.Option("--nodes", min=1, max=64, metavar="N", help="How many simulated nodes.")] = 16,
    slurm: Annotated[bool, typer.Option("--slurm", help="With a real Slurm cluster over the simulated nodes"
                                        " (Debian's slurmctld, slurmd, munge; as root).")] = False,
    via: Annotated[str, typer.Option("--via", metavar="ssh|srun", help="With --slurm: SSH fan-out, or one srun"
                                     " step.")] = "ssh",
    as_json: JsonOpt = False,
    log_dir: LogDirOpt = None,
) -> None:
    """A simulated fleet on this machine (loopback SSH), reset end to end, then torn down."""
    from fleet.demo import run_demo

    if via not in ("ssh", "srun"):
        raise UsageError(f"--via takes ssh or srun, not {via!r}")
    raise typer.Exit(run_demo(nodes=nodes, as_json=as_json, log_dir=log_dir, slurm=slurm, via_srun=via == "srun"))


@app.command("node-run", hidden=True)
def node_run() -> None:
    """The node side of `--via srun` (run by srun, not by hand): reset this node, JSON lines on stdout."""
    from fleet.slurm.noderun import main as node_main

    raise typer.Exit(node_main())


def main(argv: list[str] | None = None) -> int:
    """Entry point: usage and inventory errors are one line on stderr and exit 2."""
    command = typer.main.get_command(app)
    try:
        result = command.main(args=argv, prog_name="fleet", standalone_mode=False)
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        _err("fleet: aborted")
        return 130
    except UsageError as exc:
        _err(f"fleet: error: {exc}")
        return 2
    except typer.TyperException as exc:  # typer's own usage errors (unknown option, bad value, ...)
        return _usage(exc)
    except KeyboardInterrupt:
        _err("fleet: interrupted")
        return 130
    return result if isinstance(result, int) else 0


def _usage(exc: typer.TyperException) -> int:
    if type(exc).__name__ == "NoArgsIsHelpError":
        _err(str(getattr(exc, "ctx", None) and exc.ctx.get_help()))  # type: ignore[attr-defined]
        return 2
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    _err(f"fleet: error: {' '.join(str(message).split())}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
