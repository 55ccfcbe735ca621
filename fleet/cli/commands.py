"""The command line: typer wiring only, over the importable core (`fleet.engine`, `fleet.inventory`)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from fleet.app.run import execute
from fleet.cli.choose import choose_targets, provenance
from fleet.cli.options import (
    CHECK_EPILOG,
    RESET_EPILOG,
    BatchOpt,
    CanaryOpt,
    CheckConcurrencyOpt,
    CheckSchedulerOpt,
    CheckSlurmOpt,
    CheckUniformOpt,
    ConcurrencyOpt,
    DeadlineOpt,
    DrainWaitOpt,
    DryRunOpt,
    ExcludeOpt,
    FleetCommand,
    GpuResetOpt,
    GroupOpt,
    HostsArg,
    InventoryOpt,
    JsonOpt,
    KeepDaysOpt,
    LimitOpt,
    LogDirOpt,
    MaxFailOpt,
    MetricsFileOpt,
    MissingOkOpt,
    NodesOpt,
    PartitionOpt,
    QuietOpt,
    RerunFailedOpt,
    RestoreSettingsOpt,
    RunsCountOpt,
    RunsLimitOpt,
    SchedulerOpt,
    SectionedCommand,
    ShowHostOpt,
    ShowHtmlOpt,
    ShowJsonOpt,
    ShowRunArg,
    SlurmOpt,
    StopUnitsOpt,
    UniformOpt,
    VerboseOpt,
    ViaOpt,
    YesOpt,
    via_scheduler,
)
from fleet.engine.interrupts import HANGUP_LINE, HungUp, hangups_unwind
from fleet.engine.options import RunOptions, SchedulerOptions
from fleet.engine.walk import Mode
from fleet.engine.waves import parse_amount, parse_duration
from fleet.history import UNFINISHED, history_path
from fleet.history.archive import listing, prune, reading, show_run, show_run_html
from fleet.history.rerun import rerun_of
from fleet.history.view import STATUS_ORDER
from fleet.inventory.files import check_files
from fleet.inventory.host import Host
from fleet.inventory.load import host_vars
from fleet.inventory.nodesets import fold
from fleet.model.errors import UsageError
from fleet.report import render as reporting
from fleet.runlog.folder import default_log_dir
from fleet.terminal import say as _err
from fleet.terminal import write
from fleet.version import __version__

app = typer.Typer(
    name="fleet",
    help="Make racks of GPU nodes clean again, many at once, and prove it.",
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

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


def _confirm(targets: list[Host], yes: bool, dry_run: bool) -> None:
    if yes or dry_run or len(targets) <= 1:
        return
    names = fold([h.name for h in targets])
    if not sys.stdin.isatty():
        raise UsageError(f"refusing to reset {len(targets)} hosts ({names}) without -y: stdin is not a terminal")
    groups = sorted({g for h in targets for g in h.groups})
    prompt = f"Reset {len(targets)} hosts {names}" + (f" (groups: {', '.join(groups)})" if groups else "") + "?"
    sys.stderr.write(f"{prompt} [y/N] ")  # all of it on stderr: stdout stays for --json
    sys.stderr.flush()
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        _err("fleet: nothing done")
        raise typer.Exit(1)


@app.command(epilog=RESET_EPILOG, cls=SectionedCommand)
def reset(
    hosts: HostsArg = None,
    inventory: InventoryOpt = None,
    group: GroupOpt = None,
    limit: LimitOpt = None,
    exclude: ExcludeOpt = None,
    dry_run: DryRunOpt = False,
    yes: YesOpt = False,
    concurrency: ConcurrencyOpt = None,
    batch: BatchOpt = None,
    max_fail: MaxFailOpt = None,
    canary: CanaryOpt = 0,
    deadline: DeadlineOpt = None,
    stop_units: StopUnitsOpt = False,
    gpu_reset: GpuResetOpt = False,
    restore_settings: RestoreSettingsOpt = False,
    nodes: NodesOpt = None,
    missing_ok: MissingOkOpt = False,
    scheduler: SchedulerOpt = None,
    slurm: SlurmOpt = False,
    drain_wait: DrainWaitOpt = "10m",
    partition: PartitionOpt = None,
    via: ViaOpt = "ssh",
    uniform: UniformOpt = False,
    rerun_failed: RerunFailedOpt = None,
    as_json: JsonOpt = False,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    metrics_file: MetricsFileOpt = None,
    log_dir: LogDirOpt = None,
    keep_days: KeepDaysOpt = None,
) -> None:
    """Drain -> kill -> settle -> verify on every target."""
    if verbose and quiet:
        raise UsageError("-v/--verbose and -q/--quiet: one or the other")
    fan_out = via_scheduler(via)
    if fan_out is not None and scheduler not in (None, fan_out):
        raise UsageError(f"--via {via} is {fan_out}'s: not with --scheduler {scheduler}")
    rerun = _rerun_targets(rerun_failed, log_dir, hosts, group, nodes, partition) if rerun_failed else None
    chosen = choose_targets(hosts, inventory, group, limit, exclude, nodes=nodes, partition=partition,
                            slurm=slurm, scheduler=scheduler or fan_out, rerun=rerun, missing_ok=missing_ok)
    options = RunOptions(
        mode=Mode.PLAN if dry_run else Mode.RESET, concurrency=concurrency,
        batch=parse_amount(batch, "--batch") if batch else None,
        max_fail=parse_amount(max_fail, "--max-fail") if max_fail else None,
        canary=canary,
        deadline_s=parse_duration(deadline) if deadline else None,
        stop_units=stop_units, gpu_reset=gpu_reset, restore_settings=restore_settings, uniform=uniform,
        scheduler=SchedulerOptions(name=chosen.scheduler, fan_out=fan_out is not None,
                                   drain_wait_s=parse_duration(drain_wait, "--drain-wait", zero=True))
        if chosen.scheduler else None,
    )
    if fan_out is None:  # through the scheduler, no SSH: each node runs its own commands
        check_files(provenance(chosen), chosen.hosts)  # a missing key or known_hosts: exit 2 before anything
    _confirm(chosen.hosts, yes, dry_run)
    code = execute(chosen.hosts, options, as_json=as_json, log_dir=log_dir, metrics_file=metrics_file,
                   per_host=True if verbose else False if quiet else None)
    if keep_days is not None:  # the nightly run keeps its own history in bounds; this run itself is never old
        try:
            prune(log_dir or default_log_dir(), keep_days, datetime.now(UTC))
        except (OSError, UsageError) as exc:  # retention never changes the run's outcome
            _err(f"fleet: warning: --keep-days: {exc}")
    raise typer.Exit(code)


def _rerun_targets(given: str, log_dir: Path | None, hosts: list[str] | None, group: list[str] | None,
                   nodes: str | None, partition: str | None) -> list[str]:
    """The hosts of a past reset (`last`: the newest not a dry run; or a run id) that did not end clean; exit 0
    when every one did, exit 2 for a dry run or a check (`fleet.history.rerun`)."""
    if hosts or group or nodes or partition:
        raise UsageError("--rerun-failed chooses the hosts: not with HOST, -g, -w or --partition (--limit and"
                         " --exclude still narrow it)")
    folder = log_dir or default_log_dir()
    with reading(folder) as history:
        rerun = rerun_of(history, given, history_path(folder))
    if rerun.exit_code == 2:
        raise UsageError(rerun.line)
    _err(f"fleet: {rerun.line}")
    if rerun.exit_code is not None:
        raise typer.Exit(rerun.exit_code)
    return list(rerun.hosts)


@app.command(epilog=CHECK_EPILOG, cls=SectionedCommand)
def check(
    hosts: HostsArg = None,
    inventory: InventoryOpt = None,
    group: GroupOpt = None,
    limit: LimitOpt = None,
    exclude: ExcludeOpt = None,
    as_json: JsonOpt = False,
    concurrency: CheckConcurrencyOpt = None,
    nodes: NodesOpt = None,
    missing_ok: MissingOkOpt = False,
    scheduler: CheckSchedulerOpt = None,
    slurm: CheckSlurmOpt = False,
    partition: PartitionOpt = None,
    metrics_file: MetricsFileOpt = None,
    uniform: CheckUniformOpt = False,
    log_dir: LogDirOpt = None,
) -> None:
    """Verify only, read-only; exit 0 when every host is clean. With Slurm, each node's state is reported."""
    chosen = choose_targets(hosts, inventory, group, limit, exclude, nodes=nodes, partition=partition, slurm=slurm,
                            scheduler=scheduler, missing_ok=missing_ok)
    check_files(provenance(chosen), chosen.hosts)  # a missing key or known_hosts: exit 2 before anything
    options = RunOptions(mode=Mode.CHECK, concurrency=concurrency, uniform=uniform,
                         scheduler=SchedulerOptions(name=chosen.scheduler) if chosen.scheduler else None)
    raise typer.Exit(execute(chosen.hosts, options, as_json=as_json, log_dir=log_dir, metrics_file=metrics_file))


@app.command("inventory", cls=SectionedCommand)
def inventory_cmd(
    hosts: HostsArg = None,
    inventory: InventoryOpt = None,
    group: GroupOpt = None,
    limit: LimitOpt = None,
    exclude: ExcludeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The resolved targets and their variables."""
    chosen = choose_targets(hosts, inventory, group, limit, exclude)
    inv, targets = chosen.inventory, chosen.hosts
    assert inv is not None
    if as_json:
        document: dict[str, Any] = {"inventory": str(inv.path), "hosts": {h.name: host_vars(h) for h in targets}}
        write(sys.stdout, reporting.render(document))
        return
    from fleet.report.tables import inventory_table

    inventory_table(targets)


@app.command(cls=FleetCommand)
def runs(
    host: Annotated[
        str | None, typer.Option("--host", metavar="HOST", help="That host's outcome in each run, and a tally.")
    ] = None,
    inventory: InventoryOpt = None,
    group: Annotated[
        list[str] | None, typer.Option("-g", "--group", metavar="NAME", help="Runs that targeted a host of this"
                                       " inventory group (repeatable).")
    ] = None,
    status: Annotated[
        str | None, typer.Option("--status", metavar="STATUS", help="Runs in which a host (--host: that host) ended"
                                 " so: clean, failed, unreachable, skipped, planned; or unfinished (no end on record).")
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", metavar="WHEN", help="Runs started since: 7d, 24h, 90m, 2026-12-01.")
    ] = None,
    limit: RunsCountOpt = 20,  # -n/--count; `_count_from_limit` sets it by this name for the old --limit
    old_limit: RunsLimitOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    log_dir: LogDirOpt = None,
    keep_days: Annotated[
        int | None, typer.Option("--keep-days", min=1, metavar="N", help="First remove the records and log folders"
                                 " of runs that started more than N days ago.")
    ] = None,
) -> None:
    """Recent runs from the history (<log-dir>/history.sqlite); with --host, one node's record across runs."""
    if status is not None and status not in (*STATUS_ORDER, UNFINISHED):
        raise UsageError(f"--status takes {', '.join(STATUS_ORDER)} or {UNFINISHED}, not {status!r}")
    if host is not None and (group or status == UNFINISHED):
        raise UsageError("--host lists one host's outcomes: not with --group or --status unfinished")
    group_hosts = [h.name for h in choose_targets(None, inventory, group, None, None).hosts] if group else None
    document, lines = listing(log_dir or default_log_dir(), host=host, group_hosts=group_hosts, status=status,
                              since=since, limit=limit, keep_days=keep_days)
    if as_json:
        write(sys.stdout, json.dumps(document, indent=1) + "\n")
    else:
        write(sys.stdout, "\n".join(lines) + "\n")


@app.command(cls=FleetCommand)
def show(run_id: ShowRunArg = "last", host: ShowHostOpt = None, as_json: ShowJsonOpt = False,
         log_dir: LogDirOpt = None, as_html: ShowHtmlOpt = False) -> None:
    """A past run's report again (its summary.json), or one host's log of it. Exits with the run's own status (a
    host's log: 0)."""
    if as_html:
        if host is not None or as_json:
            raise UsageError("--html prints the path of the run's report.html: not with --host or --json")
        write(sys.stdout, show_run_html(log_dir or default_log_dir(), run_id))
        return
    text, code = show_run(log_dir or default_log_dir(), run_id, host=host, as_json=as_json)
    write(sys.stdout, text)
    raise typer.Exit(code)


@app.command(cls=FleetCommand)
def demo(
    nodes: Annotated[int, typer.Option("--nodes", min=1, max=64, metavar="N", help="How many simulated nodes (1 to"
                                       " 64).")] = 16,
    slurm: Annotated[bool, typer.Option("--slurm", help="With a real Slurm cluster over the simulated nodes"
                                        " (Debian's slurmctld, slurmd, munge; as root).")] = False,
    via: Annotated[str, typer.Option("--via", metavar="ssh|srun", help="With --slurm: SSH fan-out, or one srun"
                                     " step.")] = "ssh",
    as_json: JsonOpt = False,
    log_dir: LogDirOpt = None,
) -> None:
    """A simulated fleet on this machine (loopback SSH), reset end to end, then torn down."""
    from fleet.cli.demo import run_demo

    if via_scheduler(via) not in (None, "slurm"):
        raise UsageError(f"fleet demo --via takes ssh or srun, not {via!r}")
    raise typer.Exit(run_demo(nodes=nodes, as_json=as_json, log_dir=log_dir, slurm=slurm, via_srun=via == "srun"))


@app.command("node-run", hidden=True)
def node_run() -> None:
    """The node side of `--via srun` (run by srun, not by hand): reset this node, JSON lines on stdout."""
    from fleet.slurm.noderun import main as node_main

    raise typer.Exit(node_main())


def optional_value(argv: list[str], option: str, default: str) -> list[str]:
    """`--rerun-failed` alone (last, or followed by another option) means `--rerun-failed last`: click options
    take a value or none, not either."""
    out = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg == "--":
            out.extend(argv[i + 1:])
            break
        if arg == option and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            out.append(default)
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point: usage and inventory errors are one line on stderr and exit 2; Ctrl-C outside a run 130, a
    hang-up 129 (`fleet.engine.interrupts`)."""
    with hangups_unwind():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    command = typer.main.get_command(app)
    try:
        args = optional_value(sys.argv[1:] if argv is None else argv, "--rerun-failed", "last")
        result = command.main(args=args, prog_name="fleet", standalone_mode=False)
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort as exc:  # click's answer to a KeyboardInterrupt, HungUp included
        if isinstance(exc.__cause__, HungUp):
            return _hung_up()
        _err("fleet: aborted")
        return reporting.INTERRUPTED
    except UsageError as exc:
        _err(f"fleet: error: {exc}")
        return 2
    except typer.TyperException as exc:  # typer's own usage errors (unknown option, bad value, ...)
        return _usage(exc)
    except HungUp:
        return _hung_up()
    except KeyboardInterrupt:
        _err("fleet: interrupted")
        return reporting.INTERRUPTED
    return result if isinstance(result, int) else 0


def _hung_up() -> int:
    _err(HANGUP_LINE)
    return reporting.HUNG_UP


def _usage(exc: typer.TyperException) -> int:
    if type(exc).__name__ == "NoArgsIsHelpError":
        _err(str(getattr(exc, "ctx", None) and exc.ctx.get_help()))  # type: ignore[attr-defined]
        return 2
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    _err(f"fleet: error: {' '.join(str(message).split())}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
