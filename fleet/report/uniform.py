"""The rack compared, as a run reports it: the comparison of its hosts' GPU settings (`fleet.model.uniformity`)
in the JSON report (`settings`), the human summary's one line, the odd hosts report.html marks, and `--uniform`,
which fails them with reason `not_uniform`. Pure: reports in, reports and lines out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from fleet.inventory.nodesets import fold
from fleet.model.report import HostReport, HostStatus, Reason, RunReport
from fleet.model.uniformity import Comparison, compare, compare_groups, node_settings, odd_hosts, why

__all__ = ["Rack", "comparisons", "document", "fail_odd", "host_settings", "odd", "rack", "settings_line"]


def host_settings(host: HostReport | None) -> dict[str, str | None] | None:
    """A host's settings compared (`fleet.model.uniformity.node_settings` of its GPUs'); None where verify read no
    GPU's (it never ran, or a report of a fleet that did not read them): such a host takes no part."""
    if host is None or all(g.settings is None for g in host.gpus):
        return None
    return node_settings([g.settings for g in host.gpus], listed=len(host.gpus), fabric_manager=host.fabric_manager)


def _settings(hosts: Mapping[str, HostReport | None]) -> dict[str, Mapping[str, str | None]]:
    found = {name: host_settings(h) for name, h in hosts.items()}
    return {name: values for name, values in found.items() if values is not None}


@dataclass(frozen=True)
class Rack:
    """A run's hosts' settings (those verify read) and each property compared across them: made once a report
    (`rack`) for the JSON report, the summary's line and the page, which each show it."""

    read: Mapping[str, Mapping[str, str | None]]
    found: tuple[Comparison, ...]


def rack(hosts: Mapping[str, HostReport | None]) -> Rack:
    read = _settings(hosts)
    return Rack(read, compare(read))


def comparisons(hosts: Mapping[str, HostReport | None]) -> tuple[Comparison, ...]:
    """Each property compared across the hosts whose settings verify read; () for fewer than two."""
    return rack(hosts).found


def odd(hosts: Mapping[str, HostReport | None], compared: Rack | None = None) -> dict[str, list[str]]:
    """The odd hosts out, each with why (`driver 570.86.15 (15 others 575.57.08)`, one a property); `compared`:
    `rack(hosts)` when the caller has it."""
    return odd_hosts((compared or rack(hosts)).found)


def _property(c: Comparison) -> dict[str, Any]:
    return {"majority": c.majority, "alike": len(c.alike), "odd": dict(c.odd), "tie": c.tie,
            "unobserved": c.unobserved, "absent": len(c.absent)}


def _compared(found: Iterable[Comparison], hosts: int) -> dict[str, Any]:
    return {"hosts": hosts, "properties": {c.name: _property(c) for c in found}}


def document(report: RunReport, compared: Rack | None = None) -> dict[str, Any] | None:
    """The JSON report's `settings`: the run's comparison and each inventory group's; None when fewer than two
    hosts' settings were read (nothing compared). `compared`: `rack(report.hosts)` when the caller has it."""
    read, found = _read_and_found(report, compared)
    if not found:
        return None
    groups = compare_groups(read, report.groups)
    return {**_compared(found, len(read)),
            "groups": {g: _compared(c, sum(1 for h in report.groups[g] if h in read)) for g, c in groups.items()}}


def settings_line(report: RunReport, compared: Rack | None = None) -> str | None:
    """`settings: gpu-b07 driver 570.86.15 (15 others 575.57.08)`, odd hosts of one value folded; `settings: 16
    hosts alike` (and what no host said); None when nothing was compared. `compared` as `document`'s."""
    read, found = _read_and_found(report, compared)
    if not found:
        return None
    parts = []
    for c in found:
        by_value: dict[str | None, list[str]] = {}
        for host, value in c.odd.items():
            by_value.setdefault(value, []).append(host)
        parts += [f"{fold(hosts)} {why(c, value)}" for value, hosts in by_value.items()]
    unsaid = [c.label for c in found if c.unobserved]
    tail = f"; not said by any host: {', '.join(unsaid)}" if unsaid else ""
    return f"settings: {'; '.join(parts) if parts else f'{len(read)} hosts alike'}{tail}"


def _read_and_found(report: RunReport, compared: Rack | None) -> tuple[Mapping[str, Mapping[str, str | None]],
                                                                       tuple[Comparison, ...]]:
    made = compared or rack(report.hosts)
    return made.read, made.found


def fail_odd(report: RunReport) -> RunReport:
    """`--uniform`: every odd host out that ended clean fails, reason `not_uniform`, its error naming each property
    it differs by; a host that failed already keeps its own reason."""
    lines = odd(report.hosts)
    hosts = {name: _failed(host, lines[name]) if name in lines and host.status is HostStatus.CLEAN else host
             for name, host in report.hosts.items()}
    return replace(report, hosts=hosts)


def _failed(host: HostReport, why: list[str]) -> HostReport:
    return replace(host, status=HostStatus.FAILED, reason=Reason.NOT_UNIFORM,
                   error=f"not uniform with the run's other hosts: {'; '.join(why)}")
