"""report.html's words for a host, worked out once for the page's every part (`fleet.report.html_report`): its
name as HTML, its status and the status's class, and its bars on the timeline (`segments`).

Escaping: every string from a report is escaped (`esc`) once, where the page takes it in; what fleet itself writes
(a number, a status or step name: a StrEnum, whose str and format are its value; seconds formatted here) holds no
markup and is written as is.
`esc` maps character by character, so the escape of a concatenation is the concatenation of the escapes. The words
of hosts' reports repeat (every GPU's `persistence mode off`, every host's `sglang.service inactive`): a page
escapes each distinct one once (`Escaped`)."""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass

from fleet.model.report import HostReport, StepStatus

STATUS_ORDER = ("clean", "failed", "unreachable", "skipped", "planned")
STEPS = ("drain", "kill", "settle", "verify")
NOT_ON_RECORD = "not on record"  # the status of a target a page built from the history has no outcome of

Host = HostReport | None  # a host on the page; None: a target not on record
Hosts = Mapping[str, Host]
Bar = tuple[str, float, float, str]  # (class, start, length, words as HTML)
_IDLE = (StepStatus.SKIPPED,)
_BAD = (StepStatus.FAILED, StepStatus.TIMEOUT, StepStatus.INTERRUPTED)


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


class Escaped(dict[str, str]):
    """One page's strings as HTML, each distinct one escaped once (`esc` depends on the string alone): `e[text]`."""

    def __missing__(self, text: str) -> str:
        self[text] = escaped = esc(text)
        return escaped


def secs(value: object) -> str:
    return f"{value:.1f} s" if isinstance(value, int | float) else "-"


def status_of(host: Host) -> str:
    return str(host.status) if host is not None else NOT_ON_RECORD  # a StrEnum's str: its value


def status_class(status: str) -> str:
    return f"s-{status}" if status in STATUS_ORDER else "s-other"


def segments(host: Host) -> list[Bar]:
    """(class, start, length, words) in seconds from the host's start: the time before drain (connect, lock,
    baselines: the host's duration less its steps'), then each step that ran, end to end."""
    if host is None:
        return []
    steps = [s for s in host.steps if s.status not in _IDLE and s.duration_s]
    at = max(host.duration_s - sum(s.duration_s for s in steps), 0.0)
    out = [("pre", 0.0, at, f"before drain {at:.2f} s")] if at > 0 else []
    for step in steps:
        name, length = str(step.name), step.duration_s
        kind = "bad" if step.status in _BAD else name if name in STEPS else "other"
        out.append((kind, at, length, f"{name} {step.status} {length:.2f} s"))
        at += length
    return out


@dataclass(frozen=True, kw_only=True)
class Row:
    """A host as each part of the page shows it: `name` as HTML, its status and class, its bars (`segments`)."""

    name: str
    host: Host
    status: str
    css: str
    bars: list[Bar]


def rows(hosts: Hosts) -> dict[str, Row]:
    """Each host's `Row`, by its name (as the report has it)."""
    out = {}
    for name, host in hosts.items():
        status = status_of(host)
        out[name] = Row(name=esc(name), host=host, status=status, css=status_class(status), bars=segments(host))
    return out
