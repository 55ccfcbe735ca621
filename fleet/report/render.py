"""The run report: its JSON document (each host's by `fleet.model.codec`), and the human summary for stderr."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from fleet import __version__
from fleet.inventory.nodesets import fold
from fleet.model.codec import host_to_document, json_writer
from fleet.model.report import HostStatus, RunReport
from fleet.report import uniform
from fleet.text import shown

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


def to_document(report: RunReport, rack: uniform.Rack | None = None) -> dict[str, Any]:
    """The CONTRACT's JSON report, for --json and summary.json alike; `rack`: `uniform.rack(report.hosts)` when the
    caller has it."""
    document = {
        "run_id": report.run_id,
        "fleet_version": __version__,
        "command": report.command,
        "started_at": report.started_at,
        "duration_s": report.duration_s,
        "summary": summary(report),
        "hosts": {name: host_to_document(h) for name, h in report.hosts.items()},
    }
    compared = uniform.document(report, rack)
    if compared is not None:  # two hosts' settings or more read: the rack compared
        document["settings"] = compared
    return document


def exit_code(report: RunReport, *, interrupted: bool = False, hung_up: bool = False) -> int:
    """0 all clean (or planned), 1 any other outcome; a run cut by a signal 130, by a hang-up (SIGHUP) 129."""
    if interrupted:
        return HUNG_UP if hung_up else INTERRUPTED
    ok = all(h.status in (HostStatus.CLEAN, HostStatus.PLANNED) for h in report.hosts.values())
    return 0 if ok else 1


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


def human_lines(report: RunReport, rack: uniform.Rack | None = None) -> list[str]:
    """Hosts with the same outcome folded into node-set notation: one line per status, reason and shape of error
    (`gpu-b[03,07,11] failed memory_held: gpu 0 holds 1523-4096 MiB after 60 s`), so 500 hosts stay readable.
    `rack` as `to_document`'s."""
    groups: dict[tuple[HostStatus, str, str], list[tuple[str, str]]] = defaultdict(list)
    for name, host in report.hosts.items():
        error = shown(host.error) if host.error else ""  # what a node said: one line, nothing in it acting
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
    lines.append(f"{report.command} of {total} host{'' if total == 1 else 's'} in {report.duration_s:.1f} s: {tally}")
    return lines


def plan_lines(report: RunReport) -> list[str]:
    """Dry run: per host, what a reset would do (the steps' details, which the survey filled in)."""
    lines = []
    for name, host in report.hosts.items():
        if host.plan is not None:
            scheduled = [host.scheduler.plan] if host.scheduler is not None and host.scheduler.plan else []
            lines.append(f"{name}: " + "; ".join(shown(d) for d in [*scheduled, *(s.detail for s in host.steps
                                                                                  if s.detail)]))
    return lines
