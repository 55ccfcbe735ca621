"""The run report: its JSON document (each host's by `fleet.model.codec`), and the human summary for stderr."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from fleet.inventory.nodesets import fold
from fleet.model import uniformity
from fleet.model.codec import host_to_document, json_writer
from fleet.model.report import HostReport, HostStatus, RunReport, StepName, StepStatus
from fleet.report import uniform
from fleet.reset.plan import would_keep
from fleet.text import terminal_safe
from fleet.version import __version__

# Exit statuses of a run, worst first: a script tells "a node is dirty" (1) from "a node is down" (4) without the JSON.
FAILED = 1  # a host ended failed (a run deadline fails the hosts it cut short)
UNREACHABLE = 4  # a host was unreachable, none failed (Ansible's code for it)
SKIPPED = 3  # a host was skipped (Slurm jobs, --canary, --max-fail, a deadline before it started), none worse
INTERRUPTED = 130  # SIGINT or SIGTERM cut the run
HUNG_UP = 129  # SIGHUP (128 + 1) cut it: the operator's terminal went away
SUMMARY_KEYS = (HostStatus.CLEAN, HostStatus.FAILED, HostStatus.UNREACHABLE, HostStatus.SKIPPED)


_JSON = json_writer()  # json.dumps, its C encoder made once


def render(document: dict[str, Any]) -> str:
    """The JSON text of a document: a top-level key a line, and a line for each entry of a dict-valued key
    (a host a line). Valid JSON, one `grep` per host, and built by json's C encoder: `indent=` falls back to
    the pure-Python encoder, which cost about 3 ms of CPU a host, twice (stdout and summary.json)."""
    parts = []
    for key, value in document.items():
        if isinstance(value, dict) and value:
            inner = ",\n".join(f"    {_JSON(k)}: {_JSON(v)}" for k, v in value.items())
            parts.append(f"  {_JSON(key)}: {{\n{inner}\n  }}")
        else:
            parts.append(f"  {_JSON(key)}: {_JSON(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def summary(report: RunReport) -> dict[str, int]:
    counts = {"total": len(report.hosts)}
    for status in SUMMARY_KEYS:
        counts[status.value] = report.count(status)
    planned = report.count(HostStatus.PLANNED)
    if planned:
        counts[HostStatus.PLANNED.value] = planned
    return counts


def to_document(report: RunReport, rack: uniformity.Rack | None = None) -> dict[str, Any]:
    """The CONTRACT's JSON report, for --json and summary.json alike; `rack`: `uniformity.rack(report.hosts)` when the
    caller has it."""
    document = {
        "run_id": report.run_id,
        "fleet_version": __version__,
        "command": report.command,
        "started_at": report.started_at,
        "duration_s": report.duration_s,
        **({"interrupted_by": report.interrupted_by} if report.interrupted_by else {}),
        "summary": summary(report),
        "hosts": {name: host_to_document(h) for name, h in report.hosts.items()},
    }
    compared = uniform.document(report, rack)
    if compared is not None:  # two hosts' settings or more read: the rack compared
        document["settings"] = compared
    return document


def exit_code(report: RunReport) -> int:
    """0 every host clean (or planned); else the worst outcome's: failed 1, unreachable 4, skipped 3. A run cut by a
    signal 130, by a hang-up (SIGHUP) 129."""
    if report.interrupted_by is not None:
        return HUNG_UP if report.interrupted_by == "SIGHUP" else INTERRUPTED
    seen = {h.status for h in report.hosts.values()}
    for status, code in ((HostStatus.FAILED, FAILED), (HostStatus.UNREACHABLE, UNREACHABLE),
                         (HostStatus.SKIPPED, SKIPPED)):
        if status in seen:
            return code
    return 0


# A number in an error (a clock time as one): where hosts' errors differ only in these, they fold into one line.
_NUMBER = re.compile(r"\d+(?::\d\d)+|\d+(?:\.\d+)?")
HOST_MARK = "<host>"


def error_shape(error: str, host: str) -> str:
    """The error with the host's own name and every number taken out: errors of one shape fold together."""
    return _NUMBER.sub("#", error.replace(host, HOST_MARK))


def fold_errors(errors: list[tuple[str, str]]) -> str:
    """(host, error) pairs of one shape -> one error, each number that differs shown as its range (`1523-4096`),
    a host's own name as <host> when the hosts differ."""
    texts = [e.replace(h, HOST_MARK) if len(errors) > 1 else e for h, e in errors]
    first = texts[0]
    columns = list(zip(*(_NUMBER.findall(t) for t in texts), strict=True))
    pieces = _NUMBER.split(first)
    out = [pieces[0]]
    for values, piece in zip(columns, pieces[1:], strict=True):
        out.append(_range(values) + piece)
    return "".join(out)


def _range(values: tuple[str, ...]) -> str:
    if len(set(values)) == 1:
        return values[0]
    key = (lambda v: v) if ":" in values[0] else float
    return f"{min(values, key=key)}-{max(values, key=key)}"


def human_lines(report: RunReport, rack: uniformity.Rack | None = None) -> list[str]:
    """Hosts with the same outcome folded into node-set notation: one line per status, reason and shape of error
    (`gpu-b[03,07,11] failed memory_held: gpu 0 holds 1523-4096 MiB after 60 s`), so 500 hosts stay readable.
    `rack` as `to_document`'s."""
    groups: dict[tuple[HostStatus, str, str], list[tuple[str, str]]] = defaultdict(list)
    for name, host in report.hosts.items():
        error = terminal_safe(host.error) if host.error else ""  # what a node said: one line, nothing in it acting
        shape = error_shape(error, name) if error else ""
        groups[(host.status, host.reason.value if host.reason else "", shape)].append((name, error))
    order = list(HostStatus)
    lines = []
    for (status, reason, _), members in sorted(groups.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1:])):
        error = fold_errors(members) if members[0][1] else ""
        code = f" {reason}" if reason else ""
        suffix = f": {error}" if error else ""
        lines.append(f"{fold([n for n, _ in members])} {status.value}{code}{suffix}")
    counts = summary(report)
    tally = ", ".join(f"{v} {k}" for k, v in counts.items() if k != "total" and v)
    settings = uniform.settings_line(report, rack)
    if settings is not None:
        lines.append(settings)
    total = counts["total"]
    cut = f", interrupted by {report.interrupted_by}" if report.interrupted_by else ""
    lines.append(f"{report.command} of {total} host{'' if total == 1 else 's'} in {report.duration_s:.1f} s{cut}:"
                 f" {tally}")
    return lines


# Runs of up to this many hosts get a line per host after the summary (`-v`: any run; `-q`: none).
SCREENFUL = 20
# Processes named in a host's line, each list; the rest counted (every one is in the report).
NAMED = 4
# The GPU a restored setting's line names (`gpu 3: nvidia-smi -i 3 -pl 700 (...)`).
_GPU = re.compile(r"gpu (\d+):")
# A process's name cut to this many characters in a line (a title its user chose can be long).
NAME_CHARS = 32


def per_host_wanted(report: RunReport, asked: bool | None) -> bool:
    """Whether the run's hosts each get a line after the summary of what was done to them: never for a check (it
    does nothing) or a dry run (its plan says it); as asked (`-v` True, `-q` False), else for a reset of up to a
    screenful of hosts."""
    if report.command != "reset" or all(h.plan is not None for h in report.hosts.values()):
        return False
    return asked if asked is not None else len(report.hosts) <= SCREENFUL


def done_lines(report: RunReport) -> list[str]:
    """A line per host saying what was done to it, from its report: the units stopped, the processes killed
    (name:pid, the signal it took) and kept (why), how long settle took, the settings restored, the node's state in
    its scheduler after. `demo-b01 clean in 4.8 s: stopped sglang.service; killed python3:30196 (SIGTERM); ...`"""
    return [_done(name, host) for name, host in report.hosts.items() if host.plan is None]


def _done(name: str, host: HostReport) -> str:
    steps = {s.name: s for s in host.steps}
    parts = [f"stopped {', '.join(host.stopped)}"] if host.stopped else []
    kill = steps.get(StepName.KILL)
    if host.killed:
        parts.append("killed " + _listed([f"{_cut(k.name)}:{k.pid} ({k.signal})" for k in host.killed]))
    elif kill is not None and kill.status is StepStatus.OK:
        parts.append("killed nothing")
    if host.kept:
        parts.append("kept " + _listed([f"{_cut(k.name)}:{k.pid} ({k.why.removesuffix(' ' + k.name)})"
                                        for k in host.kept]))
    settle = steps.get(StepName.SETTLE)
    if settle is not None and settle.status is StepStatus.OK:
        parts.append(f"settled in {settle.duration_s:.1f} s")
    if host.restored:
        count, gpus = len(host.restored), sorted({m[1] for m in map(_GPU.match, host.restored) if m}, key=int)
        on = f" on gpu {', '.join(gpus)}" if gpus else ""
        parts.append(f"restored {count} setting{'' if count == 1 else 's'}{on}")
    parts += [f"{s.name.value} {s.status.value}" for s in host.steps
              if s.status in (StepStatus.FAILED, StepStatus.TIMEOUT, StepStatus.INTERRUPTED)]
    if host.scheduler is not None and host.scheduler.state_after:
        parts.append(f"{host.scheduler.by} {host.scheduler.state_after}")
    took = f" in {host.duration_s:.1f} s" if host.duration_s else ""
    return terminal_safe(f"{name} {host.status.value}{took}: {'; '.join(parts) or 'nothing done'}")


def _listed(items: list[str]) -> str:
    named = ", ".join(items[:NAMED])
    return named if len(items) <= NAMED else f"{named} and {len(items) - NAMED} more"


def _cut(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[:NAME_CHARS - 1] + "…"


def plan_lines(report: RunReport) -> list[str]:
    """Dry run: per host, what a reset would do, a step a line (the steps' details, which the survey filled in;
    the scheduler's plan first)."""
    lines = []
    width = max(len(s.value) for s in StepName)
    for name, host in report.hosts.items():
        if host.plan is None:
            continue
        lines.append(f"{name} (dry run):")
        if host.scheduler is not None and host.scheduler.plan:
            lines.append(f"  {host.scheduler.by:<{width}}  {terminal_safe(host.scheduler.plan)}")
        for step in host.steps:
            detail = step.detail
            keep = would_keep(host.plan) if step.name is StepName.KILL else ""
            if keep and detail.endswith(f"; {keep}"):  # the holders kept on a line of their own
                detail = detail.removesuffix(f"; {keep}")
            lines += [f"  {step.name.value:<{width}}  {terminal_safe(detail)}"] if detail else []
            lines += [f"  {'':<{width}}  {terminal_safe(keep)}"] if keep else []
    return lines
