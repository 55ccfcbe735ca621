"""The rack compared, as a run reports it: the comparison of its hosts' GPU settings (`fleet.model.uniformity`:
the rack, its odd hosts out, and `--uniform`'s verdict) in the JSON report (`settings`) and the human summary's
one line. Pure: reports in, documents and lines out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fleet.inventory.nodesets import fold
from fleet.model.report import RunReport
from fleet.model.uniformity import Comparison, Rack, compare_groups, rack, why

__all__ = ["document", "settings_line"]


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
