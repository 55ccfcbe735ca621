"""kill: SIGTERM every GPU holder that may be killed, SIGKILL what survives `kill_grace`, watch for respawns.

Asks the node: the holder scan (`fleet.reset.holders`, with units), the identity-checked signal
(`fleet.node.probes.procs.signal`: TERM, then KILL after `kill_grace`, each only to a process that still
has the pid, start time, executable and owner it had when judged; a pid that is someone else now counts
as gone and is never signalled) and the same check without a signal for who is still alive, the scan
again over RESPAWN_SCANS_S, and the Restart= setting of the units whose
processes came back. Decides (pure, below): who was killed by which signal, whether a holder after the
kill is a respawn (same unit or executable as a killed one) or new, and the one-line error. Never kills
what `fleet.reset.protection` protects. With `--stop-units`, the units of respawned holders (known, not
protected, not in `services`) are stopped the way drain stops services, and the kill runs once more.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fleet.inventory.host import Host
from fleet.model.report import (
    KeptProcess,
    KilledProcess,
    Reason,
    StepName,
    StepOutcome,
    StepResult,
    StepStatus,
    Verdict,
    line_of,
)
from fleet.node.bounds import commands_s
from fleet.node.budget import Room, TimeBudget
from fleet.node.node import Node
from fleet.node.poll import backoff, poll_until
from fleet.node.probes import procs, units
from fleet.reset.drain import UnitsStopped, longest_stop_s, stop_units
from fleet.reset.holders import Scan, scan
from fleet.reset.protection import Holder, Rules, job_of, units_to_stop

# Seconds to wait for SIGKILLed processes to vanish.
SIGKILL_WAIT_S = 5.0
# What signal.sh says of a target it did not signal because it was no longer the process judged, said so.
MISSED = {"gone": "gone before its signal", "changed": "another process has its pid now"}
# After the kill, holders are scanned again after each of these pauses (1 s in all): systemd's default
# RestartSec is 100 ms, so a Restart=always unit's process is usually back within the window.
RESPAWN_SCANS_S = (0.0, 0.3, 0.7)
# Commands a round may run past its waits: the scan and its description, the signals, the looks that end each
# wait, the respawn scans, the Restart= reads.
ROUND_COMMANDS = 8


def round_room(host: Host) -> Room:
    """One round of the kill: SIGTERM's grace, SIGKILL's wait, and its commands at their bound."""
    return Room(host.kill_grace + SIGKILL_WAIT_S, commands_s(host, other=ROUND_COMMANDS))


def longest_s(host: Host, *, stop_units: bool = False) -> float:
    """The longest the kill can take: one round; with `--stop-units`, a stop of the respawned holders' units
    (drain's wait and escalation) and a second round."""
    rounds = round_room(host).seconds
    if not stop_units:
        return rounds
    return 2 * rounds + longest_stop_s(host, host.drain_timeout)


@dataclass(frozen=True, kw_only=True)
class Signalled:
    """What a signal and the wait after it came to: who is still the judged process and alive, who the node refused
    to signal, who the signal was delivered to (`sent`: the identity check passed and `kill` exited 0), and who was
    not signalled because it was no longer the process judged (`missed`: pid -> `gone` or `changed`)."""

    survivors: frozenset[int]
    denied: frozenset[int] = frozenset()
    sent: frozenset[int] = frozenset()
    missed: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class KillRound:
    """One pass of the kill: what it killed and kept, what was back after it, and its verdict."""

    killed: tuple[KilledProcess, ...] = ()
    kept: tuple[Holder, ...] = ()
    missed: tuple[tuple[Holder, str], ...] = ()  # targets not signalled, with why (`gone`, `changed`)
    back: tuple[Holder, ...] = ()
    respawned: tuple[Holder, ...] = ()
    own_units: frozenset[str] = frozenset()
    error: str | None = None
    reason: Reason | None = None


async def kill(node: Node, *, stop_respawning: bool = False) -> StepOutcome:
    """SIGTERM every unprotected holder, wait kill_grace, SIGKILL the rest, scan again (see the module)."""
    started = time.monotonic()
    rounds = [await _kill_round(node)]
    names = _respawning_units(node, rounds[0]) if stop_respawning else ()
    shared = await _shared_units(node, names, rounds[0]) if names else {}
    names = tuple(n for n in names if n not in shared)
    stopped = await _stop_respawning(node, names) if names else None
    if stopped is not None:
        rounds.append(await _kill_round(node))
    return _kill_outcome(started, rounds, stopped, shared)


async def _kill_round(node: Node) -> KillRound:
    """Scan, SIGTERM, SIGKILL what is left, and watch for holders coming back."""
    host = node.host
    budget = round_room(host).start()
    found = await scan(node, StepName.KILL, budget, with_units=True)
    targets, kept = found.targets, found.kept
    for holder in kept:
        node.log.info("kept", step="kill", pid=holder.pid, name=holder.name, reason=holder.protected_by)
    if not targets:
        return KillRound(kept=kept, own_units=found.own_units)
    node.log.info("kill_targets", step="kill", pids=[h.pid for h in targets], kept=[h.pid for h in kept])
    term = await _signal_and_wait(node, "SIGTERM", targets, host.kill_grace, budget)
    left = [t for t in targets if t.pid in term.survivors]
    none_left = Signalled(survivors=frozenset())
    kill9 = await _signal_and_wait(node, "SIGKILL", left, SIGKILL_WAIT_S, budget) if left else none_left
    back = await _watch_for_respawn(node, budget, found)
    respawned, _ = split_back(back, targets)
    restart = await _restart_settings(node, {h.unit for h in respawned if h.unit}, budget)
    verdict = kill_verdict(kill9.survivors, targets, back, denied=kill9.denied | term.denied,
                           restart=restart, services=host.services)
    killed = killed_records(targets, term, kill9)
    missed = tuple((t, term.missed[t.pid]) for t in targets if t.pid in term.missed)
    for holder, why in missed:
        node.log.info("not_signalled", step="kill", pid=holder.pid, name=holder.name, why=why)
    reason, error = verdict if verdict else (None, None)
    return KillRound(killed=killed, kept=kept, missed=missed, back=tuple(back), respawned=tuple(respawned),
                     own_units=found.own_units, error=error, reason=reason)


async def _signal_and_wait(node: Node, signal: str, targets: Sequence[Holder], wait_s: float,
                           budget: TimeBudget) -> Signalled:
    """Send `signal` to each target that is still the process judged, then poll until they are gone or
    wait_s passes. Every look and every signal checks the process's identity on the node first."""
    known = [t for t in targets if t.identity() is not None]
    verdicts = await node.ask(procs.signal(signal, _identities(known)), step=StepName.KILL, budget=budget)
    denied = frozenset(p for p, v in verdicts.items() if v == "denied")
    sent = frozenset(p for p, v in verdicts.items() if v == "sent")
    missed = {p: v for p, v in verdicts.items() if v in MISSED}
    alive = [t for t in known if verdicts.get(t.pid) in ("sent", "denied")]
    window = TimeBudget(window=wait_s)

    async def look() -> list[Holder]:
        nonlocal alive
        alive = await _alive(node, alive, budget)
        return alive

    await poll_until(look, lambda seen: not seen, backoff(), within=window, first=alive)
    unknown = {t.pid for t in targets if t.identity() is None}  # never signalled: still there, as far as we know
    return Signalled(survivors=frozenset({t.pid for t in alive} | unknown), denied=denied, sent=sent, missed=missed)


async def _alive(node: Node, targets: Sequence[Holder], budget: TimeBudget) -> list[Holder]:
    """The targets still alive and still the processes judged (a zombie or a reused pid is gone)."""
    verdicts = await node.ask(procs.signal(procs.ALIVE, _identities(targets)), step=StepName.KILL, budget=budget)
    return [t for t in targets if verdicts.get(t.pid) == "alive"]


def _identities(targets: Sequence[Holder]) -> list[procs.Identity]:
    return [i for i in (t.identity() for t in targets) if i is not None]


async def _watch_for_respawn(node: Node, budget: TimeBudget, before: Scan) -> list[Holder]:
    """Scan again a few times over RESPAWN_SCANS_S: a Restart=always unit brings its process straight back.

    Holders judged before the kill (the protected ones) are not described again.
    """
    async def look() -> list[Holder]:
        return (await scan(node, StepName.KILL, budget, with_units=True, known=before)).targets

    none_yet: list[Holder] = []
    return (await poll_until(look, bool, RESPAWN_SCANS_S, first=none_yet)).last


async def _restart_settings(node: Node, names: Iterable[str], budget: TimeBudget) -> dict[str, str]:
    """unit -> its Restart= setting, for the units whose processes came back (unreadable: left out)."""
    settings = {}
    for unit in sorted(names):
        probe = units.unit_restart(unit)
        res = await node.run(probe, step=StepName.KILL, budget=budget)
        setting = probe.parse(res.stdout) if res.ok else None
        if setting is not None:
            settings[unit] = setting
    return settings


def _respawning_units(node: Node, first: KillRound) -> tuple[str, ...]:
    host = node.host
    return units_to_stop(first.respawned, first.kept, first.own_units, Rules.of(host), host.services)


async def _shared_units(node: Node, names: Sequence[str], first: KillRound) -> dict[str, frozenset[int]]:
    """The units among `names` that run a process besides the holders fleet may kill (those it killed, those that
    came back), with those pids: a shared service (cron, atd, slurmd, JupyterHub) whose other processes are other
    users' work is never stopped. A read that fails fails the step: not known is not "nothing else there"."""
    ours = {h.pid for h in first.respawned} | {k.pid for k in first.killed}
    shared = {}
    for unit in names:
        known = next(h.pid for h in first.respawned if h.unit == unit)
        members = await node.ask(units.unit_members(unit, simulated=node.host.simulated, known=known),
                                 step=StepName.KILL)
        others = members - ours
        if others:
            node.log.warning("unit_not_stopped", step="kill", unit=unit, others=sorted(others))
            shared[unit] = others
    return shared


async def _stop_respawning(node: Node, names: Sequence[str]) -> UnitsStopped:
    """Stop the units whose processes came back, as drain would (its window, its escalation)."""
    node.log.warning("stop_respawning_units", step="kill", units=list(names))
    return await stop_units(node, names, node.host.drain_timeout, StepName.KILL)


def _kill_outcome(started: float, rounds: Sequence[KillRound], stopped: UnitsStopped | None,
                  shared: Mapping[str, frozenset[int]] | None = None) -> StepOutcome:
    """Every round's kills, the last round's keeps and verdict, the units stopped between, and those not stopped
    because they run other processes too (`shared`)."""
    last = rounds[-1]
    killed = tuple(k for r in rounds for k in r.killed)
    detail = describe_kill(killed, last.kept, last.back, tuple(m for r in rounds for m in r.missed))
    if stopped is not None:
        detail += f"; stopped units of respawned holders: {stopped.detail}"
    reason, error = (Reason.DRAIN_FAILED, stopped.error) if stopped and stopped.error else (last.reason, last.error)
    if shared and error:
        error = f"{error}; {shared_line(shared)}"
    status = StepStatus.FAILED if error else StepStatus.OK
    kept = frozenset(h.pid for h in last.kept if h.part_of_the_machine)
    job_pids = frozenset(h.pid for h in last.kept if job_of(h) is not None)
    spared = frozenset(h.pid for r in rounds for h in r.kept)
    left_alive = tuple(KeptProcess(pid=h.pid, name=h.name, user=h.user, why=h.protected_by or "") for h in last.kept)
    return StepOutcome(result=StepResult.since(StepName.KILL, started, detail, status, error, reason), killed=killed,
                       kept=kept, job_pids=job_pids, spared=spared, left_alive=left_alive,
                       stopped=stopped.stopped if stopped is not None else ())


# --- what the kill decides and says (pure) -----------------------------------


def killed_records(targets: Sequence[Holder], term: Signalled, kill9: Signalled) -> tuple[KilledProcess, ...]:
    """The targets a signal of fleet's was delivered to and that are gone, each with the last signal it got. A pid
    that survived SIGKILL was not killed; nor was one that was gone or someone else when its signal was due (it
    was never signalled: `Signalled.missed`)."""
    records = []
    for h in targets:
        if h.pid in kill9.survivors:
            continue
        if h.pid in kill9.sent:
            signal = "SIGKILL"
        elif h.pid in term.sent:
            signal = "SIGTERM"
        else:
            continue
        records.append(KilledProcess(pid=h.pid, name=h.name, user=h.user, signal=signal))
    return tuple(records)


def shared_line(shared: Mapping[str, frozenset[int]]) -> str:
    """`not stopped: cron.service runs 2 other processes (pid 100, pid 200): add it to services if it is the
    workload's own`."""
    parts = []
    for unit, others in sorted(shared.items()):
        pids = sorted(others)
        shown = ", ".join(f"pid {p}" for p in pids[:3]) + (f" and {len(pids) - 3} more" if len(pids) > 3 else "")
        runs = f"{len(pids)} other process{'es' if len(pids) > 1 else ''}"
        parts.append(f"not stopped: {unit} runs {runs} ({shown}): add it to services if it is the workload's own")
    return "; ".join(parts)


def labels(holders: Iterable[Holder], limit: int = 4) -> str:
    """`pid 1 a, pid 2 b and 3 more`."""
    items = [h.label() for h in holders]
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def describe_kill(killed: Sequence[KilledProcess], kept: Sequence[Holder], back: Sequence[Holder],
                  missed: Sequence[tuple[Holder, str]] = ()) -> str:
    """What the kill did, every holder it left alive named with why (none elided), and the targets it did not
    signal because they were no longer the process judged."""
    parts = []
    if killed:
        by_signal = {s: sum(1 for k in killed if k.signal == s) for s in ("SIGTERM", "SIGKILL")}
        parts.append(f"killed {len(killed)} ({by_signal['SIGTERM']} on SIGTERM, {by_signal['SIGKILL']} on SIGKILL)")
    else:
        parts.append("no GPU holders to kill")
    if kept:
        parts.append("kept " + ", ".join(f"{h.label()} ({h.protected_by})" for h in kept))
    if missed:
        parts.append("not signalled " + ", ".join(f"{h.label()} ({MISSED[why]})" for h, why in missed))
    if back:
        parts.append("holding after kill: " + labels(back))
    return "; ".join(parts)


def kill_verdict(
    after_kill: frozenset[int],
    targets: Sequence[Holder],
    back: Sequence[Holder],
    *,
    denied: frozenset[int] = frozenset(),
    restart: Mapping[str, str] | None = None,
    services: Sequence[str] = (),
) -> Verdict | None:
    """Why, and in one line, the kill did not leave the GPUs free of unprotected holders; None when it did.

    `restart` maps a unit to its Restart= setting, for the respawn message.
    """
    survivors = [h for h in targets if h.pid in after_kill]
    refused = [h for h in survivors if h.pid in denied]
    unknown = [h for h in survivors if h.start is None]
    if refused:
        return Reason.KILL_FAILED, f"not permitted to kill {labels(refused)}: run as root or set become: true"
    if unknown:
        return (Reason.KILL_FAILED,
                f"not signalled, its start time could not be read (who it is is unknown): {labels(unknown)}")
    if survivors:
        return Reason.KILL_FAILED, f"survived SIGKILL: {labels(survivors)}"
    respawned, new = split_back(back, targets)
    if respawned:
        return Reason.RESPAWNED, respawn_error(respawned, restart or {}, services)
    if new:
        return Reason.HOLDERS_LEFT, f"new GPU holders after kill: {labels(new)}"
    return None


kill_error = line_of(kill_verdict)


def split_back(back: Sequence[Holder], targets: Sequence[Holder]) -> tuple[list[Holder], list[Holder]]:
    """Holders after the kill: (respawned, new).

    Respawned: in the same systemd unit as a killed one; or, for a holder in no unit, the same
    executable as a killed one that was in no unit either. The same executable alone is not enough
    (every python is /usr/bin/python3.11): `--stop-units` stops a respawned holder's unit, and must
    never stop an unrelated service.
    """
    target_pids = {h.pid for h in targets}
    unit_names = {h.unit for h in targets if h.unit}
    loose_exes = {h.exe for h in targets if h.exe and not h.unit}
    fresh = [h for h in back if h.pid not in target_pids]
    respawned = [h for h in fresh if ((h.unit in unit_names) if h.unit else (h.exe in loose_exes))]
    return respawned, [h for h in fresh if h not in respawned]


def respawn_error(respawned: Sequence[Holder], restart: Mapping[str, str], services: Sequence[str]) -> str:
    """`respawned: pid 4242 python3 (sglang.service, Restart=always); add it to services`."""
    shown = ", ".join(_respawned_label(h, restart) for h in respawned[:2])
    more = f" and {len(respawned) - 2} more" if len(respawned) > 2 else ""
    unit_names = {h.unit for h in respawned if h.unit}
    missing = unit_names - set(services)
    if missing:
        advice = "add it to services" if len(missing) == 1 else "add them to services"
    elif unit_names:
        advice = "it is in services, yet something starts it again"
    else:
        advice = "stop what restarts it"
    return f"respawned: {shown}{more}; {advice}"


def _respawned_label(holder: Holder, restart: Mapping[str, str]) -> str:
    if holder.unit is None:
        return f"{holder.label()} (no systemd unit)"
    setting = restart.get(holder.unit)
    return f"{holder.label()} ({holder.unit}, Restart={setting})" if setting else f"{holder.label()} ({holder.unit})"
