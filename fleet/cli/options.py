"""The command line's shared parts, declared once: the options several commands take (typer `Annotated` types),
the help texts (examples, exit status) that `fleet.cli.commands` puts under its commands, and the plain-text
`--help` every command prints (`FleetCommand`, `SectionedCommand`): options in sections by purpose, metavars in
words, at any width and piped alike."""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path
from typing import Annotated, ClassVar

import typer
from typer._click import Context, HelpFormatter, Parameter  # typer 0.29+ vendors click as typer._click
from typer.core import TyperCommand, TyperOption

from fleet.engine.schedulers import names
from fleet.model.errors import UsageError
from fleet.model.plugs import fan_outs
from fleet.terminal import say

# `--help`'s sections (typer's `rich_help_panel`, printed by SectionedCommand), in this order.
TARGETING, RUN_CONTROL, SAFETY, SCHEDULER, OUTPUT = (
    "Targeting", "Run control", "Safety and remedies", "Slurm and scheduler", "Output")
PANELS = (TARGETING, RUN_CONTROL, SAFETY, SCHEDULER, OUTPUT)

HostsArg = Annotated[
    list[str] | None, typer.Argument(help="Host names or node-set patterns.", show_default=False, metavar="HOST",
                                     rich_help_panel=TARGETING)
]
InventoryOpt = Annotated[
    str | None, typer.Option("-i", "--inventory", metavar="PATH", help="Inventory file (else $FLEET_INVENTORY).",
                             rich_help_panel=TARGETING)
]
GroupOpt = Annotated[
    list[str] | None, typer.Option("-g", "--group", metavar="NAME", help="Target a group (repeatable, union).",
                                   rich_help_panel=TARGETING)
]
LimitOpt = Annotated[
    str | None, typer.Option("-l", "--limit", metavar="PATTERN", help="Intersect with these hosts/patterns.",
                             rich_help_panel=TARGETING)
]
ExcludeOpt = Annotated[
    str | None, typer.Option("-x", "--exclude", metavar="PATTERN", help="Remove these hosts/patterns (pdsh's and"
                             " clush's -x).", rich_help_panel=TARGETING)
]
NodesOpt = Annotated[
    str | None,
    typer.Option("-w", "--nodes", metavar="HOSTLIST", rich_help_panel=TARGETING,
                 help="Target these hosts (node sets: gpu-c[01-64]), listed in the inventory or not."),
]
MissingOkOpt = Annotated[
    bool, typer.Option("--missing-ok", help="A node set may name hosts the inventory lacks: target only those it"
                       " lists (said in one line). Without it, such a node set is exit 2 naming them.",
                       rich_help_panel=TARGETING)
]
PartitionOpt = Annotated[
    str | None, typer.Option("--partition", metavar="NAME", help="With --slurm: target the partition's nodes.",
                             rich_help_panel=TARGETING)
]
RerunFailedOpt = Annotated[
    str | None,
    typer.Option("--rerun-failed", metavar="[RUN_ID|last]", rich_help_panel=TARGETING, help="Target exactly the"
                 " hosts that did not end clean in that reset (default: the last one that was not a dry run), with"
                 " the inventory's variables of today."),
]

ConcurrencyOpt = Annotated[
    int | None,
    typer.Option("-j", "-f", "--concurrency", min=1, metavar="N", rich_help_panel=RUN_CONTROL, help="At most N hosts"
                 " with remote work in flight (default: every host at once; -f: pdsh's and clush's fan-out)."),
]
DryRunOpt = Annotated[
    bool, typer.Option("--dry-run", help="Touch nothing; print the plan per host.", rich_help_panel=RUN_CONTROL)
]
YesOpt = Annotated[
    bool, typer.Option("-y", "--yes", help="Do not ask before resetting several hosts.", rich_help_panel=RUN_CONTROL)
]
BatchOpt = Annotated[
    str | None, typer.Option("--batch", metavar="N|P%", rich_help_panel=RUN_CONTROL,
                             help="Rolling waves of N hosts or P% of them (default: one wave).")
]
MaxFailOpt = Annotated[
    str | None, typer.Option("--max-fail", metavar="N|P%", rich_help_panel=RUN_CONTROL,
                             help="Once more than N (or P%) hosts failed or are unreachable, start no more.")
]
CanaryOpt = Annotated[
    int, typer.Option("--canary", min=0, metavar="N", rich_help_panel=RUN_CONTROL,
                      help="Reset N hosts first; stop if any fails.")
]
DeadlineOpt = Annotated[
    str | None, typer.Option("--deadline", metavar="DURATION", rich_help_panel=RUN_CONTROL,
                             help="Bound the whole run: 90s, 10m, 1h30m.")
]

StopUnitsOpt = Annotated[
    bool, typer.Option("--stop-units", help="Stop the systemd unit of a holder that respawns after the kill.",
                       rich_help_panel=SAFETY)
]
GpuResetOpt = Annotated[
    bool, typer.Option("--gpu-reset", help="Reset (nvidia-smi -r) GPUs whose memory never comes back, then verify.",
                       rich_help_panel=SAFETY)
]
RestoreSettingsOpt = Annotated[
    bool,
    typer.Option("--restore-settings", rich_help_panel=SAFETY, help="After the kill, restore each GPU's gpu_settings"
                 " profile (clocks, power limit, compute mode, persistence; MIG and ECC with --gpu-reset); a dry run"
                 " lists it."),
]
UNIFORM_HELP = ("Fail the hosts whose GPU settings (driver, VBIOS, model, GPU count, power limit, clocks, MIG, ECC)"
                " differ from the run's other hosts' (reason not_uniform).")
UniformOpt = Annotated[bool, typer.Option("--uniform", help=UNIFORM_HELP, rich_help_panel=SAFETY)]

SchedulerOpt = Annotated[
    str | None,
    typer.Option("--scheduler", metavar="NAME", rich_help_panel=SCHEDULER, help="Take the nodes out of the named"
                 " workload manager's service before, give them back after (or `scheduler:` in the inventory). One"
                 f" of: {', '.join(names())}."),
]
SlurmOpt = Annotated[
    bool, typer.Option("--slurm", help="Drain in Slurm before, resume after (or `scheduler: slurm` in the inventory)."
                       " Same as --scheduler slurm.", rich_help_panel=SCHEDULER)
]
DrainWaitOpt = Annotated[
    str, typer.Option("--drain-wait", metavar="DURATION", rich_help_panel=SCHEDULER, help="With Slurm: how long a"
                      " node's jobs may take to end before the host is skipped (0: do not wait).")
]
ViaOpt = Annotated[
    str, typer.Option("--via", metavar="|".join(fan_outs()), rich_help_panel=SCHEDULER,
                      help="Fan out over SSH, or as one Slurm job step in which every node resets itself.")
]

JsonOpt = Annotated[
    bool, typer.Option("--json", help="One JSON document on stdout; humans read stderr.", rich_help_panel=OUTPUT)
]
VerboseOpt = Annotated[
    bool, typer.Option("-v", "--verbose", help="After the summary, a line per host saying what was done, however many"
                       " hosts (without it: for runs of up to a screenful of hosts).", rich_help_panel=OUTPUT)
]
QuietOpt = Annotated[
    bool, typer.Option("-q", "--quiet", help="No line per host after the summary: only the summary, folded by"
                       " outcome.", rich_help_panel=OUTPUT)
]
MetricsFileOpt = Annotated[
    Path | None,
    typer.Option("--metrics-file", metavar="PATH", rich_help_panel=OUTPUT, help="Write the run's Prometheus metrics"
                 " there (atomically), for node_exporter's textfile collector."),
]
LogDirOpt = Annotated[
    Path | None, typer.Option("--log-dir", metavar="DIR", help="Log folder (else $FLEET_LOG_DIR, else XDG state).",
                              rich_help_panel=OUTPUT)
]
KeepDaysOpt = Annotated[
    int | None, typer.Option("--keep-days", min=1, metavar="N", rich_help_panel=OUTPUT, help="After the run, remove"
                             " the history's records and the log folders of runs that started more than N days ago.")
]

# `fleet check`: read-only, so its own words for the options it shares with reset
CheckSchedulerOpt = Annotated[
    str | None,
    typer.Option("--scheduler", metavar="NAME", rich_help_panel=SCHEDULER, help="Report each node's state in the"
                 " named workload manager with its verdict (or `scheduler:` in the inventory); read-only: the nodes"
                 f" stay in service as they are. One of: {', '.join(names())}."),
]
CheckSlurmOpt = Annotated[
    bool, typer.Option("--slurm", help="Report each node's Slurm state with its verdict (or `scheduler: slurm` in the"
                       " inventory); read-only. Same as --scheduler slurm.", rich_help_panel=SCHEDULER)
]
CheckUniformOpt = Annotated[bool, typer.Option("--uniform", help=UNIFORM_HELP, rich_help_panel=RUN_CONTROL)]
CheckConcurrencyOpt = Annotated[
    int | None,
    typer.Option("-j", "-f", "--concurrency", min=1, metavar="N", rich_help_panel=RUN_CONTROL, help="At most N hosts"
                 " checked at once (default: every host at once; -f: pdsh's and clush's fan-out)."),
]


# `fleet runs`
def _count_from_limit(ctx: typer.Context, value: int | None) -> None:
    """`fleet runs --limit N`, the spelling before -n/--count: hidden from --help, still taken (-n/--count wins)."""
    if value is not None:
        say("fleet: warning: `runs --limit N` is now `runs -n/--count N`")
        ctx.default_map = {**(ctx.default_map or {}), "limit": value}


RunsCountOpt = Annotated[int, typer.Option("-n", "--count", min=1, metavar="N", help="At most N runs, newest first.")]
RunsLimitOpt = Annotated[
    int | None, typer.Option("--limit", min=1, metavar="N", hidden=True, is_eager=True, expose_value=False,
                             callback=_count_from_limit, help="The old spelling of -n/--count.")
]


EXIT_CODES = """\b
Exit status:
  0    every host clean (a dry run: every host planned)
  1    a host failed (not proven clean; --deadline fails the hosts it cut short)
  2    usage or inventory error: one line naming the file and key, nothing touched
  3    a host was skipped (jobs still running, --canary, --max-fail), none failed or unreachable
  4    a host was unreachable, none failed
  129  the terminal hung up (SIGHUP): as 130; run long resets under systemd-run or tmux
  130  interrupted (SIGINT/SIGTERM): in-flight commands ended, the report still written"""

RESET_EPILOG = f"""\b
Examples:
  # what would happen, per host
  fleet reset -i site.yaml -g blackwell --dry-run
  # one node first, then quarter-rack waves
  fleet reset -g rack-a -y --canary 1 --batch 25%
  # nightly: bounded in time and fan-out
  fleet reset -g blackwell -y --deadline 10m -j 32
  # drain in Slurm, wait for jobs, resume
  fleet reset --slurm --partition gpu -y
  # no inventory, no SSH: one srun step
  fleet reset -w gpu-c[01-64] --slurm --via srun -y

{EXIT_CODES}"""

# check's own: what a read-only run can end with (no dry run, no deadline, nothing skipped); the codes are
# EXIT_CODES' (tests/unit/test_cli_help.py holds them to it)
CHECK_EXIT_CODES = """\b
Exit status:
  0    every host clean
  1    a host failed: not proven clean
  2    usage or inventory error: one line naming the file and key, nothing touched
  4    a host was unreachable, none failed
  129  the terminal hung up (SIGHUP): as 130
  130  interrupted (SIGINT/SIGTERM): in-flight commands ended, the report still written"""

CHECK_EPILOG = f"""\b
Examples:
  # exit 0 when every host is clean
  fleet check -g blackwell
  # the names of the hosts that are not clean
  fleet check gpu-b[01-04] --json |
    jq -r '.hosts | to_entries[] | select(.value.status != "clean") | .key'

{CHECK_EXIT_CODES}"""


def via_scheduler(via: str) -> str | None:
    """The scheduler `--via` asks to run the reset itself (`srun`: Slurm), None for fleet's own fan-out (`ssh`);
    its words come from the scheduler registry (`fleet.model.plugs.fan_outs`)."""
    words = fan_outs()
    if via not in words:
        raise UsageError(f"--via takes {' or '.join(words)}, not {via!r}")
    return words[via] or None


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


# --- --help, plain: what a terminal, a pipe and a pager show alike ------------------------------------------------

HELP_COLUMN = 24  # the widest names column; wider names stand alone on their line, their help under it
TERM = re.compile(r"\s*\S+(?: \S+)*\s{2,}")  # an epilog line's first column: "  129  " of "  129  the terminal..."


class FleetCommand(TyperCommand):
    """A command whose --help is plain text, without typer's Python types (`HOST <list[str]>`) and number ranges
    (`[x>=1]`): metavars are the words the options declare, `[default: ...]` where there is one (never cut in
    two), one help column for the whole list, and the epilog's preformatted lines (examples, exit status) wrapped
    under their own second column rather than past the terminal's edge."""

    sectioned: ClassVar[bool] = False

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str, str]]] = {}
        for param in self.get_params(ctx):
            if not getattr(param, "hidden", False):
                title = (getattr(param, "rich_help_panel", None) if self.sectioned else None) or (
                    "Arguments" if param.param_type_name == "argument" else "Options")
                sections.setdefault(title, []).append(help_record(param))
        order = [*PANELS, "Arguments", "Options"]
        column = min(max(len(row[0]) for rows in sections.values() for row in rows), HELP_COLUMN)
        for title in sorted(sections, key=lambda t: order.index(t) if t in order else len(PANELS)):
            with formatter.section(title):
                for names_, text, extra in sections[title]:
                    definition(formatter, names_, text, extra, column)

    def format_epilog(self, ctx: Context, formatter: HelpFormatter) -> None:
        """Each block as the options' sections are: its heading flush left, its lines as written (`\\b` blocks)
        or rewrapped (prose)."""
        for block in inspect.cleandoc(self.epilog or "").split("\n\n") if self.epilog else ():
            formatter.write_paragraph()
            if not block.startswith("\b"):
                formatter.write_text(block)
                continue
            for line in block.splitlines()[1:]:
                for part in hanging(line, formatter.width - formatter.current_indent):
                    formatter.write(f"{'':>{formatter.current_indent}}{part}\n")


class SectionedCommand(FleetCommand):
    """FleetCommand with its options in sections by purpose: each under its `rich_help_panel` (Targeting, Run
    control, ...: PANELS' order), the ones without one (--help) under Options last."""

    sectioned = True


def help_record(param: Parameter) -> tuple[str, str, str]:
    """`-j, -f, --concurrency N`, its help, and `[default: ...]` (or nothing) for --help's list."""
    word = param.metavar or (param.name or "").upper()
    flag = isinstance(param, TyperOption) and (param.is_flag or param.count)
    if isinstance(param, TyperOption):
        name = " / ".join(", ".join(sorted(opts, key=lambda o: len(o) - len(o.lstrip("-"))))  # -j before --jobs
                          for opts in (param.opts, param.secondary_opts) if opts)
        name += "" if flag else f" {word}"
    else:
        name = f"{word}{'...' if param.nargs != 1 else ''}"
    extra = []
    default = param.default
    if getattr(param, "show_default", True) and not (flag or default is None or callable(default) or default == ()):
        extra.append(f"default: {getattr(default, 'value', default)}")
    if param.envvar:
        extra.append(f"env var: {param.envvar if isinstance(param.envvar, str) else ', '.join(param.envvar)}")
    if param.required:
        extra.append("required")
    return name, " ".join(str(getattr(param, "help", None) or "").split()), f"[{'; '.join(extra)}]" if extra else ""


def definition(formatter: HelpFormatter, name: str, text: str, extra: str, column: int) -> None:
    """One option: its names, its help wrapped in the help column (under the names when they are wider than
    `column`), `extra` whole after it or on a line of its own."""
    indent, at = formatter.current_indent, column + 2
    width = max(formatter.width - indent - at, 20)
    lines = textwrap.wrap(text, width, break_on_hyphens=False)
    if extra and lines and len(lines[-1]) + 2 + len(extra) <= width:
        lines[-1] += f"  {extra}"
    elif extra:
        lines.append(extra)
    if len(name) > column or not lines:
        lines.insert(0, "")
    formatter.write(f"{'':>{indent}}{name:<{at}}{lines[0]}".rstrip() + "\n")
    formatter.write("".join(f"{'':>{indent + at}}{line}\n" for line in lines[1:]))


def hanging(line: str, width: int) -> list[str]:
    """A preformatted line cut to `width`, the rest under its second column (`129  the terminal ...`), or four
    columns in where it has none."""
    if len(line) <= width:
        return [line]
    term = TERM.match(line)
    indent = len(term.group()) if term and len(term.group()) < width // 2 else len(line) - len(line.lstrip()) + 4
    return textwrap.wrap(line, width, subsequent_indent=" " * indent, break_long_words=False, break_on_hyphens=False)
