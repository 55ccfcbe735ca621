"""The command line: typer wiring only, over the importable core (`fleet.run`, `fleet.graph`, `fleet.inventory`)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
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
from fleet.report.history import (
    UNFINISHED,
    History,
    history_path,
    newest_folders,
    remove_folders,
    stale_folders,
)
from fleet.report.history_view import (
    STATUS_ORDER,
    host_lines,
    log_lines,
    parse_since,
    prune_line,
    report_from_document,
    run_lines,
    tally,
    tally_line,
    unfinished_lines,
)
from fleet.report.logs import default_log_dir
from fleet.report.rerun import rerun_of
from fleet.reset.host import Mode
from fleet.run import run_and_report
from fleet.waves import parse_amount, parse_duration

app = typer.Typer(
    name="fleet",
    help="Make racks of GPU nodes clean again, many at once, and prove it.",
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish
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
MetricsFileOpt = Annotated[
    Path | None,
    typer.Option("--metrics-file", metavar="PATH", help="Write the run's Prometheus metrics there (atomically),"
                 " for node_exporter's textfile collector."),
]
LogDirOpt = Annotated[
    Path | None, typer.Option("--log-dir", metavar="DIR", help="Log folder (else $FLEET_LOG_DIR, else XDG state).")
]


EXIT_CODES = """\b
Exit status:
  0    every host clean (a dry run: every host planned)
  1    a host ended failed, unreachable or skipped; or --deadline passed
  2    usage or inventory error: one line naming the file and key, nothing touched
  130  interrupted (SIGINT/SIGTERM): in-flight commands ended, the report still written"""

RESET_EPILOG = f"""\b
Examples:
  fleet reset -i site.yaml -g blackwell --dry-run        what would happen, per host
  fleet reset -g rack-a -y --canary 1 --batch 25%        one node first, then quarter-rack waves
  fleet reset -g blackwell -y --deadline 10m -j 32       nightly: bounded in time and fan-out
  fleet reset --slurm --partition gpu -y                 drain in Slurm, wait for jobs, resume
  fleet reset -w gpu-c[01-64] --slurm --via srun -y      no inventory, no SSH: one srun step

{EXIT_CODES}"""

CHECK_EPILOG = f"""\b
Examples:
  fleet check -g blackwell                               exit 0 when every host is clean
  fleet check gpu-b[01-04] --json | jq '.hosts[] | select(.status != "clean")'

{EXIT_CODES}"""


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
    rerun: list[str] | None = None,
) -> Targets:
    outright = nodes is not None or partition is not None or rerun is not None
    inv = _inventory(inventory, required=not outright)
    slurm = slurm or (inv is not None and inv.scheduler == "slurm")
    if partition is not None and not slurm:
        raise UsageError("--partition needs --slurm (or `scheduler: slurm` in the inventory)")
    if not outright:
        assert inv is not None
        return Targets(select(inv, patterns=hosts or [], groups=group or [], limit=limit, exclude=exclude), inv, slurm)
    extra = named(nodes) if nodes is not None else list(rerun or [])
    if partition is not None:
        extra += _partition_hosts(partition, inv)
    chosen = select_with(inv, extra, patterns=hosts or [], groups=group or [], limit=limit, exclude=exclude,
                         origin="-w" if nodes is not None else "--rerun-failed" if rerun else "--partition")
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


def execute(targets: list[Host], options: RunOptions, *, as_json: bool, log_dir: Path | None,
            metrics_file: Path | None = None) -> int:
    """Run; then the metrics file (not for a dry run: it would replace the last real run's with `planned`)."""
    code, report = anyio.run(partial(run_and_report, targets, options, as_json=as_json, log_dir=log_dir))
    if metrics_file is not None and options.mode is not Mode.PLAN:
        from fleet.report.metrics import render_metrics, write_metrics

        try:
            write_metrics(metrics_file, render_metrics(report, exit_code=code, finished_at=time.time()))
        except OSError as exc:  # a metrics file never changes the run's outcome
            _err(f"fleet: warning: metrics not written to {metrics_file}: {exc.strerror or exc}")
    return code


@app.command(epilog=RESET_EPILOG)
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
    metrics_file: MetricsFileOpt = None,
    rerun_failed: Annotated[
        str | None,
        typer.Option("--rerun-failed", metavar="[RUN_ID|last]", help="Target exactly the hosts that did not end"
                     " clean in that reset (default: the last one that was not a dry run), with the inventory's"
                     " variables of today."),
    ] = None,
    keep_days: Annotated[
        int | None, typer.Option("--keep-days", min=1, metavar="N", help="After the run, remove the history's"
                                 " records and the log folders of runs that started more than N days ago.")
    ] = None,
    as_json: JsonOpt = False,
    log_dir: LogDirOpt = None,
) -> None:
    """Drain -> kill -> settle -> verify on every target."""
    if via not in ("ssh", "srun"):
        raise UsageError(f"--via takes ssh or srun, not {via!r}")
    rerun = _rerun_targets(rerun_failed, log_dir, hosts, group, nodes, partition) if rerun_failed else None
    chosen = _targets(hosts, inventory, group, limit, exclude, nodes=nodes, partition=partition,
                      slurm=slurm or via == "srun", rerun=rerun)
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
        progress=True,
        slurm=SlurmOptions(parse_duration(drain_wait, "--drain-wait", zero=True), via_srun=via == "srun")
        if chosen.slurm else None,
    )
    if via != "srun":  # with srun, no SSH: each node runs its own commands
        check_files(_provenance(chosen), chosen.hosts)  # a missing key or known_hosts: exit 2 before anything
    _confirm(chosen.hosts, yes, dry_run)
    code = execute(chosen.hosts, options, as_json=as_json, log_dir=log_dir, metrics_file=metrics_file)
    if keep_days is not None:  # the nightly run keeps its own history in bounds; this run itself is never old
        try:
            _prune(log_dir or default_log_dir(), keep_days, datetime.now(UTC))
        except (OSError, UsageError) as exc:  # retention never changes the run's outcome
            _err(f"fleet: warning: --keep-days: {exc}")
    raise typer.Exit(code)


def _rerun_targets(given: str, log_dir: Path | None, hosts: list[str] | None, group: list[str] | None,
                   nodes: str | None, partition: str | None) -> list[str]:
    """The hosts of a past reset (`last`: the newest not a dry run; or a run id) that did not end clean; exit 0
    when every one did, exit 2 for a dry run or a check (`fleet.report.rerun`)."""
    if hosts or group or nodes or partition:
        raise UsageError("--rerun-failed chooses the hosts: not with HOST, -g, -w or --partition (--limit and"
                         " --exclude still narrow it)")
    folder = log_dir or default_log_dir()
    with _reading(folder) as history:
        rerun = rerun_of(history, given, history_path(folder))
    if rerun.exit_code == 2:
        raise UsageError(rerun.line)
    _err(f"fleet: {rerun.line}")
    if rerun.exit_code is not None:
        raise typer.Exit(rerun.exit_code)
    return list(rerun.hosts)


def _provenance(chosen: Targets) -> Inventory:
    """Where the hosts' variables came from, for error messages: the inventory, else the built-in defaults."""
    return chosen.inventory or Inventory(path=Path("built-in defaults"), hosts={}, groups={})


@app.command(epilog=CHECK_EPILOG)
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
    metrics_file: MetricsFileOpt = None,
    log_dir: LogDirOpt = None,
) -> None:
    """Verify only, read-only; exit 0 when every host is clean. With Slurm, each node's state is reported."""
    chosen = _targets(hosts, inventory, group, limit, exclude, nodes=nodes, partition=partition, slurm=slurm)
    check_files(_provenance(chosen), chosen.hosts)  # a missing key or known_hosts: exit 2 before anything connects
    options = RunOptions(mode=Mode.CHECK, concurrency=concurrency, handle_signals=True, progress=True,
                         slurm=SlurmOptions() if chosen.slurm else None)
    raise typer.Exit(execute(chosen.hosts, options, as_json=as_json, log_dir=log_dir, metrics_file=metrics_file))


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
    limit: Annotated[int, typer.Option("-n", "--limit", min=1, metavar="N", help="At most N runs, newest first.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    log_dir: LogDirOpt = None,
    keep_days: Annotated[
        int | None, typer.Option("--keep-days", min=1, metavar="N", help="First remove the records and log folders"
                                 " of runs that started more than N days ago.")
    ] = None,
) -> None:
    """Recent runs from the history (<log-dir>/history.sqlite); with --host, one node's record across runs."""
    folder = log_dir or default_log_dir()
    now = datetime.now(UTC)
    cutoff = parse_since(since, now) if since else None
    if status is not None and status not in (*STATUS_ORDER, UNFINISHED):
        raise UsageError(f"--status takes {', '.join(STATUS_ORDER)} or {UNFINISHED}, not {status!r}")
    if host is not None and (group or status == UNFINISHED):
        raise UsageError("--host lists one host's outcomes: not with --group or --status unfinished")
    group_hosts = [h.name for h in _targets(None, inventory, group, None, None).hosts] if group else None
    pruned = _prune(folder, keep_days, now) if keep_days is not None else None
    with _reading(folder) as history:
        if host is not None:
            if history is None or not history.knows_host(host):
                raise UsageError(f"no run on record targeted {host} ({history_path(folder)})")
            rows = history.host_history(host, since=cutoff, status=status)
            summary = tally(host, rows)
            document: dict[str, Any] = {"history": str(history_path(folder)), "tally": summary,
                                        "runs": [r.document() for r in rows[:limit]]}
            lines = [*(host_lines(rows[:limit]) if rows else []), tally_line(summary)]
        else:
            found = history.runs(limit, group_hosts=group_hosts, status=status, since=cutoff) if history else []
            document = {"history": str(history_path(folder)), "runs": [r.document() for r in found]}
            lines = run_lines(found) if found else [f"no run on record in {history_path(folder)}"]
    if pruned is not None:
        document["pruned"] = pruned
    if as_json:
        sys.stdout.write(json.dumps(document, indent=1) + "\n")
    else:
        print("\n".join(lines))


@app.command()
def show(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID|last", help="A run id, or `last`.", show_default=False)],
    host: Annotated[
        str | None, typer.Option("--host", metavar="HOST", help="That host's log, a readable line per event (the"
                                 " raw JSONL with --json).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="summary.json as it is (with --host: the raw JSONL).")
    ] = False,
    log_dir: LogDirOpt = None,
) -> None:
    """A past run's report again (its summary.json), or one host's log of it."""
    folder = log_dir or default_log_dir()
    run_id = _run_id(folder, run_id)
    run_folder = folder / run_id
    if host is not None:
        log = run_folder / f"{_plain_name(host, '--host')}.jsonl"
        if not log.is_file():
            raise UsageError(f"run {run_id} has no log of host {host} ({log} does not exist)")
        text = log.read_text(encoding="utf-8", errors="replace")
        sys.stdout.write(text if as_json else "".join(f"{line}\n" for line in log_lines(text)))
        return
    summary = run_folder / "summary.json"
    if summary.is_file():
        text = summary.read_text(encoding="utf-8")
        if as_json:
            sys.stdout.write(text)
            return
        report = report_from_document(json.loads(text))
        print("\n".join([*reporting.plan_lines(report), *reporting.human_lines(report), f"logs: {run_folder}"]))
        return
    with _reading(folder) as history:
        record = history.get(run_id) if history else None
    if record is None:
        raise UsageError(f"run {run_id} has no summary.json and no record in {history_path(folder)}")
    if as_json:
        doc = {"run": record.run.document(), "hosts": {h.host: h.document() for h in record.hosts}}
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return
    print("\n".join([*unfinished_lines(record), f"logs: {run_folder}"]))


@contextmanager
def _reading(folder: Path) -> Iterator[History | None]:
    """The folder's history, or None when it has none (a read never creates one)."""
    path = history_path(folder)
    if not path.is_file():
        yield None
        return
    with History.open(path) as history:
        yield history


def _plain_name(value: str, what: str) -> str:
    """A run id or host name that names a file in a folder, never a path."""
    if not value or value in (".", "..") or "/" in value or "\0" in value:
        raise UsageError(f"{what}: {value!r} is no run id or host name")
    return value


def _run_id(folder: Path, given: str) -> str:
    """`last` (the newest run, on record or with a log folder), or a run id that exists in `folder`."""
    with _reading(folder) as history:
        if given == "last":
            candidates = [history.last_run_id() if history else None, *newest_folders(folder, 1)]
            found = max((c for c in candidates if c), default=None)
            if found is None:
                raise UsageError(f"no run on record in {folder}")
            return found
        _plain_name(given, "run id")
        if (folder / given).is_dir() or (history is not None and history.get(given) is not None):
            return given
    raise UsageError(f"no run {given} in {folder}")


def _prune(folder: Path, keep_days: int, now: datetime) -> dict[str, list[str]]:
    """`--keep-days`: the old records, then the old log folders (recorded or not); says what went."""
    with _reading(folder) as history:
        records = history.prune(keep_days, now) if history else []
    folders = remove_folders(folder, sorted(set(records) | set(stale_folders(folder, keep_days, now))))
    _err(prune_line(records, folders, keep_days))
    return {"records": records, "folders": folders}


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
    """Entry point: usage and inventory errors are one line on stderr and exit 2."""
    command = typer.main.get_command(app)
    try:
        args = optional_value(sys.argv[1:] if argv is None else argv, "--rerun-failed", "last")
        result = command.main(args=args, prog_name="fleet", standalone_mode=False)
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
