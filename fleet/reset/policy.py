"""Pure decisions of a reset: who is protected, what was killed, what is clean, what to say.

No I/O here: every function takes parsed probe output and returns data or one line of text.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from fleet.node import probes
from fleet.report.models import GpuReport, HostPlan, KilledProcess, PlannedProcess
from fleet.reset.protection import Holder as Holder
from fleet.reset.protection import ProcessFacts as ProcessFacts
from fleet.reset.protection import Rules as Rules
from fleet.reset.protection import protected_by


def first_line(text: str, limit: int = 160) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:limit]
    return "(no output)"


def describe_holders(found: Iterable[probes.Holder], facts: ProcessFacts, rules: Rules) -> tuple[Holder, ...]:
    """Join the scan with what the probes told, and judge each holder; a pid ps no longer
    knows has exited and is dropped."""
    out = []
    for found_holder in found:
        holder = _describe(found_holder, facts)
        if holder is not None:
            out.append(replace(holder, protected_by=protected_by(holder, facts, rules)))
    return tuple(out)


def _describe(found: probes.Holder, facts: ProcessFacts) -> Holder | None:
    row = facts.ps.get(found.pid)
    if row is None:
        return None
    stat = facts.lineage.procs.get(found.pid)
    comm = stat.comm if stat is not None else row.argv0 or "?"
    exe = facts.exe.get(found.pid)
    name = probes.full_name(comm, row.argv0, exe)
    return Holder(
        pid=found.pid, user=row.user or found.user, name=name, exe=exe, devices=found.devices,
        unit=facts.units.get(found.pid), comm=comm if comm != name else None,
    )


def killed_records(
    targets: Sequence[Holder], after_term: frozenset[int], after_kill: frozenset[int]
) -> tuple[KilledProcess, ...]:
    """The last signal each target needed; a pid that survived SIGKILL was not killed."""
    records = []
    for h in targets:
        if h.pid in after_kill:
            continue
        signal = "SIGKILL" if h.pid in after_term else "SIGTERM"
        records.append(KilledProcess(pid=h.pid, name=h.name, user=h.user, signal=signal))
    return tuple(records)


def _labels(holders: Iterable[Holder], limit: int = 4) -> str:
    items = [h.label() for h in holders]
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def describe_kill(killed: Sequence[KilledProcess], kept: Sequence[Holder], back: Sequence[Holder]) -> str:
    """What the kill did, every holder it left alive named with why (none elided)."""
    parts = []
    if killed:
        by_signal = {s: sum(1 for k in killed if k.signal == s) for s in ("SIGTERM", "SIGKILL")}
        parts.append(f"killed {len(killed)} ({by_signal['SIGTERM']} on SIGTERM, {by_signal['SIGKILL']} on SIGKILL)")
    else:
        parts.append("no GPU holders to kill")
    if kept:
        parts.append("kept " + ", ".join(f"{h.label()} ({h.protected_by})" for h in kept))
    if back:
        parts.append("holding after kill: " + _labels(back))
    return "; ".join(parts)


def kill_error(
    after_kill: frozenset[int],
    targets: Sequence[Holder],
    back: Sequence[Holder],
    *,
    denied: str | None = None,
    restart: Mapping[str, str] | None = None,
    services: Sequence[str] = (),
) -> str | None:
    """One line when the kill did not leave the GPUs free of unprotected holders.

    `restart` maps a unit to its Restart= setting, for the respawn message.
    """
    survivors = [h for h in targets if h.pid in after_kill]
    if survivors and denied:
        return f"not permitted to kill {_labels(survivors)} ({denied}): run as root or set become: true"
    if survivors:
        return f"survived SIGKILL: {_labels(survivors)}"
    respawned, new = split_back(back, targets)
    if respawned:
        return respawn_error(respawned, restart or {}, services)
    if new:
        return f"new GPU holders after kill: {_labels(new)}"
    return None


def split_back(back: Sequence[Holder], targets: Sequence[Holder]) -> tuple[list[Holder], list[Holder]]:
    """Holders after the kill: (respawned, new). Respawned: same unit or same executable as a killed one."""
    target_pids = {h.pid for h in targets}
    units = {h.unit for h in targets if h.unit}
    exes = {h.exe for h in targets if h.exe}
    fresh = [h for h in back if h.pid not in target_pids]
    respawned = [h for h in fresh if (h.unit and h.unit in units) or (h.exe and h.exe in exes)]
    return respawned, [h for h in fresh if h not in respawned]


def respawn_error(respawned: Sequence[Holder], restart: Mapping[str, str], services: Sequence[str]) -> str:
    """`respawned: pid 4242 python3 (sglang.service, Restart=always); add it to services`."""
    shown = ", ".join(_respawned_label(h, restart) for h in respawned[:2])
    more = f" and {len(respawned) - 2} more" if len(respawned) > 2 else ""
    units = {h.unit for h in respawned if h.unit}
    missing = units - set(services)
    if missing:
        advice = "add it to services" if len(missing) == 1 else "add them to services"
    elif units:
        advice = "it is in services, yet something starts it again"
    else:
        advice = "stop what restarts it"
    return f"respawned: {shown}{more}; {advice}"


def _respawned_label(holder: Holder, restart: Mapping[str, str]) -> str:
    if holder.unit is None:
        return f"{holder.label()} (no systemd unit)"
    setting = restart.get(holder.unit)
    return f"{holder.label()} ({holder.unit}, Restart={setting})" if setting else f"{holder.label()} ({holder.unit})"


def describe_units(states: Mapping[str, probes.UnitState]) -> str:
    return ", ".join(f"{unit} {state.active_state}" for unit, state in states.items())


def note_settled(rows: Iterable[probes.GpuRow], threshold: int, elapsed: float, settled: dict[int, float]) -> None:
    """Record when each GPU first went (and stayed) at or under the threshold."""
    for row in rows:
        if row.memory_used_mib is not None and row.memory_used_mib <= threshold:
            settled.setdefault(row.index, round(elapsed, 3))
        else:
            settled.pop(row.index, None)


def _memory_problem(row: probes.GpuRow, threshold: int) -> str | None:
    if row.memory_used_mib is None:
        return f"gpu {row.index} memory.used is not a number ([N/A])"
    if row.memory_used_mib > threshold:
        return f"gpu {row.index} holds {row.memory_used_mib} MiB"
    return None


def unsettled_error(rows: Sequence[probes.GpuRow], threshold: int, timeout: float) -> str:
    if not rows:
        return "nvidia-smi listed no GPUs"
    problems = [p for p in (_memory_problem(r, threshold) for r in rows) if p]
    return f"{_first_of(problems)} after {timeout:g} s (threshold {threshold} MiB)"


def _first_of(problems: Sequence[str]) -> str:
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return problems[0] + more


def _app_label(app: probes.ComputeApp) -> str:
    return f"pid {app.pid} {os.path.basename(app.process_name) or app.process_name}"


def verify_problems(
    rows: Sequence[probes.GpuRow],
    apps: Sequence[probes.ComputeApp],
    expected: int | None,
    threshold: int,
    holders: Sequence[Holder] = (),
) -> list[str]:
    """Everything that keeps a node from being clean, most telling first."""
    problems = []
    if expected is not None and len(rows) != expected:
        problems.append(f"expected {expected} GPUs, nvidia-smi lists {len(rows)}")
    by_uuid = {r.uuid: r.index for r in rows if r.uuid}
    for row in rows:
        problem = _memory_problem(row, threshold)
        if problem:
            on_gpu = [a for a in apps if a.gpu_uuid == row.uuid]
            who = f" ({', '.join(_app_label(a) for a in on_gpu)})" if on_gpu else ""
            problems.append(problem + who)
    for app in apps:
        index = by_uuid.get(app.gpu_uuid) if app.gpu_uuid else None
        where = f"gpu {index}" if index is not None else "a GPU"
        problems.append(f"{_app_label(app)} still runs on {where}")
    named = {a.pid for a in apps}
    for holder in holders:
        if holder.pid not in named:
            problems.append(f"{holder.label()} still holds {', '.join(holder.devices)}")
    return problems


def verify_error(
    rows: Sequence[probes.GpuRow],
    apps: Sequence[probes.ComputeApp],
    expected: int | None,
    threshold: int,
    holders: Sequence[Holder] = (),
) -> str | None:
    problems = verify_problems(rows, apps, expected, threshold, holders)
    if not rows and not problems:
        problems.append("nvidia-smi listed no GPUs")
    return _first_of(problems) if problems else None


def describe_verify(
    rows: Sequence[probes.GpuRow], apps: Sequence[probes.ComputeApp], holders: Sequence[Holder] = ()
) -> str:
    used = [r.memory_used_mib for r in rows if r.memory_used_mib is not None]
    peak = f", max {max(used)} MiB used" if used else ""
    ecc = [r for r in rows if r.ecc_uncorrected]
    ecc_note = f", uncorrected ECC errors on gpu {', '.join(str(r.index) for r in ecc)}" if ecc else ""
    return f"{len(rows)} GPUs{peak}, {len(apps)} compute apps, {len(holders)} unprotected holders{ecc_note}"


def gpu_reports(rows: Sequence[probes.GpuRow], settle_s: Mapping[int, float]) -> tuple[GpuReport, ...]:
    return tuple(
        GpuReport(
            index=r.index, memory_used_mib=r.memory_used_mib, uuid=r.uuid, name=r.name,
            memory_total_mib=r.memory_total_mib, settle_s=settle_s.get(r.index),
        )
        for r in rows
    )


def build_plan(
    units: Mapping[str, probes.UnitState],
    holders: Sequence[Holder],
    apps: Sequence[probes.ComputeApp],
    rows: Sequence[probes.GpuRow],
) -> HostPlan:
    """Join a read-only survey into what a reset would do: stop, kill, keep."""
    mib: dict[int, int] = defaultdict(int)
    for app in apps:
        mib[app.pid] += app.used_mib or 0

    def planned(h: Holder) -> PlannedProcess:
        return PlannedProcess(h.pid, h.user, h.name, mib.get(h.pid), h.protected_by)

    return HostPlan(
        units=tuple((unit, state.active_state) for unit, state in units.items()),
        would_kill=tuple(planned(h) for h in holders if h.protected_by is None),
        kept=tuple(planned(h) for h in holders if h.protected_by is not None),
        gpu_memory_mib=tuple(r.memory_used_mib for r in rows),
    )
