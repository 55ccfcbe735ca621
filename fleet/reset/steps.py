"""The four steps of a reset: drain -> kill -> settle -> verify.

Each step talks to one node through `Remote`, is bounded by its own budget,
and returns a `StepResult` plus what it learned. Decisions (what is clean,
what is protected, what the one-line error says) are pure functions in
`fleet.policy` and `fleet.protection`; `fleet.holders` scans who holds the
GPUs; the commands and parsers are in `fleet.probes`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio

from fleet.errors import CommandTimeout, StepFailed
from fleet.node import probes
from fleet.node.node import Budget, BudgetSpent, Remote
from fleet.report.models import GpuReport, HostPlan, KilledProcess, StepName, StepResult, StepStatus
from fleet.reset import policy, protection
from fleet.reset.holders import Scan, restart_settings, scan, scan_holders

# Backoff for polls: first wait, factor, cap (seconds).
POLL_FIRST_S = 0.1
POLL_FACTOR = 1.5
POLL_CAP_S = 1.0
# Seconds to wait for a unit to go down after `systemctl kill -s SIGKILL`.
ESCALATION_WINDOW_S = 10.0
# Seconds to wait for SIGKILLed processes to vanish.
SIGKILL_WAIT_S = 5.0
# After the kill, holders are scanned again at these intervals (1 s in all): systemd's default
# RestartSec is 100 ms, so a Restart=always unit's process is usually back within the window.
RESPAWN_SCANS_S = (0.0, 0.3, 0.7)
# `systemctl stop` exits 5 for a unit that is not loaded: nothing to stop, not an error.
STOP_OK_EXITS = (0, 5)
# Commands verify may run: two nvidia-smi queries and a holder scan (find, ps, exe, lineage, ...).
VERIFY_COMMANDS = 7
# A poll is not started with less than this left in the step's budget.
POLL_MARGIN_S = 0.05


@functools.cache
def backoff() -> tuple[float, ...]:
    """The poll waits: 0.1, 0.15, 0.225 ... capped at 1 s (computed once; a tuple is testable)."""
    waits: list[float] = []
    wait = POLL_FIRST_S
    while len(waits) < 200:
        waits.append(wait)
        wait = min(wait * POLL_FACTOR, POLL_CAP_S)
    return tuple(waits)


def _result(name: StepName, started: float, detail: str, status: StepStatus = StepStatus.OK,
            error: str | None = None) -> StepResult:
    return StepResult(name, status, round(time.monotonic() - started, 3), detail, error)


# ---------------------------------------------------------------- drain


async def _unit_states(remote: Remote, units: Sequence[str], budget: Budget,
                       step: StepName = StepName.DRAIN) -> dict[str, probes.UnitState]:
    states = {}
    for unit in units:
        res = await remote.run(probes.unit_state_argv(unit), step=step, budget=budget)
        if not res.ok:
            raise StepFailed(f"systemctl show {unit} exited {res.exit_status}: {policy.first_line(res.stderr)}")
        states[unit] = probes.parse_unit_state(res.stdout)
    return states


async def _wait_down(remote: Remote, units: Sequence[str], budget: Budget,
                     step: StepName) -> dict[str, probes.UnitState]:
    """Poll until every unit is inactive or failed, or the budget is spent; return the last states."""
    states = await _unit_states(remote, units, budget, step)
    for wait in backoff():
        up = [u for u in units if not states[u].is_down]
        if not up or budget.window_left <= POLL_MARGIN_S:
            break
        await anyio.sleep(min(wait, budget.window_left))
        states.update(await _unit_states(remote, up, budget, step))
    return states


@dataclass(frozen=True)
class UnitsStopped:
    """What stopping units came to: one line of detail, and an error when one is still up."""

    detail: str
    error: str | None = None


async def stop_units(remote: Remote, units: Sequence[str], window: float,
                     step: StepName = StepName.DRAIN) -> UnitsStopped:
    """Stop units gracefully, polling up to `window` s; SIGKILL only those whose stop hangs.

    drain stops `services` with it; kill (with `stop_units`) the units of holders that respawned.
    """
    budget = Budget(window, slack=remote.host.command_timeout)
    for unit in units:
        res = await remote.run(probes.unit_stop_argv(unit), step=step, budget=budget)
        if res.exit_status not in STOP_OK_EXITS:  # e.g. polkit: "Interactive authentication required."
            raise StepFailed(f"systemctl stop {unit} exited {res.exit_status}: {policy.first_line(res.stderr)}")
    states = await _wait_down(remote, units, budget, step)
    hung = [u for u in units if not states[u].is_down]
    if not hung:
        return UnitsStopped(policy.describe_units(states))
    remote.log.warning("drain_escalate", step=str(step), units=hung, after_s=round(budget.elapsed, 3))
    return await _escalate(remote, hung, states, window, step)


async def _escalate(remote: Remote, hung: Sequence[str], states: dict[str, probes.UnitState], window: float,
                    step: StepName) -> UnitsStopped:
    """`systemctl kill --signal=SIGKILL` the hung units, then poll them for ESCALATION_WINDOW_S."""
    escalation = Budget(ESCALATION_WINDOW_S, slack=remote.host.command_timeout)
    for unit in hung:
        await remote.run(probes.unit_kill_argv(unit), step=step, budget=escalation)
    states.update(await _wait_down(remote, hung, escalation, step))
    detail = f"{', '.join(hung)} did not stop within {window:g} s: SIGKILLed; " + policy.describe_units(states)
    still = [u for u in hung if not states[u].is_down]
    if still:
        return UnitsStopped(detail, f"{still[0]} still {states[still[0]].active_state} after SIGKILL")
    return UnitsStopped(detail)


async def drain(remote: Remote) -> StepResult:
    """Stop every unit in `services` gracefully; escalate to SIGKILL only when the stop hangs."""
    started, units = time.monotonic(), remote.host.services
    if not units:
        return _result(StepName.DRAIN, started, "no services to stop")
    stopped = await stop_units(remote, units, remote.host.drain_timeout)
    status = StepStatus.FAILED if stopped.error else StepStatus.OK
    return _result(StepName.DRAIN, started, stopped.detail, status, stopped.error)


# ---------------------------------------------------------------- kill


@dataclass
class KillOutcome:
    result: StepResult
    killed: tuple[KilledProcess, ...] = ()
    kept: tuple[policy.Holder, ...] = ()


async def _alive(remote: Remote, pids: Sequence[int], budget: Budget) -> frozenset[int]:
    res = await remote.run(probes.alive_argv(pids), step=StepName.KILL, budget=budget)
    return probes.parse_pids(res.stdout) & frozenset(pids)


@dataclass(frozen=True)
class Signalled:
    survivors: frozenset[int]
    denied: str | None = None  # the node refused to let us signal: its message


async def _signal_and_wait(remote: Remote, signal: str, pids: Sequence[int], wait_s: float,
                           budget: Budget) -> Signalled:
    """Send `signal` to pids, then poll until they are gone or wait_s passes."""
    res = await remote.run(probes.kill_argv(signal, pids), step=StepName.KILL, budget=budget)
    denied = policy.first_line(res.stderr) if "not permitted" in res.stderr else None
    deadline = time.monotonic() + wait_s
    alive = await _alive(remote, pids, budget)
    for wait in backoff():
        left = deadline - time.monotonic()
        if not alive or left <= POLL_MARGIN_S:
            break
        await anyio.sleep(min(wait, left))
        alive = await _alive(remote, sorted(alive), budget)
    return Signalled(alive, denied)


@dataclass(frozen=True)
class KillRound:
    """One pass of the kill: what it killed and kept, what was back after it, and its verdict."""

    killed: tuple[KilledProcess, ...] = ()
    kept: tuple[policy.Holder, ...] = ()
    back: tuple[policy.Holder, ...] = ()
    respawned: tuple[policy.Holder, ...] = ()
    own_units: frozenset[str] = frozenset()
    error: str | None = None


async def kill(remote: Remote, *, stop_units: bool = False) -> KillOutcome:
    """SIGTERM every unprotected holder, wait kill_grace, SIGKILL the rest, scan again.

    With `stop_units`, the units of holders that came back (known, not protected,
    not in `services`) are stopped the way drain stops services, and the kill
    runs once more.
    """
    started = time.monotonic()
    rounds = [await _kill_round(remote)]
    units = _respawning_units(remote, rounds[0]) if stop_units else ()
    stopped = await _stop_respawning(remote, units) if units else None
    if stopped is not None:
        rounds.append(await _kill_round(remote))
    return _kill_outcome(started, rounds, stopped)


async def _kill_round(remote: Remote) -> KillRound:
    """Scan, SIGTERM, SIGKILL what is left, and watch for holders coming back."""
    host = remote.host
    budget = Budget(host.kill_grace + SIGKILL_WAIT_S, slack=8 * host.command_timeout)
    found = await scan(remote, StepName.KILL, budget, units=True)
    targets, kept = found.targets, found.kept
    for holder in kept:
        remote.log.info("kept", step="kill", pid=holder.pid, name=holder.name, reason=holder.protected_by)
    if not targets:
        return KillRound(kept=kept, own_units=found.own_units)
    pids = [h.pid for h in targets]
    remote.log.info("kill_targets", step="kill", pids=pids, kept=[h.pid for h in kept])
    term = await _signal_and_wait(remote, "SIGTERM", pids, host.kill_grace, budget)
    kill9 = (
        await _signal_and_wait(remote, "SIGKILL", sorted(term.survivors), SIGKILL_WAIT_S, budget)
        if term.survivors else Signalled(frozenset())
    )
    back = await _watch_for_respawn(remote, budget, found)
    respawned, _ = policy.split_back(back, targets)
    restart = await restart_settings(remote, {h.unit for h in respawned if h.unit}, StepName.KILL, budget)
    error = policy.kill_error(kill9.survivors, targets, back, denied=kill9.denied or term.denied,
                              restart=restart, services=host.services)
    killed = policy.killed_records(targets, term.survivors, kill9.survivors)
    return KillRound(killed, kept, tuple(back), tuple(respawned), found.own_units, error)


async def _watch_for_respawn(remote: Remote, budget: Budget, before: Scan) -> list[policy.Holder]:
    """Scan again a few times over RESPAWN_SCANS_S: a Restart=always unit brings its process straight back.

    Holders judged before the kill (the protected ones) are not described again.
    """
    back: list[policy.Holder] = []
    for wait in RESPAWN_SCANS_S:
        await anyio.sleep(wait)
        back = (await scan(remote, StepName.KILL, budget, units=True, known=before)).targets
        if back:
            break
    return back


def _respawning_units(remote: Remote, first: KillRound) -> tuple[str, ...]:
    host = remote.host
    return protection.units_to_stop(first.respawned, first.kept, first.own_units, policy.Rules.of(host), host.services)


async def _stop_respawning(remote: Remote, units: Sequence[str]) -> UnitsStopped:
    """Stop the units whose processes came back, as drain would (its window, its escalation)."""
    remote.log.warning("stop_respawning_units", step="kill", units=list(units))
    return await stop_units(remote, units, remote.host.drain_timeout, StepName.KILL)


def _kill_outcome(started: float, rounds: Sequence[KillRound], stopped: UnitsStopped | None) -> KillOutcome:
    """Every round's kills, the last round's keeps and verdict, and the units stopped between."""
    last = rounds[-1]
    killed = tuple(k for r in rounds for k in r.killed)
    detail = policy.describe_kill(killed, last.kept, last.back)
    if stopped is not None:
        detail += f"; stopped units of respawned holders: {stopped.detail}"
    error = (stopped.error if stopped else None) or last.error
    status = StepStatus.FAILED if error else StepStatus.OK
    return KillOutcome(_result(StepName.KILL, started, detail, status, error), killed, last.kept)


# ---------------------------------------------------------------- settle / verify


@dataclass
class GpuOutcome:
    result: StepResult
    gpus: tuple[GpuReport, ...] = ()
    settle_s: dict[int, float] = field(default_factory=dict)


async def _smi(remote: Remote, argv: Sequence[str], step: StepName, budget: Budget) -> str:
    """Run one nvidia-smi query; a hang is not retried: the step fails and says why."""
    try:
        res = await remote.run(argv, step=step, budget=budget)
    except CommandTimeout as exc:
        raise StepFailed(
            f"nvidia-smi did not answer within {exc.deadline_s:g} s: driver may be wedged", StepStatus.TIMEOUT
        ) from exc
    if not res.ok:
        raise StepFailed(probes.classify_smi_failure(res.exit_status, res.stdout, res.stderr))
    return res.stdout


async def query_gpus(remote: Remote, fields: Sequence[str], step: StepName,
                     budget: Budget) -> tuple[probes.GpuRow, ...]:
    out = await _smi(remote, probes.gpu_query_argv(remote.host.nvidia_smi, fields), step, budget)
    try:
        return probes.parse_gpu_query(out, fields)
    except probes.ProbeParseError as exc:
        raise StepFailed(f"unreadable nvidia-smi output: {exc}") from exc


async def settle(remote: Remote) -> GpuOutcome:
    """Poll GPU memory with backoff until every GPU is under the threshold; no fixed sleep."""
    started, host = time.monotonic(), remote.host
    budget = Budget(host.settle_timeout, slack=host.command_timeout)
    settled: dict[int, float] = {}
    rows: tuple[probes.GpuRow, ...] = ()
    for wait in backoff():
        rows = await query_gpus(remote, probes.SETTLE_FIELDS, StepName.SETTLE, budget)
        policy.note_settled(rows, host.memory_threshold_mib, budget.elapsed, settled)
        if rows and len(settled) == len(rows):
            detail = f"{len(rows)} GPUs at or under {host.memory_threshold_mib} MiB after {budget.elapsed:.1f} s"
            return GpuOutcome(_result(StepName.SETTLE, started, detail), settle_s=settled)
        if budget.window_left <= POLL_MARGIN_S:
            break
        await anyio.sleep(min(wait, budget.window_left))
    msg = policy.unsettled_error(rows, host.memory_threshold_mib, host.settle_timeout)
    return GpuOutcome(_result(StepName.SETTLE, started, msg, StepStatus.TIMEOUT, msg), settle_s=settled)


async def query_apps(remote: Remote, step: StepName, budget: Budget) -> tuple[probes.ComputeApp, ...]:
    out = await _smi(remote, probes.compute_apps_argv(remote.host.nvidia_smi), step, budget)
    try:
        return probes.parse_compute_apps(out)
    except probes.ProbeParseError as exc:
        raise StepFailed(f"unreadable nvidia-smi output: {exc}") from exc


async def verify(remote: Remote, settle_s: dict[int, float] | None = None) -> GpuOutcome:
    """One GPU query, one compute-apps query and one holder scan; clean only if all three say so."""
    started, host = time.monotonic(), remote.host
    budget = Budget(0.0, slack=VERIFY_COMMANDS * host.command_timeout)
    rows = await query_gpus(remote, probes.VERIFY_FIELDS, StepName.VERIFY, budget)
    apps = await query_apps(remote, StepName.VERIFY, budget)
    holders = [h for h in await scan_holders(remote, StepName.VERIFY, budget) if h.protected_by is None]
    gpus = policy.gpu_reports(rows, settle_s or {})
    error = policy.verify_error(rows, apps, host.gpus, host.memory_threshold_mib, holders)
    detail = policy.describe_verify(rows, apps, holders)
    status = StepStatus.FAILED if error else StepStatus.OK
    return GpuOutcome(_result(StepName.VERIFY, started, detail, status, error), gpus)


async def survey(remote: Remote) -> HostPlan:
    """A dry run's look at the node: read-only commands only, nothing signalled, stopped or written."""
    host = remote.host
    budget = Budget(0.0, slack=(len(host.services) + VERIFY_COMMANDS) * host.command_timeout)
    units = await _unit_states(remote, host.services, budget) if host.services else {}
    holders = await scan_holders(remote, StepName.KILL, budget)
    rows = await query_gpus(remote, probes.VERIFY_FIELDS, StepName.VERIFY, budget)
    apps = await query_apps(remote, StepName.VERIFY, budget)
    return policy.build_plan(units, holders, apps, rows)


__all__ = [
    "BudgetSpent", "GpuOutcome", "KillOutcome", "Scan", "StepFailed", "UnitsStopped", "drain", "kill", "scan",
    "scan_holders", "settle", "stop_units", "verify",
]
