"""The command line's shared parts, declared once: the options several commands take (typer `Annotated` types)
and the help texts (examples, exit status) that `fleet.cli.commands` puts under its commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fleet.engine.schedulers import names
from fleet.model.errors import UsageError

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
ExcludeOpt = Annotated[
    str | None, typer.Option("-x", "--exclude", metavar="PATTERN", help="Remove these hosts/patterns (pdsh's and"
                             " clush's -x).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON document on stdout; humans read stderr.")]
MissingOkOpt = Annotated[
    bool, typer.Option("--missing-ok", help="A node set may name hosts the inventory lacks: target only those it"
                       " lists (said in one line). Without it, such a node set is exit 2 naming them.")
]
ConcurrencyOpt = Annotated[
    int | None,
    typer.Option("-j", "-f", "--concurrency", min=1, metavar="N", help="At most N hosts with remote work in flight"
                 " (default: every host at once; -f: pdsh's and clush's fan-out)."),
]
NodesOpt = Annotated[
    str | None,
    typer.Option("-w", "--nodes", metavar="HOSTLIST",
                 help="Target these hosts (node sets: gpu-c[01-64]), listed in the inventory or not."),
]
SlurmOpt = Annotated[
    bool, typer.Option("--slurm", help="Drain in Slurm before, resume after (or `scheduler: slurm` in the inventory)."
                       " Same as --scheduler slurm.")
]
SchedulerOpt = Annotated[
    str | None,
    typer.Option("--scheduler", metavar="NAME", help="Take the nodes out of the named workload manager's service"
                 f" before, give them back after (or `scheduler:` in the inventory). One of: {', '.join(names())}."),
]
PartitionOpt = Annotated[
    str | None, typer.Option("--partition", metavar="NAME", help="With --slurm: target the partition's nodes.")
]
MetricsFileOpt = Annotated[
    Path | None,
    typer.Option("--metrics-file", metavar="PATH", help="Write the run's Prometheus metrics there (atomically),"
                 " for node_exporter's textfile collector."),
]
UniformOpt = Annotated[
    bool, typer.Option("--uniform", help="Fail the hosts whose GPU settings (driver, VBIOS, model, GPU count, power"
                       " limit, clocks, MIG, ECC) differ from the run's other hosts' (reason not_uniform).")
]
LogDirOpt = Annotated[
    Path | None, typer.Option("--log-dir", metavar="DIR", help="Log folder (else $FLEET_LOG_DIR, else XDG state).")
]


EXIT_CODES = """\b
Exit status:
  0    every host clean (a dry run: every host planned)
  1    a host ended failed, unreachable or skipped; or --deadline passed
  2    usage or inventory error: one line naming the file and key, nothing touched
  129  the terminal hung up (SIGHUP): as 130; run long resets under systemd-run or tmux
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


def check_via(via: str) -> None:
    """`--via` takes ssh or srun (`fleet reset`, `fleet demo`)."""
    if via not in ("ssh", "srun"):
        raise UsageError(f"--via takes ssh or srun, not {via!r}")
StopUnitsOpt = Annotated[
    bool, typer.Option("--stop-units", help="Stop the systemd unit of a holder that respawns after the kill.")
]
GpuResetOpt = Annotated[
    bool, typer.Option("--gpu-reset", help="Reset (nvidia-smi -r) GPUs whose memory never comes back, then verify.")
]
RestoreSettingsOpt = Annotated[
    bool,
    typer.Option("--restore-settings", help="After the kill, restore each GPU's gpu_settings profile (clocks, power"
                 " limit, compute mode, persistence; MIG and ECC with --gpu-reset); a dry run lists it."),
]

# `fleet show`
ShowRunArg = Annotated[str, typer.Argument(metavar="RUN_ID|last", help="A run id, or `last` (the default).",
                                           show_default=False)]
ShowHostOpt = Annotated[
    str | None, typer.Option("--host", metavar="HOST", help="That host's log, a readable line per event (with"
                             " --json: one JSON list of its events).")
]
ShowJsonOpt = Annotated[
    bool, typer.Option("--json", help="One JSON document: summary.json as it is (with --host: the host's events as a"
                       " list).")
]
ShowHtmlOpt = Annotated[
    bool, typer.Option("--html", help="The path of the run's report.html (written first for a run that has none: from"
                       " its summary.json, else from its history).")
]
